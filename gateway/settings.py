"""The gateway's settings: one frozen object, built once at start-up.

Every default lives in the field declarations below, nowhere else. Values come, in order of precedence, from
explicit overrides (CLI flags), then `SESSIONGATE_`-prefixed environment variables, then these defaults.
Nothing reads the environment at import time: `GatewaySettings.from_env()` is called by the entry point.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_DATABASE_URL", "GatewaySettings", "SettingsError"]

ENV_PREFIX = "SESSIONGATE_"
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.sessiongate/sessiongate.db"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Base URLs of the SGLang workers, e.g. ("http://127.0.0.1:30001", "http://127.0.0.1:30002").
    workers: tuple[str, ...] = ()
    database_url: str = DEFAULT_DATABASE_URL
    # Run the store's migrations at start-up (the embedded default); replicas sharing PostgreSQL run
    # `sessiongate db upgrade` once instead.
    auto_migrate: bool = True
    # Serve callers without a key, as the "default" tenant: for local use only (`sessiongate up` sets it and says
    # so at start-up). Off by default: every request needs a tenant key (or `api_key`).
    allow_unauthenticated: bool = False
    # Optional single static client key, for the "default" tenant; tenant keys live in the store (`sessiongate
    # keys create`, `POST /v1/admin/keys`).
    api_key: str = ""
    # How long a replica trusts its memory of a key lookup: a key revoked through another replica stops working
    # here within this time (at once on the replica that revoked it).
    key_cache_ttl_s: float = 5.0
    # Per-tenant limits, enforced by each gateway replica on its own (0 = no limit): requests in flight, and
    # tokens (prompt + completion, as the workers report them) per minute.
    tenant_max_concurrent: int = 0
    tenant_tokens_per_minute: int = 0
    # The secret from which each tenant's KV cache salt is derived (HMAC); replicas must share it. Empty: a random
    # secret per process (said at start-up), so caches are not shared across replicas or restarts.
    cache_salt_secret: str = ""
    # This replica's stable name, recorded on the turns it serves; after a crash the restarted replica fails the
    # turns its dead run left pending at once. Unique per replica; empty means "<hostname>:<port>".
    instance_id: str = ""
    # The admin API's key, separate from client keys; empty disables the admin API.
    admin_key: str = ""
    max_body_bytes: int = 4 * 1024 * 1024
    # Input bounds, each refused with a 4xx in the OpenAI error format: messages in one chat request, the largest
    # max_tokens / max_completion_tokens a client may ask for, and the total size of a request's headers.
    max_messages: int = 2048
    max_output_tokens: int = 32768
    max_header_bytes: int = 16 * 1024
    upstream_connect_timeout_s: float = 3.0
    # Longest silence allowed from a worker: before the first byte, or between two streamed chunks.
    upstream_read_timeout_s: float = 300.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    # Consecutive failed health checks before a worker leaves the pool.
    unhealthy_after: int = 2
    log_level: str = "info"
    log_json: bool = True
    # Log message contents (prompts, answers). Off by default: they are user data.
    log_content: bool = False
    # Routing (gateway/routing): round_robin, least_loaded, sticky, cache_aware or kv_aware.
    routing_policy: str = "kv_aware"
    # kv_aware keeps an advisory reservation while the reserved worker scores within this of the best.
    reservation_margin_s: float = 0.25
    # The cost model (gateway/routing/cost.py): prefill work of a typical request ahead in the queue, the
    # prefill and decode rates assumed for a worker that reports none, KV size per token, transfer rates into
    # the device.
    typical_prefill_tokens: int = 512
    default_prefill_tokens_per_s: float = 4000.0
    default_decode_tokens_per_s: float = 1000.0
    kv_bytes_per_token: int = 131_072
    host_to_device_bytes_per_s: float = 16e9
    pool_to_device_bytes_per_s: float = 2e9
    # How often each worker's load report is read (100-500 ms is the useful range).
    load_poll_interval_s: float = 0.25
    # Ageing of the KV belief: device entries older than this are believed demoted to host; host ones, gone.
    kv_device_ttl_s: float = 120.0
    kv_host_ttl_s: float = 1800.0
    # Advisories (gateway/advisor): shared secret of the typing webhook (empty disables the webhook).
    webhook_secret: str = ""
    # How long an advisory (and its reservation) stays valid when no request comes.
    advisory_ttl_s: float = 30.0
    # After typing "stopped", the advisory is kept this long (the message may be on its way), then cancelled.
    advisory_stop_grace_s: float = 3.0
    # Fire the tool-result advisory when the "last" pending call of the turn returns, or at the "first".
    advisory_tool_result_trigger: str = "last"
    # A tool-call advisory is fired this long before the tool is expected to end (recorded durations).
    advisory_lead_s: float = 1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> GatewaySettings:
        """Build settings from `SESSIONGATE_*` variables, then apply non-None `overrides`."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.name.upper()
            if name in env:
                values[f.name] = _parse(name, env[name], f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls(**values)
        except TypeError as exc:
            raise SettingsError(str(exc)) from exc
        settings.validate()
        return settings

    def validate(self) -> None:
        for url in self.workers:
            if not url.startswith(("http://", "https://")):
                raise SettingsError(f"{ENV_PREFIX}WORKERS: {url!r} is not an http(s) URL")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"{ENV_PREFIX}MAX_BODY_BYTES must be at least 1024")
        if self.max_messages < 1 or self.max_output_tokens < 1 or self.max_header_bytes < 1024:
            raise SettingsError(
                f"{ENV_PREFIX}MAX_MESSAGES and MAX_OUTPUT_TOKENS must be >= 1, MAX_HEADER_BYTES >= 1024"
            )
        if self.tenant_max_concurrent < 0 or self.tenant_tokens_per_minute < 0:
            raise SettingsError(f"{ENV_PREFIX}TENANT_MAX_CONCURRENT and TENANT_TOKENS_PER_MINUTE must be >= 0")
        if self.unhealthy_after < 1:
            raise SettingsError(f"{ENV_PREFIX}UNHEALTHY_AFTER must be at least 1")
        if self.routing_policy not in _POLICIES:
            raise SettingsError(f"{ENV_PREFIX}ROUTING_POLICY must be one of {', '.join(_POLICIES)}")
        if not 0.01 <= self.load_poll_interval_s <= 60:
            raise SettingsError(f"{ENV_PREFIX}LOAD_POLL_INTERVAL_S must be between 0.01 and 60")
        if self.advisory_tool_result_trigger not in ("first", "last"):
            raise SettingsError(f"{ENV_PREFIX}ADVISORY_TOOL_RESULT_TRIGGER must be 'first' or 'last'")


# The names gateway.routing.make_policy knows (kept here so settings import nothing of the gateway).
_POLICIES = ("round_robin", "least_loaded", "sticky", "cache_aware", "kv_aware")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(name: str, raw: str, annotation: object) -> object:
    kind = str(annotation)
    try:
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(raw)
            return lowered in _TRUE
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("tuple"):
            return tuple(part.strip().rstrip("/") for part in raw.split(",") if part.strip())
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a valid {kind}") from exc
    return raw

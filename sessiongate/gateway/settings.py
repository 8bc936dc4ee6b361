"""The gateway's settings: one frozen object, built once at start-up.

Every default lives in the field declarations below, nowhere else, except those of the routing cost model and
policies: they are the pure objects' own (`gateway.routing`), which the cluster simulator builds without settings,
and are read from there so the two cannot drift apart. Values come, in order of precedence, from
explicit overrides (CLI flags), then `SESSIONGATE_`-prefixed environment variables, then these defaults.
Nothing reads the environment at import time: `GatewaySettings.from_env()` is called by the entry point; the
constructor takes only what it is given (keywords) and the defaults.

One mechanism (pydantic-settings, as `sglang_ext.worker_config.WorkerConfig`): every way of building settings (the
constructor, `from_env`, `replace`) validates the same fields the same way, and a bad value is one `SettingsError`
that names its variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from .routing import DEFAULT_RESERVATION_MARGIN_S, POLICY_NAMES, CostModel

__all__ = ["DEFAULT_DATABASE_URL", "GatewaySettings", "SettingsError"]

_COST = CostModel()

ENV_PREFIX = "SESSIONGATE_"
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.sessiongate/sessiongate.db"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", enable_decoding=False, validate_default=True
    )

    host: str = "127.0.0.1"
    port: int = 8000
    # How long the gateway keeps an idle client connection open. It must exceed the idle expiry of every client
    # pool in front of it (httpx and the OpenAI SDKs: 5 s, aiohttp: 15 s, load balancers: often 60 s): when the
    # server closes first, a request the client sends on the closing connection is reset (`ReadError`), and a
    # POST is not retried. uvicorn's default (5 s) equals httpx's, which made exactly that race.
    keep_alive_timeout_s: int = 75
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
    # tokens (prompt + completion, as the workers report them) per minute. These are the global values; the
    # admin may override them per tenant (stored with the tenant, reloaded every `key_cache_ttl_s`).
    tenant_max_concurrent: int = 0
    tenant_tokens_per_minute: int = 0
    # Fair admission (gateway/admission.py): chat turns in their active phase at once, per configured worker, the
    # others queued by least attained service (0: no limit, nothing queued or shed); the predicted queue wait past
    # which a new turn is refused at once, 429 or 503 with Retry-After (0: never); the attained service's half-life.
    admission_max_active_per_worker: int = 128
    admission_max_wait_s: float = 2.0
    admission_half_life_s: float = 30.0
    # The highest session priority a tenant may set through the sessions API (-1000 to 1000). Each turn carries
    # its session's priority to the worker, where it ranks the turn's KV in the cache (with priority eviction):
    # without a bound one tenant could rank its KV above every other tenant's. The admin API is not bounded.
    tenant_max_priority: int = 10
    # How long an `Idempotency-Key` is remembered (a retry after that runs anew), and how often expired keys are
    # deleted. The retention must outlast `upstream_read_timeout_s`, or a key could vanish under a running turn.
    idempotency_retention_s: float = 86_400.0
    idempotency_sweep_interval_s: float = 300.0
    # The secret from which each tenant's KV cache salt is derived (HMAC); replicas must share it. Empty: a random
    # secret per process (said at start-up), so caches are not shared across replicas or restarts.
    cache_salt_secret: str = ""
    # This replica's stable name, recorded on the turns it serves; after a crash the restarted replica fails the
    # turns its dead run left pending at once. Unique per replica; empty means "<hostname>:<port>".
    instance_id: str = ""
    # The instance id is leased in the store and renewed every third of this: a gateway refuses to start while
    # another live process holds its id; a crashed holder's lease is taken over after this (at once on its host).
    instance_lease_s: float = 10.0
    # The admin API's key, separate from client keys; empty disables the admin API.
    admin_key: str = ""
    # The workers' key (SGLang's `--api-key`, `sessiongate worker --api-key`): sent as a bearer token on every call
    # to a worker. Workers still belong on a private network: the key is sent in the clear over plain HTTP.
    worker_api_key: str = ""
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
    # Routing (sessiongate/gateway/routing): round_robin, least_loaded, sticky, cache_aware or kv_aware.
    routing_policy: str = "kv_aware"
    # kv_aware keeps an advisory reservation while the reserved worker scores within this of the best.
    reservation_margin_s: float = DEFAULT_RESERVATION_MARGIN_S
    # The cost model (sessiongate/gateway/routing/cost.py): prefill work of a typical request ahead in the queue, the
    # prefill and decode rates assumed for a worker that reports none, KV size per token, transfer rates into
    # the device and the fixed cost of one move from host or pool.
    typical_prefill_tokens: int = _COST.typical_prefill_tokens
    default_prefill_tokens_per_s: float = _COST.default_prefill_tokens_per_s
    default_decode_tokens_per_s: float = _COST.default_decode_tokens_per_s
    kv_bytes_per_token: int = _COST.kv_bytes_per_token
    host_to_device_bytes_per_s: float = _COST.host_to_device_bytes_per_s
    pool_to_device_bytes_per_s: float = _COST.pool_to_device_bytes_per_s
    host_to_device_latency_s: float = _COST.host_to_device_latency_s
    pool_to_device_latency_s: float = _COST.pool_to_device_latency_s
    # How often each worker's load report is read (100-500 ms is the useful range).
    load_poll_interval_s: float = 0.25
    # How often the advisor fires scheduled advisories and settles expired ones: the timing error of a prefetch.
    advisor_tick_s: float = 0.05
    # Ageing of the KV belief: device entries older than this are believed demoted to host; host ones, gone.
    kv_device_ttl_s: float = 120.0
    kv_host_ttl_s: float = 1800.0
    # Advisories (sessiongate/gateway/advisor): shared secret of the typing webhook (empty disables the webhook).
    webhook_secret: str = ""
    # How long an advisory (and its reservation) stays valid when no request comes.
    advisory_ttl_s: float = 30.0
    # After typing "stopped", the advisory is kept this long (the message may be on its way), then cancelled.
    advisory_stop_grace_s: float = 3.0
    # Fire the tool-result advisory when the "last" pending call of the turn returns, or at the "first".
    advisory_tool_result_trigger: str = "last"
    # A tool-call advisory is fired this long before the tool is expected to end (recorded durations).
    advisory_lead_s: float = 1.0
    # The tool-call KV lifecycle (advisor/toolkv.py): when off, a turn that ends in tool calls makes no advisory
    # (the KV is left to the workers' eviction, as without sessiongate); posted tool results still signal.
    advisory_tool_kv: bool = True
    # Replicas (gateway/shared): the Redis that several `sessiongate serve` processes share, so that they behave as
    # one gateway (advisories claimed on any replica, KV belief, token buckets, webhook replay cache, hint quality).
    # Empty: each process keeps that state in its own memory (one replica). Keys go under `redis_prefix`; a Redis
    # call slower than `redis_timeout_s` counts as failed, and a failure makes the replica decide on its own.
    redis_url: str = ""
    redis_prefix: str = "sessiongate:"
    redis_timeout_s: float = 0.5

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(_describe(exc)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # the environment only through `from_env`, never behind a constructor's back

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> GatewaySettings:
        """Build settings from `SESSIONGATE_*` variables, then apply non-None `overrides`."""
        values = _MappingEnvSource(cls, os.environ if environ is None else environ)()
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> GatewaySettings:
        """A copy with `changes`, validated like any other settings (what `dataclasses.replace` was)."""
        return type(self)(**{**self.model_dump(), **changes})

    @field_validator("workers", mode="before")
    @classmethod
    def _split_workers(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment's "http://a:1/, http://b:2"
            value = value.split(",")
        if isinstance(value, list | tuple):
            return tuple(str(url).strip().rstrip("/") for url in value if str(url).strip())
        return value

    @model_validator(mode="before")
    @classmethod
    def _blank_is_false(cls, data: Any) -> Any:
        # An empty boolean variable (`SESSIONGATE_LOG_JSON=`) has always meant false.
        if isinstance(data, dict):
            return {k: False if v == "" and _is_bool(cls, k) else v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _validated(self) -> GatewaySettings:
        self._check()
        return self

    def _check(self) -> None:
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
        if self.idempotency_retention_s < self.upstream_read_timeout_s or self.idempotency_sweep_interval_s <= 0:
            raise SettingsError(
                f"{ENV_PREFIX}IDEMPOTENCY_RETENTION_S must be at least UPSTREAM_READ_TIMEOUT_S, "
                "IDEMPOTENCY_SWEEP_INTERVAL_S positive"
            )
        if self.admission_max_active_per_worker < 0 or self.admission_max_wait_s < 0 or self.admission_half_life_s <= 0:
            raise SettingsError(
                f"{ENV_PREFIX}ADMISSION_MAX_ACTIVE_PER_WORKER and ADMISSION_MAX_WAIT_S must be >= 0, "
                "ADMISSION_HALF_LIFE_S positive"
            )
        if not -1000 <= self.tenant_max_priority <= 1000:
            raise SettingsError(f"{ENV_PREFIX}TENANT_MAX_PRIORITY must be from -1000 to 1000")
        if self.instance_lease_s <= 0:
            raise SettingsError(f"{ENV_PREFIX}INSTANCE_LEASE_S must be positive")
        if self.keep_alive_timeout_s < 1:
            raise SettingsError(f"{ENV_PREFIX}KEEP_ALIVE_TIMEOUT_S must be at least 1")
        if self.unhealthy_after < 1:
            raise SettingsError(f"{ENV_PREFIX}UNHEALTHY_AFTER must be at least 1")
        if self.routing_policy not in POLICY_NAMES:
            raise SettingsError(f"{ENV_PREFIX}ROUTING_POLICY must be one of {', '.join(POLICY_NAMES)}")
        if not 0.01 <= self.load_poll_interval_s <= 60:
            raise SettingsError(f"{ENV_PREFIX}LOAD_POLL_INTERVAL_S must be between 0.01 and 60")
        if not 0.005 <= self.advisor_tick_s <= 60:
            raise SettingsError(f"{ENV_PREFIX}ADVISOR_TICK_S must be between 0.005 and 60")
        if self.advisory_tool_result_trigger not in ("first", "last"):
            raise SettingsError(f"{ENV_PREFIX}ADVISORY_TOOL_RESULT_TRIGGER must be 'first' or 'last'")
        rates = (
            self.default_prefill_tokens_per_s,
            self.default_decode_tokens_per_s,
            self.host_to_device_bytes_per_s,
            self.pool_to_device_bytes_per_s,
        )
        if min(rates) <= 0 or self.kv_bytes_per_token < 1 or self.typical_prefill_tokens < 0:
            raise SettingsError(
                f"{ENV_PREFIX}DEFAULT_PREFILL_TOKENS_PER_S, DEFAULT_DECODE_TOKENS_PER_S, HOST_TO_DEVICE_BYTES_PER_S, "
                "POOL_TO_DEVICE_BYTES_PER_S and KV_BYTES_PER_TOKEN must be positive, TYPICAL_PREFILL_TOKENS >= 0"
            )
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError(f"{ENV_PREFIX}REDIS_URL must be a redis://, rediss:// or unix:// URL")
        if self.redis_timeout_s <= 0 or not self.redis_prefix:
            raise SettingsError(f"{ENV_PREFIX}REDIS_TIMEOUT_S must be positive, REDIS_PREFIX not empty")
        if self.host_to_device_latency_s < 0 or self.pool_to_device_latency_s < 0:
            raise SettingsError(f"{ENV_PREFIX}HOST_TO_DEVICE_LATENCY_S and POOL_TO_DEVICE_LATENCY_S must be >= 0")


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, over a given mapping instead of `os.environ`."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._environ.items()}


def _is_bool(cls: type[BaseSettings], name: str) -> bool:
    field = cls.model_fields.get(name)
    return field is not None and field.annotation is bool


def _describe(exc: ValidationError) -> str:
    """One line per bad value, each naming its environment variable (also the keyword, in lower case)."""
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        if not error["loc"]:  # a check across fields: its message names the variables
            problems.append(message)
        elif error["type"] == "extra_forbidden":
            problems.append(f"unknown setting {error['loc'][0]!r}")
        else:
            problems.append(f"{ENV_PREFIX}{str(error['loc'][0]).upper()}={error['input']!r}: {message}")
    return "; ".join(problems)

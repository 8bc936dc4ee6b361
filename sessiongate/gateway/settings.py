"""The gateway's settings: one frozen object, built once at start-up.

Every default lives in the field declarations below, nowhere else, except those of the routing cost model and
policies: they are the pure objects' own (`gateway.routing`), which the cluster simulator builds without settings,
and are read from there so the two cannot drift apart. Values come, in order of precedence, from
explicit overrides (CLI flags), then `SESSIONGATE_`-prefixed environment variables, then these defaults.
Nothing reads the environment at import time: `GatewaySettings.from_env()` is called by the entry point; the
constructor takes only what it is given (keywords) and the defaults.

One idiom (`sessiongate.settings_base.EnvSettings`, as `sglang_ext.worker_config.WorkerConfig`): ranges are field
constraints, the documentation is each field's docstring (docs/configuration.md is generated from them), and every
way of building settings (the constructor, `from_env`, `replace`) validates the same fields the same way; a bad value
is one `SettingsError` that names its variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sessiongate.sessions.database import POSTGRES_POOL_SIZE
from sessiongate.settings_base import EnvSettings

from .routing import DEFAULT_RESERVATION_MARGIN_S, POLICY_NAMES, CostModel

__all__ = ["DEFAULT_DATABASE_URL", "GatewaySettings", "SettingsError"]

_COST = CostModel()

ENV_PREFIX = "SESSIONGATE_"
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.sessiongate/sessiongate.db"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the variable."""


class GatewaySettings(EnvSettings):
    """The gateway's settings: each field is `SESSIONGATE_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    error_type = SettingsError

    # For mypy, EnvSettings' constructor (values as text too), not the one it would synthesize from the fields.
    if TYPE_CHECKING:

        def __init__(self, _labels: Mapping[str, str] | None = None, **values: Any) -> None: ...

    host: str = "127.0.0.1"
    """The address `sessiongate serve` listens on."""
    port: int = 8000
    """The port `sessiongate serve` listens on."""
    keep_alive_timeout_s: int = Field(75, ge=1)
    """How long the gateway keeps an idle client connection open. It must exceed the idle expiry of every client pool
    in front of it (httpx and the OpenAI SDKs: 5 s, aiohttp: 15 s, load balancers: often 60 s): when the server
    closes first, a request the client sends on the closing connection is reset (`ReadError`), and a POST is not
    retried. uvicorn's default (5 s) equals httpx's, which made exactly that race."""
    workers: tuple[str, ...] = ()
    """Base URLs of the SGLang workers, comma-separated in the environment, e.g.
    `http://127.0.0.1:30001,http://127.0.0.1:30002`."""
    database_url: str = DEFAULT_DATABASE_URL
    """The store: `sqlite+aiosqlite:///...` or `postgresql+asyncpg://...`."""
    database_pool_size: int = Field(POSTGRES_POOL_SIZE, ge=1)
    """Connections to PostgreSQL this replica keeps open (no more are opened: a store call past them waits for one).
    Size the server's `max_connections` for every replica's. SQLite ignores it."""
    auto_migrate: bool = True
    """Run the store's migrations at start-up (the embedded default); replicas sharing PostgreSQL run `sessiongate db
    upgrade` once instead."""
    allow_unauthenticated: bool = False
    """Serve callers without a key, as the "default" tenant: for local use only (`sessiongate up` sets it and says so
    at start-up). Off by default: every request needs a tenant key (or `api_key`)."""
    api_key: str = ""
    """Optional single static client key, for the "default" tenant; tenant keys live in the store (`sessiongate keys
    create`, `POST /v1/admin/keys`)."""
    key_cache_ttl_s: float = 5.0
    """How long a replica trusts its memory of a key lookup: a key revoked through another replica stops working here
    within this time (at once on the replica that revoked it)."""
    tenant_max_concurrent: int = Field(0, ge=0)
    """Per-tenant limit on requests in flight, enforced by each gateway replica on its own (0 = no limit). A global
    value; the admin may override it per tenant (stored with the tenant, reloaded every `key_cache_ttl_s`)."""
    tenant_tokens_per_minute: int = Field(0, ge=0)
    """Per-tenant limit on tokens (prompt + completion, as the workers report them) per minute (0 = no limit). A
    global value; the admin may override it per tenant."""
    tenant_max_priority: int = Field(10, ge=-1000, le=1000)
    """The highest session priority a tenant may set through the sessions API (-1000 to 1000). Each turn carries its
    session's priority to the worker, where it ranks the turn's KV in the cache (with priority eviction): without a
    bound one tenant could rank its KV above every other tenant's. The admin API is not bounded."""
    admission_max_active_per_worker: int = Field(128, ge=0)
    """Fair admission (gateway/turn/admission.py): chat turns in their active phase at once, per configured worker;
    the others wait, ordered by least attained service per session within tenant weights (0: no limit, nothing
    queued or shed)."""
    admission_max_wait_s: float = Field(2.0, ge=0)
    """The predicted queue wait past which a new turn is refused at once, 429 or 503 with `Retry-After` (0: never)."""
    admission_loop_lag_target_ms: float = Field(20.0, ge=0)
    """The event loop's lag (how late a 20 ms timer fires) the fair queue keeps under by lowering its active limit
    below `admission_max_active_per_worker` while the loop lags (gateway/turn/loop_lag.py): at saturation, turns
    wait in the queue or are shed at once instead of queueing in the loop (0: a fixed limit)."""
    admission_half_life_s: float = Field(30.0, gt=0)
    """The half-life of a session's attained service (tokens served) in the fair queue's order."""
    idempotency_retention_s: float = 86_400.0
    """How long an `Idempotency-Key` is remembered (a retry after that runs anew). It must outlast
    `upstream_read_timeout_s`, or a key could vanish under a running turn."""
    idempotency_sweep_interval_s: float = Field(300.0, gt=0)
    """How often expired idempotency keys are deleted."""
    cache_salt_secret: str = ""
    """The secret from which each tenant's KV cache salt is derived (HMAC); replicas must share it. Empty: a random
    secret per process (said at start-up), so caches are not shared across replicas or restarts."""
    instance_id: str = ""
    """This replica's stable name, recorded on the turns it serves; after a crash the restarted replica fails the
    turns its dead run left pending at once. Unique per replica; empty means `<hostname>:<port>`, or
    `<hostname>:<host>:<port>` when bound to one address other than loopback (replicas that share a host name, in
    containers or network namespaces, differ by address)."""
    instance_lease_s: float = Field(10.0, gt=0)
    """The instance id is leased in the store and renewed every third of this: a gateway refuses to start while
    another live process holds its id; a crashed holder's lease is taken over after this (at once on its host), and
    so are the pending `Idempotency-Key`s it held, by the clients' retries on any replica."""
    admin_key: str = ""
    """The admin API's key, separate from client keys; empty disables the admin API."""
    worker_api_key: str = ""
    """The workers' key (SGLang's `--api-key`, `sessiongate worker --api-key`): sent as a bearer token on every call
    to a worker. Workers still belong on a private network: the key is sent in the clear over plain HTTP."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """The largest request body accepted (413 beyond)."""
    max_messages: int = Field(2048, ge=1)
    """Messages in one chat request (more: a 4xx in the OpenAI error format, as for each input bound)."""
    max_output_tokens: int = Field(32768, ge=1)
    """The largest max_tokens / max_completion_tokens a client may ask for."""
    max_header_bytes: int = Field(16 * 1024, ge=1024)
    """The total size of a request's headers (431 beyond)."""
    upstream_connect_timeout_s: float = 3.0
    """How long connecting to a worker may take."""
    upstream_read_timeout_s: float = 300.0
    """Longest silence allowed from a worker: before the first byte, or between two streamed chunks."""
    health_interval_s: float = 2.0
    """How often each worker's health is checked."""
    health_timeout_s: float = 2.0
    """How long a health check may take."""
    unhealthy_after: int = Field(2, ge=1)
    """Consecutive failed health checks before a worker leaves the pool."""
    log_level: str = "info"
    """The log level: debug, info, warning or error."""
    log_json: bool = True
    """Log JSON lines (else readable text); an empty value means false."""
    log_content: bool = False
    """Log message contents (prompts, answers). Off by default: they are user data."""
    routing_policy: str = "kv_aware"
    """Routing (sessiongate/gateway/routing): round_robin, least_loaded, sticky, cache_aware, kv_aware or
    dynamo_cost."""
    reservation_margin_s: float = DEFAULT_RESERVATION_MARGIN_S
    """kv_aware keeps an advisory reservation while the reserved worker scores within this of the best."""
    typical_prefill_tokens: int = Field(_COST.typical_prefill_tokens, ge=0)
    """The cost model (sessiongate/gateway/routing/cost.py): prefill work of a typical request ahead in the queue."""
    default_prefill_tokens_per_s: float = Field(_COST.default_prefill_tokens_per_s, gt=0)
    """The cost model: the prefill rate assumed for a worker that reports none."""
    default_decode_tokens_per_s: float = Field(_COST.default_decode_tokens_per_s, gt=0)
    """The cost model: the decode rate assumed for a worker that reports none."""
    kv_bytes_per_token: int = Field(_COST.kv_bytes_per_token, ge=1)
    """The cost model: KV size per token."""
    host_to_device_bytes_per_s: float = Field(_COST.host_to_device_bytes_per_s, gt=0)
    """The cost model: transfer rate from the host tier into the device."""
    pool_to_device_bytes_per_s: float = Field(_COST.pool_to_device_bytes_per_s, gt=0)
    """The cost model: transfer rate from the shared pool into the device."""
    host_to_device_latency_s: float = Field(_COST.host_to_device_latency_s, ge=0)
    """The cost model: the fixed cost of one move from the host tier."""
    pool_to_device_latency_s: float = Field(_COST.pool_to_device_latency_s, ge=0)
    """The cost model: the fixed cost of one move from the pool."""
    load_poll_interval_s: float = Field(0.25, ge=0.01, le=60)
    """How often each worker's load report is read (100-500 ms is the useful range)."""
    advisor_tick_s: float = Field(0.05, ge=0.005, le=60)
    """How often the advisor fires scheduled advisories and settles expired ones: the timing error of a prefetch."""
    kv_device_ttl_s: float = 120.0
    """Ageing of the KV belief where a worker's capacities are unknown (no load report): device entries older than
    this are believed demoted to host. With capacities the belief follows the worker's LRU tiers instead."""
    kv_host_ttl_s: float = 1800.0
    """Ageing of the KV belief where a worker's capacities are unknown: host entries older than this are believed
    gone. Also how long a session's belief is kept in the replicas' shared state."""
    webhook_secret: str = ""
    """Advisories (sessiongate/gateway/advisor): shared secret of the typing webhook (empty disables the webhook)."""
    advisory_ttl_s: float = 30.0
    """How long an advisory (and its reservation) stays valid when no request comes."""
    advisory_stop_grace_s: float = 3.0
    """After typing "stopped", the advisory is kept this long (the message may be on its way), then cancelled."""
    advisory_tool_result_trigger: Literal["first", "last"] = "last"
    """Fire the tool-result advisory when the "last" pending call of the turn returns, or at the "first"."""
    advisory_lead_s: float = 1.0
    """A tool-call advisory is fired this long before the tool is expected to end (recorded durations)."""
    advisory_typing_timed: bool = False
    """Fire a typing hint's prefetch `advisory_lead_s` before the turn usually comes (learnt per tenant from when
    its turns followed their first typing signal, advisor/typing_gaps.py), not at once: fewer hints then hold memory
    at the same time, and the worker is chosen closer to the turn. Off, or until a tenant has 3 such gaps: at once."""
    advisory_typing_quantile: float = Field(0.25, ge=0.0, le=1.0)
    """The share of a tenant's typing-to-turn gaps shorter than the one a typing hint expects (low: most turns come
    later than the prefetch is timed for)."""
    advisory_tool_kv: bool = True
    """The tool-call KV lifecycle (advisor/toolkv.py): when off, a turn that ends in tool calls makes no advisory
    (the KV is left to the workers' eviction, as without sessiongate); posted tool results still signal."""
    redis_url: str = ""
    """Replicas (gateway/shared): the Redis that several `sessiongate serve` processes share, so that they behave as
    one gateway (advisories claimed on any replica, KV belief, token buckets, webhook replay cache, hint quality).
    Empty: each process keeps that state in its own memory (one replica). A redis://, rediss:// or unix:// URL."""
    redis_prefix: str = Field("sessiongate:", min_length=1)
    """The prefix of the gateway's keys in Redis."""
    redis_timeout_s: float = Field(0.5, gt=0)
    """A Redis call slower than this counts as failed, and a failure makes the replica decide on its own."""

    @field_validator("workers", mode="before")
    @classmethod
    def _split_workers(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment's "http://a:1/, http://b:2"
            value = value.split(",")
        if isinstance(value, list | tuple):
            return tuple(str(url).strip().rstrip("/") for url in value if str(url).strip())
        return value

    @field_validator("workers")
    @classmethod
    def _http_workers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return value

    @field_validator("routing_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICY_NAMES:
            raise ValueError(f"must be one of {', '.join(POLICY_NAMES)}")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        if value and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @model_validator(mode="before")
    @classmethod
    def _blank_is_false(cls, data: Any) -> Any:
        # An empty boolean variable (`SESSIONGATE_LOG_JSON=`) has always meant false.
        if isinstance(data, dict):
            return {k: False if v == "" and _is_bool(cls, k) else v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _retention_outlasts_a_turn(self) -> GatewaySettings:
        if self.idempotency_retention_s < self.upstream_read_timeout_s:
            raise ValueError(f"{ENV_PREFIX}IDEMPOTENCY_RETENTION_S must be at least UPSTREAM_READ_TIMEOUT_S")
        return self


def _is_bool(cls: type[GatewaySettings], name: str) -> bool:
    field = cls.model_fields.get(name)
    return field is not None and field.annotation is bool

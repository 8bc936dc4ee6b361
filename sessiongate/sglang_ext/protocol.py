"""Wire formats of the sessiongate extension's HTTP endpoints on a worker.

The gateway imports this module (and nothing else of `sglang_ext`), so it imports nothing of
SGLang or torch: pydantic models and path constants only. Every endpoint lives under
`API_PREFIX`; the worker side (`sglang_ext.plugin`) and the gateway both read the paths from here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "API_PREFIX",
    "EXTENSION_NAME",
    "INFO_PATH",
    "KEEP_HEADER",
    "LOAD_PATH",
    "MAX_EXPECTED_IN_MS",
    "NO_KEEP_RID_PREFIX",
    "PREFETCH_PATH",
    "SESSIONS_PATH",
    "ErrorDetail",
    "ErrorResponse",
    "KVOpResult",
    "LoadReport",
    "PoolCallKind",
    "PoolCalls",
    "PrefetchAccepted",
    "PrefetchRequest",
    "PrefetchState",
    "PrefetchStatus",
    "SessionKVRequest",
    "WorkerInfo",
]

EXTENSION_NAME = "sessiongate"
API_PREFIX = "/sessiongate/v1"
INFO_PATH = f"{API_PREFIX}/info"
LOAD_PATH = f"{API_PREFIX}/load"
# POST starts one; GET/DELETE `{PREFETCH_PATH}/{prefetch_id}` read its status / cancel it.
PREFETCH_PATH = f"{API_PREFIX}/prefetch"
# POST `{SESSIONS_PATH}/{session_id}/retain` and `.../drop`: the application decides the fate of its KV.
SESSIONS_PATH = f"{API_PREFIX}/sessions"
# A chat request whose KV must not outlive its turn (a one-off with secrets): the gateway sends it when the
# client says `X-Sessiongate-Keep: false`, by giving the request an SGLang `rid` with this prefix. The
# worker then never writes the request's own pages to the pool and drops them from device and host as
# soon as the request has finished; a prefix it shares with cached contexts stays.
KEEP_HEADER = "X-Sessiongate-Keep"
NO_KEEP_RID_PREFIX = "sessiongate-nokeep-"

_WIRE = ConfigDict(frozen=True, extra="forbid")


class ErrorDetail(BaseModel):
    model_config = _WIRE

    message: str
    type: str
    """`invalid_request_error` (4xx: the caller's mistake) or `server_error` (5xx)."""
    code: str
    """Machine-readable: `invalid_body`, `wrong_model`, `context_too_long`, `not_found`, `conflict`, ..."""


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx answer of the extension's endpoints (the OpenAI error format)."""

    model_config = _WIRE

    error: ErrorDetail


class WorkerInfo(BaseModel):
    """`GET /sessiongate/v1/info`: what the extension and the engine it runs in are."""

    # protected_namespaces=(): the fields named model_* are facts, not pydantic API.
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    extension: str = EXTENSION_NAME
    version: str
    """The sessiongate version the worker runs."""
    sglang_version: str
    cpu_compat: bool
    """True when the worker runs on CPU with sessiongate's compatibility layer."""
    model_path: str
    served_model_name: str
    page_size: int
    hierarchical_cache: bool
    storage_backend: str | None = None
    """The shared KV pool (HiCache's L3 backend) as configured: sessiongate's `file` (verified pages, the
    default), `file-unchecked` or `mooncake`, else SGLang's backend name; None without one."""


PoolCallKind = Literal["read", "write", "lookup"]


class PoolCalls(BaseModel):
    """One kind of call a worker makes to its shared pool (HiCache's L3 backend), timed around each batch call on
    HiCache's threads (`sglang_ext.pool_timing`): `read` (pages into host memory, a prefetch's or a request's),
    `write` (a write-through), `lookup` (how many of a prefix's pages the pool holds)."""

    model_config = _WIRE

    calls: int = 0
    pages: int = 0
    seconds: float = 0.0
    """Since the worker started: batch calls, the pages they named, and the seconds they took. Cumulative, so that
    the change in `seconds` over the change in `calls` between two reports is the mean call in between."""
    recent_ms: float | None = None
    """Mean milliseconds per call over the last ~5 s; None when the worker made no such call in that time. A pool
    behind a slow or lossy link shows here first."""


class LoadReport(BaseModel):
    """`GET /sessiongate/v1/load`: what the router needs to know, cheap enough to poll every 100-500 ms."""

    model_config = _WIRE

    at: float
    """The worker's clock (Unix seconds) when the report was made."""
    running_requests: int
    queued_requests: int
    queued_prefill_tokens: int | None = None
    """Prompt tokens of the queued requests not found in any cache (SGLang's `num_waiting_uncached_tokens`): the
    prefill work ahead of a new request, which request counts hide when prompts are 100 tokens or 100k. None from a
    worker that does not report it."""
    device_kv_tokens_total: int
    device_kv_tokens_used: int
    device_kv_tokens_cached: int | None = None
    """Device tokens cached that no running request holds (SGLang's evictable pages, which it counts as free): where
    a session's KV waits between turns, and what dropping it frees. None from a worker that does not report it."""
    host_kv_tokens_total: int | None = None
    host_kv_tokens_used: int | None = None
    prefetches_in_flight: int = 0
    prefetch_evicted_tokens: dict[str, int] = {}
    """Device tokens evicted to make room for advisory prefetches since the worker started, by what they were:
    `expired_hint` (an unused prefetch past its ttl), `unhinted` (KV no live hint expected), `hinted` (a live
    hint's KV of a lower priority). Priority-based KV memory; empty from a worker that evicted nothing for one."""
    prefill_tokens_per_s: float
    """Prefill speed while prefilling (tokens computed, cache hits excluded, per second of prefill batches) over
    the last 2 s of such work; it holds while the worker idles, 0 before its first prefill."""
    decode_tokens_per_s: float
    """Decode speed while decoding (tokens generated by the whole batch per second of decode steps) over the last
    2 s of such work, so `running / decode_tokens_per_s` is about one decode step; 0 before the first step."""
    page_size: int
    storage_backend: str | None = None
    """The shared pool this worker writes every computed page through to (HiCache's L3 backend), None without
    one. The router needs it because a turn's own cache report is empty when the prompt had no hits (SGLang
    reports nothing then), yet the turn's KV still lands in the pool."""
    pool_pages_rejected: int = 0
    """Pool pages (Mooncake: objects) read since the worker started that failed verification: other bytes than
    were written under their key, truncated, or of another format. Each was a cache miss (recomputed) and was
    removed from the pool. Always 0 with `file-unchecked` or a pool sessiongate does not verify."""
    pool_calls: dict[PoolCallKind, PoolCalls] = {}
    """How long the worker's calls to its shared pool take, by kind (`read`, `write`, `lookup`). Empty without a pool,
    with `file-unchecked` or a pool sessiongate does not time, and from a worker that does not report it."""


class _Context(BaseModel):
    """A session's context as chat messages (rendered by the worker's own chat template, so the keys equal
    those of the real request) or as token ids."""

    model_config = _WIRE

    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    input_ids: list[int] | None = None
    cache_salt: str | None = None
    """Per-tenant salt, part of every KV key: one tenant's KV never serves another's prompt."""

    @model_validator(mode="after")
    def _one_context(self) -> _Context:
        if (self.messages is None) == (self.input_ids is None):
            raise ValueError("give exactly one of 'messages' and 'input_ids'")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' is empty")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("'input_ids' is empty")
        return self


PrefetchTarget = Literal["host", "device"]
MAX_EXPECTED_IN_MS = 3_600_000
"""The furthest a prefetch's request may be expected (`PrefetchRequest.expected_in_ms`)."""
PrefetchState = Literal["queued", "running", "done", "cancelled", "failed", "expired"]


class PrefetchRequest(_Context):
    """`POST /sessiongate/v1/prefetch`: bring a session's KV close before its next request. Nothing is
    generated and nothing is recomputed: pages missing from every tier stay missing."""

    session_id: str
    model: str | None = None
    """If given, the worker's served model name; another name is refused (400, `wrong_model`)."""
    priority: int = 0
    ttl_ms: int = Field(default=30_000, ge=1, le=3_600_000)
    """After this long unused, the prefetched pages decay to the lowest priority (they are never pinned).
    Until then they have `priority`, and go after unhinted pages of the same priority (docs/prefetch.md)."""
    expected_in_ms: int | None = Field(default=None, ge=0, le=MAX_EXPECTED_IN_MS)
    """When the session's next request is expected, from now (None: at once). Among live hints of one priority
    the one expected last gives its pages up first (docs/prefetch.md, "The order in which KV leaves a tier")."""
    target: PrefetchTarget = "device"
    await_pool_ms: int = Field(default=0, ge=0, le=30_000)
    """Pages of the context that no tier of this worker holds may still be on their way to the pool: the turn that
    computed them ended moments ago on another worker, whose write-through runs in the background. Wait up to this
    long for the pool to hold every page before reading it (0: read what is there now)."""


class PrefetchAccepted(BaseModel):
    model_config = _WIRE

    prefetch_id: str
    session_id: str
    tokens: int
    """Length of the context in tokens, as the worker tokenised it."""
    state: PrefetchState


class PrefetchStatus(BaseModel):
    """`GET /sessiongate/v1/prefetch/{id}`."""

    model_config = _WIRE

    prefetch_id: str
    session_id: str
    state: PrefetchState
    target: PrefetchTarget
    tokens: int
    pages_requested: int
    """Pages of the context not resident on the device when the prefetch started."""
    pages_in_host: int
    pages_on_device: int
    pages_unavailable: int
    """Pages found in no tier (the next request recomputes them)."""
    bytes_loaded: int
    created_at: float
    finished_at: float | None = None
    error: str | None = None


class SessionKVRequest(_Context):
    """`POST /sessiongate/v1/sessions/{id}/retain` (`priority`, `ttl_ms` apply) and `.../drop`.

    retain: the session's cached pages rank at least `priority` for `ttl_ms`, then fall back (nothing
    is loaded or pinned). drop: the session's own pages leave device, host and the pool; a prefix that
    another cached context continues (a shared system prompt) and pages a running request holds stay.
    """

    model: str | None = None
    """If given, the worker's served model name; another name is refused (400, `wrong_model`)."""
    priority: int = 0
    ttl_ms: int = Field(default=300_000, ge=1, le=86_400_000)
    keep_messages: int = Field(default=0, ge=0)
    """drop, with `messages`: the first so many messages are another session's context too (a fork's parent's):
    the pages up to their end stay, whatever the tree shows below them."""


class KVOpResult(BaseModel):
    model_config = _WIRE

    session_id: str
    operation: Literal["retain", "drop"]
    tokens: int
    device_tokens: int
    host_tokens: int
    storage_tokens: int
    """Tokens of the context found in each tier (for `drop`: removed from it)."""

"""An in-process stand-in for an SGLang worker, speaking SGLang's HTTP API (the parts the gateway uses).

For tests and benchmarks about the gateway's own logic: answers are deterministic and instant (or delayed
as configured), usage and the cache report follow SGLang's wire format (`usage.prompt_tokens_details`,
`sglext.cached_tokens_details` when `return_cached_tokens_details` is set, a separate `sglext` chunk and a
usage chunk in streams), and a prefix cache over whitespace tokens makes `cached_tokens` behave like a radix
cache: a prompt that extends an earlier one reports the shared part as cached. As in SGLang, the request's
`cache_salt` is part of every key: a salted prompt only matches prompts sent with the same salt (and an unsalted
one only unsalted ones). The cache follows a real worker's tiers (held to it by
`tests/sglang_ext/test_worker_contract_engine.py`): a worker's device holds `device_kv_tokens_total` tokens and
evicts the least recently used prompts to its host tier (HiCache write-through; the host evicts in turn), every
prompt is written through to `pool` (shared only by workers given the same list, and only with a
`storage_backend`), and a prefix found in the pool beyond what device and host hold is a storage hit only from
`prefetch_threshold` tokens on (SGLang's HiCache threshold, 256 by default). Faults are switched on through
`FakeWorkerBehaviour`. Run standalone with `python -m sessiongate.benchmarks.fake_worker --port 31001`.

It also speaks the sessiongate extension (`sglang_ext.protocol`, unless `extension=False`: then 404): the load
report (its own running requests, `queued` as set), prefetch (after `prefetch_delay_s`, the context's pages found in
the shared pool become resident in the target tier; nothing is recomputed), and session retain / drop.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sessiongate.sglang_ext.pool_backends import TIMED_POOLS
from sessiongate.sglang_ext.pool_timing import PoolTiming
from sessiongate.sglang_ext.protocol import (
    LOAD_PATH,
    PREFETCH_PATH,
    SESSIONS_PATH,
    KVOpResult,
    LoadReport,
    PoolCallKind,
    PoolCalls,
    PrefetchAccepted,
    PrefetchRequest,
    PrefetchStatus,
    SessionKVRequest,
)

__all__ = ["FakeWorkerBehaviour", "create_fake_worker"]


@dataclass
class FakeWorkerBehaviour:
    """Knobs a test may turn while the app runs."""

    model: str = "fake-model"
    page_size: int = 1
    token_delay_s: float = 0.0
    # Answer every chat request with this status and an OpenAI error body.
    fail_status: int | None = None
    # Stop a stream (connection dropped) after this many content chunks.
    die_after_chunks: int | None = None
    # Never answer chat requests (until the client gives up).
    hang: bool = False
    healthy: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Prompts this worker holds on its device and in its host memory (least recently used first), and prompts any
    # worker sharing `pool` has written to it. Each entry is a cache key: the request's cache salt ("" for none)
    # followed by the prompt's tokens.
    device: list[tuple[str, ...]] = field(default_factory=list)
    pool: list[tuple[str, ...]] = field(default_factory=list)
    host: list[tuple[str, ...]] = field(default_factory=list)
    # The host tier's size in tokens (SGLang's `--hicache-ratio` 2 by default): what the device evicts lands here.
    host_kv_tokens_total: int = 2_000_000
    # HiCache's L3 backend, which the load report names; None: no pool, nothing written to it or read from it.
    storage_backend: str | None = "file"
    # SGLang's `prefetch_threshold` (the storage backend's extra config, `WorkerConfig.prefetch_threshold`): the part
    # of a prompt found in the pool beyond device and host is loaded only from this many tokens on (page-aligned).
    prefetch_threshold: int = 256
    # How long a prompt's pages take to reach the pool after its request (write-through runs in the background).
    pool_write_delay_s: float = 0.0
    # How long each call to the pool takes, as the load report's `pool_calls` says (nothing waits): a lookup when a
    # prompt's part beyond device and host reaches `prefetch_threshold` and when a prefetch starts, a read when pages
    # come from the pool, a write for each prompt's computed pages; timed as sessiongate's own pools time theirs
    # (`TIMED_POOLS`; with another `storage_backend` the report has no pool figures).
    pool_call_ms: float = 1.0
    pool_timing: PoolTiming = field(default_factory=PoolTiming, repr=False)
    _pool_writes: list[tuple[float, tuple[str, ...]]] = field(default_factory=list, init=False, repr=False)
    # The sessiongate extension: off answers 404 on its endpoints, like a worker started without it.
    extension: bool = True
    running: int = 0
    queued: int = 0
    queued_prefill_tokens: int | None = None
    prefill_tokens_per_s: float = 5000.0
    decode_tokens_per_s: float = 500.0
    prefetch_delay_s: float = 0.0
    prefetches: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the load report says was evicted for prefetches, by rank (the fake's prefetches never evict).
    prefetch_evicted_tokens: dict[str, int] = field(default_factory=dict)
    # The device KV pool (the cache evicts the least recently used prompts to stay within it, as the load report
    # states), and the tokens its running sequences hold (the real worker's "used": SGLang counts cached pages no
    # request holds as free; the fake's requests end at once, so 0).
    device_kv_tokens_total: int = 1_000_000
    device_kv_tokens_used: int = 0
    kv_ops: list[tuple[str, str]] = field(default_factory=list)
    kv_requests: list[SessionKVRequest] = field(default_factory=list)  # the bodies of `kv_ops`, in order
    # Off: no prompt is remembered and nothing is ever cached, so a request costs the same after thousands
    # (the cache model's lookup scans every prompt seen); for throughput benchmarks.
    prefix_cache: bool = True
    # SGLang's `--api-key`: when set, every route but /health and /metrics wants `Authorization: Bearer <key>`.
    api_key: str = ""

    def cache_hit(self, tokens: tuple[str, ...]) -> dict[str, int]:
        """Where the longest cached prefix of the key `tokens` (salt first) comes from, like SGLang's report; then
        the prompt is cached: on the device (evicting to host what no longer fits), and written to the pool."""
        if not self.prefix_cache:
            return {"device": 0, "host": 0, "storage": 0}
        self.land_pool_writes()
        # As SGLang: a request reuses at most all but its last token (that one's logits must be computed).
        usable = max(len(tokens) - 2, 0)
        on_device = self._pages(min(self._longest(self.device, tokens), usable))
        in_host = self._pages(max(min(self._longest(self.host, tokens), usable) - on_device, 0))
        in_pool = 0
        if self.storage_backend is not None:
            beyond = self._pages(max(usable - on_device - in_host, 0))
            if beyond >= self.prefetch_threshold:
                self.pool_call("lookup", beyond)
            in_pool = self._pages(max(min(self._longest(self.pool, tokens), usable) - on_device - in_host, 0))
            if in_pool < self.prefetch_threshold:
                in_pool = 0  # below SGLang's threshold the pool is not even asked
            self.pool_call("read", in_pool)
            self.pool_call("write", self._pages(len(tokens) - 1) - on_device - in_host - in_pool)
        self._remember(self.device, tokens)
        self._fit(self.device, self.device_kv_tokens_total, spill=self.host)
        self._fit(self.host, self.host_kv_tokens_total, spill=None)
        if self.storage_backend is not None:
            if self.pool_write_delay_s > 0:
                self._pool_writes.append((time.monotonic() + self.pool_write_delay_s, tokens))
            else:
                self.pool.append(tokens)
        return {"device": on_device, "host": in_host, "storage": in_pool}

    def pool_call(self, kind: PoolCallKind, tokens: int) -> None:
        """A call to the pool about `tokens` tokens (none: no call), timed as `pool_call_ms`."""
        if tokens > 0 and self.storage_backend in TIMED_POOLS:
            getattr(self.pool_timing, kind).record(self.pool_call_ms / 1000, tokens // self.page_size)

    def pool_calls(self) -> dict[PoolCallKind, PoolCalls]:
        """The load report's `pool_calls`."""
        if self.storage_backend not in TIMED_POOLS:
            return {}
        return {kind: PoolCalls(**figures) for kind, figures in self.pool_timing.report().items()}

    def land_pool_writes(self, now: float | None = None) -> None:
        """Write to the pool the prompts whose `pool_write_delay_s` has passed (by `now`)."""
        now = time.monotonic() if now is None else now
        landed = [tokens for due, tokens in self._pool_writes if due <= now]
        if landed:
            self._pool_writes[:] = [(due, tokens) for due, tokens in self._pool_writes if due > now]
            self.pool.extend(landed)

    def held_tokens(self, seen: list[tuple[str, ...]]) -> int:
        """Tokens the keys `seen` hold together, shared prefixes once (a radix tree's size)."""
        held = 0
        previous: tuple[str, ...] = ()
        for key in sorted(seen):
            shared = 0
            for a, b in zip(previous, key, strict=False):
                if a != b:
                    break
                shared += 1
            held += len(key) - max(shared, 1)  # the salt is no token
            previous = key
        return held

    def _remember(self, seen: list[tuple[str, ...]], tokens: tuple[str, ...]) -> None:
        """`tokens` becomes the most recently used key of `seen`; keys it extends are part of it now."""
        covering = next((t for t in seen if t[: len(tokens)] == tokens), None)
        seen[:] = [t for t in seen if tokens[: len(t)] != t and t is not covering]
        seen.append(covering if covering is not None else tokens)

    def _fit(self, seen: list[tuple[str, ...]], capacity: int, spill: list[tuple[str, ...]] | None) -> None:
        """Evict the least recently used keys of `seen` (into `spill`) until it holds at most `capacity` tokens;
        the newest key stays (a running request's pages cannot be evicted)."""
        if sum(len(t) - 1 for t in seen) <= capacity:
            return  # cheap bound first: holding less than its keys' sum, it fits
        while len(seen) > 1 and self.held_tokens(seen) > capacity:
            evicted = seen.pop(0)
            if spill is not None:
                self._remember(spill, evicted)

    def _pages(self, n: int) -> int:
        return n - n % self.page_size

    def _longest(self, seen: list[tuple[str, ...]], tokens: tuple[str, ...]) -> int:
        """Prompt tokens (the salt not counted) of the longest prefix of key `tokens` that `seen` holds."""
        best = 0
        for earlier in seen:
            if not earlier or not tokens or earlier[0] != tokens[0]:
                continue  # another salt: SGLang's radix tree never matches across salts
            n = 0
            for a, b in zip(earlier[1:], tokens[1:], strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return self._pages(best)


def _prompt_tokens(body: dict[str, Any]) -> tuple[str, ...]:
    """The request's cache key: its cache salt ("" without one), then its prompt's whitespace tokens."""
    salt = body.get("cache_salt")
    words: list[str] = [salt if isinstance(salt, str) else ""]
    for message in body.get("messages") or []:
        words.append(f"<{message.get('role')}>")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        words.extend(str(content or "").split())
        for call in message.get("tool_calls") or []:
            words.extend(str(call.get("function", {}).get("arguments", "")).split())
    return tuple(words)


def _reply_words(body: dict[str, Any]) -> list[str]:
    last: dict[str, Any] = next(
        (m for m in reversed(body.get("messages") or []) if m.get("role") in {"user", "tool"}), {}
    )
    content = last.get("content")
    if not isinstance(content, str):
        content = "..."
    limit = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    return ["echo:", *content.split()][:limit]


def _tool_call(body: dict[str, Any]) -> dict[str, Any] | None:
    choice = body.get("tool_choice")
    tools = body.get("tools") or []
    if not tools or choice in (None, "none", "auto"):
        return None
    name = tools[0]["function"]["name"]
    if isinstance(choice, dict):
        name = choice.get("function", {}).get("name", name)
    return {
        # As SGLang: a fresh id for every call (an agent's calls of one tool in one session must stay apart).
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps({"q": "x"}).decode()},
    }


def create_fake_worker(behaviour: FakeWorkerBehaviour | None = None) -> Starlette:
    b = behaviour or FakeWorkerBehaviour()

    async def health(request: Request) -> Response:
        return Response(status_code=200 if b.healthy else 503)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": b.model, "object": "model", "owned_by": "sglang"}]})

    # What SGLang's model gateway (`smg`) reads when it registers a worker: with them it identifies the fake as
    # an SGLang engine, as it does a real worker, instead of falling back to a generic OpenAI backend.
    async def server_info(request: Request) -> Response:
        return JSONResponse({"model_path": b.model, "served_model_name": b.model, "tp_size": 1, "dp_size": 1})

    async def model_info(request: Request) -> Response:
        return JSONResponse({"model_path": b.model, "tokenizer_path": None, "is_generation": True})

    async def chat(request: Request) -> Response:
        b.running += 1
        try:
            return await _chat(request)
        finally:
            b.running -= 1

    async def _chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        b.requests.append(body)
        if b.hang:
            await asyncio.sleep(3600)
        if b.fail_status is not None:
            return JSONResponse(
                {
                    "object": "error",
                    "message": "injected failure",
                    "type": "BadRequestError",
                    "param": None,
                    "code": b.fail_status,
                },
                status_code=b.fail_status,
            )
        prompt = _prompt_tokens(body)
        hit = b.cache_hit(prompt)
        if b.pool_write_delay_s > 0:  # the write-through lands in the background, as the real one's does
            # Its own due time: a loop may run a timer a little early (within its clock's resolution).
            due = time.monotonic() + b.pool_write_delay_s
            asyncio.get_running_loop().call_later(b.pool_write_delay_s, b.land_pool_writes, due)
        cached = sum(hit.values())
        words = _reply_words(body)
        call = _tool_call(body)
        prompt_tokens = len(prompt) - 1  # the key's salt is no token
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": prompt_tokens + len(words),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        # As SGLang: no cache report at all for a prompt without hits.
        details: dict[str, Any] | None = None
        if cached:
            details = {**hit, "storage_backend": b.storage_backend} if b.storage_backend else dict(hit)
        rid = f"chatcmpl-{len(b.requests)}"
        if not body.get("stream"):
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s * len(words))
            message: dict[str, Any] = {"role": "assistant", "content": None if call else " ".join(words)}
            if call:
                message["tool_calls"] = [call]
            answer: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": b.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                "usage": usage,
            }
            if body.get("return_cached_tokens_details") and details is not None:
                answer["sglext"] = {"cached_tokens_details": details}
            return JSONResponse(answer)
        return StreamingResponse(_stream(b, body, rid, words, call, usage, details), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/server_info", server_info),
            Route("/model_info", model_info),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            *_extension_routes(b),
        ]
    )

    return _KeyCheck(app, b) if b.api_key else app  # type: ignore[return-value]


class _KeyCheck:
    """SGLang's api-key middleware: /health and /metrics are open, everything else wants `Bearer <key>`."""

    def __init__(self, app: Starlette, behaviour: FakeWorkerBehaviour) -> None:
        self.app, self.behaviour, self.state = app, behaviour, app.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(("/health", "/metrics")):
            headers = dict(scope["headers"])
            if headers.get(b"authorization", b"").decode() != f"Bearer {self.behaviour.api_key}":
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _extension_routes(b: FakeWorkerBehaviour) -> list[Route]:
    """The sessiongate extension's endpoints, as `sglang_ext.protocol` defines them."""

    def missing() -> Response:
        error = {"message": "Not Found", "type": "invalid_request_error", "code": "not_found"}
        return JSONResponse({"error": error}, status_code=404)

    async def load(request: Request) -> Response:
        if not b.extension:
            return missing()
        cached = b.held_tokens(b.device)
        report = LoadReport(
            at=time.time(),
            running_requests=b.running,
            queued_requests=b.queued,
            queued_prefill_tokens=b.queued_prefill_tokens,
            device_kv_tokens_total=b.device_kv_tokens_total,
            device_kv_tokens_used=min(b.device_kv_tokens_used, b.device_kv_tokens_total),
            device_kv_tokens_cached=min(cached, b.device_kv_tokens_total),
            prefetches_in_flight=sum(1 for p in b.prefetches.values() if p["state"] in ("queued", "running")),
            prefetch_evicted_tokens=dict(b.prefetch_evicted_tokens),
            prefill_tokens_per_s=b.prefill_tokens_per_s,
            decode_tokens_per_s=b.decode_tokens_per_s,
            page_size=b.page_size,
            storage_backend=b.storage_backend,
            pool_calls=b.pool_calls(),
        )
        return Response(report.model_dump_json(), media_type="application/json")

    def status(prefetch_id: str) -> PrefetchStatus:
        entry = b.prefetches[prefetch_id]
        if entry["state"] == "queued" and time.monotonic() - entry["created"] >= b.prefetch_delay_s:
            tokens: tuple[str, ...] = entry["tokens"]
            b.land_pool_writes()
            available = b._longest(b.pool, tokens) if b.storage_backend is not None else 0
            b.pool_call("lookup", b._pages(len(tokens) - 1))
            b.pool_call("read", available)
            if available:
                if entry["target"] == "device":
                    b._remember(b.device, tokens[: available + 1])
                    b._fit(b.device, b.device_kv_tokens_total, spill=b.host)
                else:
                    b._remember(b.host, tokens[: available + 1])
                b._fit(b.host, b.host_kv_tokens_total, spill=None)
            entry.update(state="done", available=available, finished_at=time.time())
        available = entry.get("available", 0)
        return PrefetchStatus(
            prefetch_id=prefetch_id,
            session_id=entry["session_id"],
            state=entry["state"],
            target=entry["target"],
            tokens=len(entry["tokens"]) - 1,
            pages_requested=len(entry["tokens"]) - 1,
            pages_in_host=available if entry["target"] == "host" else 0,
            pages_on_device=available if entry["target"] == "device" else 0,
            pages_unavailable=len(entry["tokens"]) - 1 - available if entry["state"] == "done" else 0,
            bytes_loaded=available * 1024,
            created_at=entry["created_wall"],
            finished_at=entry.get("finished_at"),
        )

    async def prefetch(request: Request) -> Response:
        if not b.extension:
            return missing()
        try:
            body = PrefetchRequest.model_validate_json(await request.body())
        except pydantic.ValidationError as exc:
            error = {"message": str(exc), "type": "invalid_request_error", "code": "invalid_body"}
            return JSONResponse({"error": error}, status_code=400)
        prefetch_id = f"pf_{len(b.prefetches) + 1}"
        tokens = _prompt_tokens({"messages": body.messages or [], "cache_salt": body.cache_salt})
        b.prefetches[prefetch_id] = {
            "session_id": body.session_id,
            "tokens": tokens,
            "target": body.target,
            "state": "queued",
            "created": time.monotonic(),
            "created_wall": time.time(),
            "request": body,
        }
        current = status(prefetch_id)
        accepted = PrefetchAccepted(
            prefetch_id=prefetch_id, session_id=body.session_id, tokens=len(tokens) - 1, state=current.state
        )
        return Response(accepted.model_dump_json(), status_code=202, media_type="application/json")

    async def prefetch_one(request: Request) -> Response:
        prefetch_id = request.path_params["prefetch_id"]
        if not b.extension or prefetch_id not in b.prefetches:
            return missing()
        if request.method == "DELETE":
            # A finished prefetch stays done; the real worker then ends its hint (its pages' rank).
            b.prefetches[prefetch_id]["cancelled_at"] = time.monotonic()
            if b.prefetches[prefetch_id]["state"] == "queued":
                b.prefetches[prefetch_id]["state"] = "cancelled"
        return Response(status(prefetch_id).model_dump_json(), media_type="application/json")

    async def session_kv(request: Request) -> Response:
        if not b.extension:
            return missing()
        session_id, operation = request.path_params["session_id"], request.path_params["operation"]
        if operation not in ("retain", "drop"):
            return missing()
        body = SessionKVRequest.model_validate_json(await request.body())
        tokens = _prompt_tokens({"messages": body.messages or [], "cache_salt": body.cache_salt})
        b.land_pool_writes()
        found = {name: b._longest(getattr(b, name), tokens) for name in ("device", "host", "pool")}
        if operation == "drop":
            # Only keys under the same salt can be this session's: another salt's identical prompt stays.
            for name in ("device", "host", "pool"):
                kept = [t for t in getattr(b, name) if t[: len(tokens)] != tokens[: len(t)]]
                getattr(b, name)[:] = kept
        b.kv_ops.append((operation, session_id))
        b.kv_requests.append(body)
        result = KVOpResult(
            session_id=session_id,
            operation=operation,
            tokens=len(tokens) - 1,
            device_tokens=found["device"],
            host_tokens=found["host"],
            storage_tokens=found["pool"],
        )
        return Response(result.model_dump_json(), media_type="application/json")

    return [
        Route(LOAD_PATH, load),
        Route(PREFETCH_PATH, prefetch, methods=["POST"]),
        Route(PREFETCH_PATH + "/{prefetch_id}", prefetch_one, methods=["GET", "DELETE"]),
        Route(SESSIONS_PATH + "/{session_id}/{operation}", session_kv, methods=["POST"]),
    ]


async def _stream(
    b: FakeWorkerBehaviour,
    body: dict[str, Any],
    rid: str,
    words: list[str],
    call: dict[str, Any] | None,
    usage: dict[str, Any],
    details: dict[str, Any] | None,
) -> AsyncIterator[bytes]:
    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        # As SGLang's chunks: `usage` is in every one (null but in the usage chunk), `sglext` only where it is set.
        chunk = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": b.model,
            "choices": choices,
            "usage": None,
            **extra,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    if call:
        head = {**call, "index": 0, "function": {"name": call["function"]["name"], "arguments": ""}}
        yield event([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}])
        args = call["function"]["arguments"]
        for part in (args[: len(args) // 2], args[len(args) // 2 :]):
            yield event(
                [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": part}}]},
                        "finish_reason": None,
                    }
                ]
            )
    else:
        for i, word in enumerate(words):
            if b.die_after_chunks is not None and i >= b.die_after_chunks:
                raise ConnectionResetError("injected: worker died mid-stream")
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s)
            yield event([{"index": 0, "delta": {"content": (" " if i else "") + word}, "finish_reason": None}])
    yield event([{"index": 0, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}])
    if body.get("return_cached_tokens_details") and details is not None:
        yield event([], sglext={"cached_tokens_details": details})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield event([], usage=usage)
    yield b"data: [DONE]\n\n"


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="A fast fake SGLang worker for gateway benchmarks.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=31001)
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    parser.add_argument(
        "--no-prefix-cache", action="store_true", help="report nothing cached; keeps the cost per request flat"
    )
    args = parser.parse_args()
    behaviour = FakeWorkerBehaviour(token_delay_s=args.token_delay_s, prefix_cache=not args.no_prefix_cache)
    app = create_fake_worker(behaviour)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

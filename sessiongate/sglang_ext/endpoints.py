"""The extension's HTTP endpoints on a worker (`protocol.LOAD_PATH`, `PREFETCH_PATH`, `SESSIONS_PATH`).

Runs in SGLang's HTTP server process; registered by `plugin.load_plugin` on SGLang's FastAPI app.
Requests and answers are the `protocol` models; every error is an `ErrorResponse` (the OpenAI
error format) with a 4xx status for the caller's mistakes (400: invalid body, wrong model, a
context longer than the model's, token ids outside the vocabulary; 404: an unknown prefetch id or
session operation), 500 `engine_error` when the engine raised (the scheduler logs it and keeps
serving), 501 `unsupported` when the engine's cache cannot do a session operation, and 503 when
the scheduler does not answer in time. The work itself happens on the scheduler
(`internals.scheduler_ops`): these handlers validate, render chat messages into token ids, compute a session
operation's L3 page hashes, and make one call to it, the token ids and hashes in compact forms (`call_payload`) so
the scheduler's thread parses and hashes nothing large.

`GET /load` is polled every 100-500 ms by the router: its request counts and device KV come from
the load snapshot the scheduler publishes in shared memory (no round trip); host KV, prefetches
in flight, throughput and the pool's figures (rejected pages, the timing of its calls) come from
a call to the scheduler that waits at most `STATS_WAIT_S` and otherwise reuses the previous answer,
so a scheduler busy with a long prefill chunk never makes the report slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from array import array
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from sessiongate.sglang_ext.call_payload import pack_hashes, pack_tokens
from sessiongate.sglang_ext.internals import http_ops, plugin_ops, pool_pages
from sessiongate.sglang_ext.protocol import (
    ErrorDetail,
    ErrorResponse,
    KVOpResult,
    LoadReport,
    PoolCalls,
    PrefetchAccepted,
    PrefetchRequest,
    PrefetchStatus,
    SessionKVRequest,
)

__all__ = ["STATS_WAIT_S", "Endpoints"]

STATS_WAIT_S = 0.25
FIRST_STATS_WAIT_S = 5.0
CALL_TIMEOUT_S = 30.0
DELETION_POLL_S = 0.005

_STATUS_FIELDS = tuple(PrefetchStatus.model_fields)
_SESSION_OPERATIONS = ("retain", "drop")

ContextBody = TypeVar("ContextBody", PrefetchRequest, SessionKVRequest)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = ErrorResponse(error=ErrorDetail(message=message, type=kind, code=code))
    return JSONResponse(body.model_dump(mode="json"), status_code=status)


def _status(record: dict[str, Any]) -> PrefetchStatus:
    return PrefetchStatus(**{name: record[name] for name in _STATUS_FIELDS if name in record})


class Endpoints:
    """The handlers, sharing one channel to the scheduler."""

    def __init__(self) -> None:
        self._channel = http_ops.SchedulerChannel()
        self._stats: dict[str, Any] = {}
        self._stats_call: asyncio.Task[dict[str, Any]] | None = None

    async def _scheduler_stats(self) -> dict[str, Any]:
        if self._stats_call is None or self._stats_call.done():
            self._stats_call = asyncio.ensure_future(self._channel.call("stats", {}, wait_s=CALL_TIMEOUT_S))
        # On a timeout (or a refusal) the previous figures stand in until the scheduler answers;
        # the first report waits longer, having none.
        wait_s = STATS_WAIT_S if self._stats else FIRST_STATS_WAIT_S
        with contextlib.suppress(TimeoutError, http_ops.CallFailed):
            self._stats = await asyncio.wait_for(asyncio.shield(self._stats_call), wait_s)
        return self._stats

    async def load(self) -> JSONResponse:
        figures = http_ops.load_snapshot()
        facts = plugin_ops.server_facts()
        stats = await self._scheduler_stats()
        if figures is None:
            return error_response(503, "not_ready", "the scheduler has not published a load snapshot yet")
        report = LoadReport(
            at=time.time(),
            running_requests=figures.running_requests,
            queued_requests=figures.queued_requests,
            queued_prefill_tokens=figures.queued_prefill_tokens,
            device_kv_tokens_total=figures.device_kv_tokens_total,
            device_kv_tokens_used=figures.device_kv_tokens_used,
            device_kv_tokens_cached=stats.get("device_kv_tokens_cached"),
            host_kv_tokens_total=stats.get("host_kv_tokens_total"),
            host_kv_tokens_used=stats.get("host_kv_tokens_used"),
            prefetches_in_flight=int(stats.get("prefetches_in_flight", 0)),
            prefetch_evicted_tokens={str(k): int(v) for k, v in (stats.get("prefetch_evicted_tokens") or {}).items()},
            prefill_tokens_per_s=float(stats.get("prefill_tokens_per_s", 0.0)),
            decode_tokens_per_s=float(stats.get("decode_tokens_per_s", 0.0)),
            page_size=facts.page_size,
            storage_backend=facts.storage_backend,
            pool_pages_rejected=int(stats.get("pool_pages_rejected", 0)),
            pool_calls={kind: PoolCalls(**figures) for kind, figures in (stats.get("pool_calls") or {}).items()},
        )
        return JSONResponse(report.model_dump(mode="json"))

    async def _context(
        self, request: Request, model: type[ContextBody]
    ) -> tuple[ContextBody, list[int]] | JSONResponse:
        """The validated body and its context as token ids, or the error answer."""
        try:
            body = model.model_validate_json(await request.body())
        except ValidationError as error:
            return error_response(400, "invalid_body", _validation_message(error))
        facts = http_ops.model_facts()
        requested_model = getattr(body, "model", None)
        if requested_model is not None and requested_model != facts.served_model_name:
            return error_response(
                400, "wrong_model", f"this worker serves {facts.served_model_name!r}, not {requested_model!r}"
            )
        if body.messages is not None:
            try:
                input_ids = http_ops.render_chat(body.messages, body.tools)
            except http_ops.RenderError as error:
                return error_response(400, "invalid_messages", str(error))
        else:
            assert body.input_ids is not None  # the model's validator: exactly one of the two
            input_ids = body.input_ids
            if not all(0 <= token < facts.vocab_size for token in input_ids):
                # Never keys of any cached page; SGLang itself would crash computing them.
                return error_response(
                    400, "invalid_token_ids", f"token ids must lie in [0, {facts.vocab_size}) for this model"
                )
        if len(input_ids) > facts.context_length:
            return error_response(
                400,
                "context_too_long",
                f"the context is {len(input_ids)} tokens; the model takes at most {facts.context_length}",
            )
        return body, input_ids

    async def _call(
        self, op: str, call: dict[str, Any], tokens: bytes = b"", hashes: str = ""
    ) -> dict[str, Any] | JSONResponse:
        try:
            return await self._channel.call(op, call, wait_s=CALL_TIMEOUT_S, tokens=tokens, hashes=hashes)
        except http_ops.CallFailed as error:
            status = {"not_found": 404, "unsupported": 501}.get(error.code, 500)
            return error_response(status, error.code, str(error))
        except TimeoutError:
            return error_response(503, "scheduler_timeout", "the scheduler did not answer")

    async def start_prefetch(self, request: Request) -> JSONResponse:
        parsed = await self._context(request, PrefetchRequest)
        if isinstance(parsed, JSONResponse):
            return parsed
        body, input_ids = parsed
        call = {
            "prefetch_id": uuid.uuid4().hex,
            "session_id": body.session_id,
            "cache_salt": body.cache_salt,
            "priority": body.priority,
            "ttl_ms": body.ttl_ms,
            "target": body.target,
            "await_pool_ms": body.await_pool_ms,
            "expected_in_ms": body.expected_in_ms,
        }
        record = await self._call("start", call, tokens=pack_tokens(input_ids))
        if isinstance(record, JSONResponse):
            return record
        accepted = PrefetchAccepted(
            prefetch_id=record["prefetch_id"],
            session_id=record["session_id"],
            tokens=record["tokens"],
            state=record["state"],
        )
        return JSONResponse(accepted.model_dump(mode="json"), status_code=202)

    async def session_kv(self, request: Request, session_id: str, operation: str) -> JSONResponse:
        """`POST /sessions/{session_id}/retain` or `.../drop` (`SessionKVRequest` -> `KVOpResult`)."""
        if operation not in _SESSION_OPERATIONS:
            return error_response(404, "not_found", f"no session operation {operation!r}; use retain or drop")
        parsed = await self._context(request, SessionKVRequest)
        if isinstance(parsed, JSONResponse):
            return parsed
        body, input_ids = parsed
        call = {
            "session_id": session_id,
            "cache_salt": body.cache_salt,
            "priority": body.priority,
            "ttl_ms": body.ttl_ms,
        }
        if operation == "drop" and body.messages is not None and body.keep_messages > 0:
            # The shared messages rendered alone (with the template's generation prompt after them, so the floor
            # errs towards keeping a few tokens more): nothing of the context before that many tokens goes.
            try:
                kept = http_ops.render_chat(body.messages[: body.keep_messages], body.tools)
            except http_ops.RenderError as error:
                return error_response(400, "invalid_messages", str(error))
            call["floor_tokens"] = len(kept)
        # The L3 keys of the context's pages, hashed here (a thread of the HTTP process), not on the scheduler's.
        hashes = await asyncio.to_thread(
            pool_pages.context_page_hashes, array("q", input_ids), body.cache_salt, http_ops.model_facts().page_size
        )
        result = await self._call(operation, call, tokens=pack_tokens(input_ids), hashes=pack_hashes(hashes))
        if isinstance(result, JSONResponse):
            return result
        ticket = result.pop("pool_deletion", None)
        if ticket is not None:
            deleted = await self._pool_deletion(str(ticket))
            if isinstance(deleted, JSONResponse):
                return deleted
            result["storage_tokens"] = deleted
        return JSONResponse(KVOpResult(**result).model_dump(mode="json"))

    async def _pool_deletion(self, ticket: str) -> int | JSONResponse:
        """A drop's pool pages go on a thread of the scheduler process: ask until they are gone (the tokens)."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            outcome = await self._call("pool_deletion", {"ticket": ticket})
            if isinstance(outcome, JSONResponse) or outcome["done"]:
                return outcome if isinstance(outcome, JSONResponse) else int(outcome["storage_tokens"])
            if time.monotonic() > deadline:
                return error_response(503, "scheduler_timeout", "the pool's deletions did not finish")
            await asyncio.sleep(DELETION_POLL_S)

    async def _prefetch_call(self, op: str, prefetch_id: str) -> JSONResponse:
        record = await self._call(op, {"prefetch_id": prefetch_id})
        if isinstance(record, JSONResponse):
            return record
        return JSONResponse(_status(record).model_dump(mode="json"))

    async def prefetch_status(self, prefetch_id: str) -> JSONResponse:
        return await self._prefetch_call("status", prefetch_id)

    async def cancel_prefetch(self, prefetch_id: str) -> JSONResponse:
        return await self._prefetch_call("cancel", prefetch_id)


def _validation_message(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"]) or "body"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)

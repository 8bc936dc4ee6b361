"""Relaying a streamed answer (SSE) from a worker to the client while recording the turn.

The worker's stream is opened before the client gets a status line, so a worker that fails before its first
byte yields a proper 502/503/504 in the OpenAI error format. After that, bytes are forwarded as they come (no
buffering: each chunk is written as soon as it is read), and the turn ends in exactly one of three ways,
each recorded: done, failed (an error event is sent to the client, then the stream closes) or cancelled (the
client went away; the worker's request is closed too, which makes SGLang abort it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import orjson
import structlog
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sessiongate.gateway.errors import GatewayError, UpstreamError, WorkerUnreachable
from sessiongate.gateway.workers.upstream import SSELines

from .assembly import StreamAssembler, attach_cache_details
from .context import TurnContext, fail_turn, finish_turn

__all__ = ["StreamRelay"]

log = structlog.get_logger(__name__)

_DONE = b"data: [DONE]\n\n"


class StreamRelay:
    def __init__(self, ctx: TurnContext, url: str, body: dict[str, Any]) -> None:
        self.ctx = ctx
        self.url = url
        self.body = body
        self.assembler = StreamAssembler()
        self._resources = contextlib.ExitStack()  # the worker's lease, then its stream
        self._lines: SSELines | None = None
        self.error: GatewayError | None = None
        self.done = False

    async def open(self) -> Response:
        """Open the worker's stream; an error before its first byte propagates (the caller may retry)."""
        state = self.ctx.state
        self._resources.enter_context(state.workers.lease(self.ctx.worker_id))
        self.ctx.dispatched_at = datetime.now(UTC)
        traceparent = self.ctx.trace.upstream_start(self.ctx.worker_id)
        lost = f"Worker {self.ctx.worker_id} became unreachable before it answered (its health checks cannot connect)."
        try:
            with state.workers.abort_if_lost(self.ctx.worker_id, lost):
                self._lines = await state.worker_client.open_stream(
                    self.ctx.worker_id, self.url, self.body, traceparent=traceparent
                )
        except UpstreamError:
            self._resources.close()
            raise
        self._resources.callback(self._lines.close)
        return _RelayResponse(self)

    async def pump(self, send: Send) -> None:
        assert self._lines is not None
        lost = f"Worker {self.ctx.worker_id} became unreachable mid-stream (its health checks cannot connect)."
        try:
            with self.ctx.state.workers.abort_if_lost(self.ctx.worker_id, lost):
                await self._relay(send)
            if not self.done:
                raise WorkerUnreachable(
                    f"Worker {self.ctx.worker_id} ended the stream before it was done.", worker=self.ctx.worker_id
                )
        except UpstreamError as exc:
            self.error = exc
            event = b"data: " + orjson.dumps(exc.body()) + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})

    async def _relay(self, send: Send) -> None:
        assert self._lines is not None
        worker = self.ctx.state.workers.get(self.ctx.worker_id)
        async for lines in self._lines:
            if worker is not None:
                worker.last_progress = time.monotonic()
            # What arrived together leaves together: one write to the client per read from the worker.
            out = []
            for line in lines:
                out.append(self._translate(line))
                if self.done:
                    break
            body = b"".join(out)
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            if self.done:
                break

    def _translate(self, line: bytes) -> bytes:
        """The bytes to forward for one SSE line of the worker's stream (may be nothing)."""
        if not line.startswith(b"data:"):
            return line + b"\n"
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return _DONE
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b"data: " + payload + b"\n\n"
        if not isinstance(chunk, dict):
            return b"data: " + payload + b"\n\n"
        if "error" in chunk:
            self.error = GatewayError(
                str(chunk["error"].get("message", "worker error"))
                if isinstance(chunk["error"], dict)
                else str(chunk["error"])
            )
            return b"data: " + payload + b"\n\n"
        self.assembler.add(chunk)
        if self.ctx.first_token_at is None and chunk.get("choices"):
            self.ctx.first_token_at = datetime.now(UTC)
            self.ctx.state.metrics.ttft.observe(time.perf_counter() - self.ctx.started)
            self.ctx.trace.first_token()
        if chunk.get("choices"):
            return b"data: " + payload + b"\n\n"
        if isinstance(chunk.get("usage"), dict):
            if not self.ctx.client_wants_usage:
                return b""
            attach_cache_details(chunk["usage"], self.assembler.cached_tokens_details)
            chunk["sessiongate"] = self.ctx.annotation()
            return b"data: " + orjson.dumps(chunk) + b"\n\n"
        if "sglext" in chunk and not self.ctx.client_wants_cache_report:
            return b""
        return b"data: " + payload + b"\n\n"

    async def finish(self, *, client_gone: bool) -> None:
        self._resources.close()
        partial = self.assembler.message()
        if self.done and self.error is None:
            await finish_turn(self.ctx, self.assembler.result())
            return
        # The worker accepted the stream and prefilled the prompt (or was prefilling it when the client left) and
        # generated what was relayed: the tenant is charged for that, or a client could hang up before the usage
        # chunk and never pay. A worker error before any chunk did no work worth charging.
        worked = self.assembler.chunks > 0 or self.error is None
        used = self.assembler.tokens_used(self.body) if worked else 0
        if self.error is not None:
            await fail_turn(self.ctx, self.error, partial=partial, used_tokens=used)
        else:
            reason = "the client disconnected" if client_gone else "the gateway stopped the stream"
            await fail_turn(self.ctx, _Cancelled(reason), status="cancelled", partial=partial, used_tokens=used)


class _Cancelled(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_EVENT_STREAM_HEADERS = ((b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"))


class _RelayResponse(Response):
    """The streamed answer (chunked: no content-length). Starlette's `Response.__init__` is not called: it renders
    a body and derives headers that a stream does not have."""

    media_type = "text/event-stream"

    def __init__(self, relay: StreamRelay) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [*_EVENT_STREAM_HEADERS, *((k.encode(), v.encode()) for k, v in relay.ctx.headers().items())]
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client_gone = False
        recorded = False
        relaying = asyncio.current_task()
        assert relaying is not None

        # The client's going away stops the relay at once, between two chunks too (the worker's request is
        # closed, so SGLang aborts it). A plain task and `Task.cancel`: an anyio task group here cost about a
        # fifth of a streamed turn's CPU (docs/benchmarks.md).
        async def watch_disconnect() -> None:
            nonlocal client_gone
            while (await receive())["type"] != "http.disconnect":
                pass
            client_gone = True
            relaying.cancel()

        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            watcher = relaying.get_loop().create_task(watch_disconnect())
            try:
                await self.relay.pump(send)
            except asyncio.CancelledError:
                if not client_gone:
                    raise
            finally:
                watcher.cancel()
            # The watcher's cancellation is taken back; if the request itself was cancelled too, that goes on.
            if client_gone and relaying.uncancel() > 0:
                raise asyncio.CancelledError
            # Record the turn before the stream closes, so a client that reads to the end finds it recorded.
            with anyio.CancelScope(shield=True):
                recorded = True
                await self.relay.finish(client_gone=client_gone)
            if not client_gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if not recorded:
                with anyio.CancelScope(shield=True):
                    await self.relay.finish(client_gone=client_gone)

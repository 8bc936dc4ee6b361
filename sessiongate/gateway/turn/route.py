"""`POST /v1/chat/completions` as its own ASGI route, ahead of Starlette's middleware stack and router.

The chat turn is the gateway's hot path, and its proxying CPU is what the gateway is measured by (against SGLang's
Rust gateway, docs/benchmarks.md). Through Starlette it went through three middleware closures, the exception
middleware, the router's matching and the endpoint wrapper on every turn. `ChatRoute` sits first in the user
middleware (inside Starlette's `ServerErrorMiddleware`, so an unexpected error still ends as before) and serves the
chat route itself, with the same steps those layers take, from the same functions (`middleware`, `errors`):
request id and access log, the body and header limits, the OpenAI-format error for anything the handler raises.
Every other request, and any other method on this path (405 from the router), goes down the usual stack.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessiongate.gateway.api.middleware import (
    declared_body_too_large,
    end_request,
    headers_too_large,
    limit_body,
    refuse_body,
    refuse_headers,
    start_request,
)
from sessiongate.gateway.errors import exception_handlers
from sessiongate.gateway.observability.metrics import GatewayMetrics

__all__ = ["CHAT_PATH", "ChatRoute"]

CHAT_PATH = "/v1/chat/completions"

Handler = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class ChatRoute:
    def __init__(
        self,
        app: ASGIApp,
        *,
        handler: Handler,
        metrics: GatewayMetrics,
        max_body_bytes: int,
        max_header_bytes: int,
    ) -> None:
        self.app = app
        self.handler = handler
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self._error_handlers: dict[Any, ErrorHandler] = exception_handlers()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A root path (a gateway mounted under a prefix) leaves matching to Starlette's router.
        if scope["type"] != "http" or scope["path"] != CHAT_PATH or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        request_id = start_request(scope)
        started = time.perf_counter()
        status = 500
        try:
            status = await self._serve(scope, receive, send, request_id.encode())
        finally:
            end_request(self.metrics, scope, CHAT_PATH, status, started)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, request_id: bytes) -> int:
        """Answer the request; its status."""
        response_started = False

        async def send_marked(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id)]
            await send(message)

        # The same order as the middleware stack: the declared body size, then the headers.
        if declared_body_too_large(scope, self.max_body_bytes):
            await refuse_body(send_marked, self.max_body_bytes)
            return 413
        if headers_too_large(scope, self.max_header_bytes):
            await refuse_headers(send_marked, self.max_header_bytes)
            return 431
        request = _ChatRequest(scope, limit_body(receive, self.max_body_bytes))
        try:
            response = await self.handler(request)
            await response(scope, receive, send_marked)
            return response.status_code
        except Exception as exc:
            error_handler = self._error_handler(exc)
            if error_handler is None or response_started:
                raise  # to Starlette's ServerErrorMiddleware, as from its stack
            response = await error_handler(request, exc)
            await response(scope, receive, send_marked)
            return response.status_code

    def _error_handler(self, exc: Exception) -> ErrorHandler | None:
        """The handler Starlette's exception middleware would pick: the nearest class in the error's MRO. The
        catch-all (`Exception`) is `ServerErrorMiddleware`'s there, so it is left to it here too."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in self._error_handlers:
                return self._error_handlers[cls]
        return None


class _ChatRequest(Request):
    """A `Request` whose headers are looked up in a dict (`_IndexedHeaders`) and whose body is read without
    Starlette's async generator (`Request.stream`: a generator, a frame and a `hasattr` miss per turn, for a body
    that comes in one message)."""

    @property
    def headers(self) -> Headers:
        headers = self.__dict__.get("_headers")
        if headers is None:
            headers = self._headers = _IndexedHeaders(scope=self.scope)
        return headers

    async def body(self) -> bytes:
        """The whole body, as Starlette's `Request.body` reads it (and then keeps it)."""
        body: bytes | None = self.__dict__.get("_body")
        if body is not None:
            return body
        if self._stream_consumed:
            raise RuntimeError("Stream consumed")
        chunks = []
        while not self._stream_consumed:
            message = await self._receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self._stream_consumed = True
            elif message["type"] == "http.disconnect":
                self._is_disconnected = True
                raise ClientDisconnect()
        body = self._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return body


class _IndexedHeaders(Headers):
    """Starlette's `Headers` with a dict for `get`, `[]` and `in`: Starlette's scan the raw list for each lookup, and
    a missing header (most of the dozen a turn asks for) raises and catches a KeyError. The first of repeated
    headers wins, as in Starlette's; iteration and `getlist` are Starlette's own."""

    def __init__(self, *, scope: Scope) -> None:
        super().__init__(scope=scope)
        self._index: dict[bytes, bytes] = {}
        for key, value in self.raw:
            self._index.setdefault(key, value)

    def __getitem__(self, key: str) -> str:
        value = self._index.get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def get(self, key: str, default: Any = None) -> Any:
        value = self._index.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return isinstance(key, str) and key.lower().encode("latin-1") in self._index

"""Pure ASGI middleware (not `BaseHTTPMiddleware`, which breaks contextvars and streaming).

- `RequestContext`: a request id (the client's `x-request-id` when it is sane, else a new one) bound into the
  log context and echoed in the response; one access-log event and the request counter per request.
- `BodyLimit`: refuses bodies over the configured size with 413, by `content-length` up front or by counting
  the bytes of a chunked body as they arrive.
- `HeaderLimit`: refuses requests whose headers (names and values) total more than the configured size with 431.

Each is also a set of functions, which the chat route (`chat_route.ChatRoute`, ahead of this stack) calls itself.
"""

from __future__ import annotations

import re
import secrets
import time

import orjson
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessiongate.gateway.errors import PayloadTooLarge, error_body
from sessiongate.gateway.observability.metrics import GatewayMetrics

__all__ = [
    "BodyLimit",
    "HeaderLimit",
    "RequestContext",
    "declared_body_too_large",
    "end_request",
    "headers_too_large",
    "limit_body",
    "refuse_body",
    "refuse_headers",
    "start_request",
]

log = structlog.get_logger("gateway.access")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = start_request(scope)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            end_request(self.metrics, scope, getattr(route, "path", None) or "unmatched", status, started)


def start_request(scope: Scope) -> str:
    """The request's id (the client's `x-request-id` when it is sane, else a new one), bound into the log context."""
    incoming = _header(scope, b"x-request-id")
    request_id = incoming if incoming and _REQUEST_ID.fullmatch(incoming) else secrets.token_hex(8)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    return request_id


def end_request(metrics: GatewayMetrics, scope: Scope, path: str, status: int, started: float) -> None:
    """The request counter and the access-log event of a request that ended with `status`."""
    metrics.count_request(path, status)
    log.info(
        "request",
        method=scope["method"],
        path=path,
        status=status,
        duration_ms=round((time.perf_counter() - started) * 1000, 2),
    )


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if declared_body_too_large(scope, self.max_bytes):
            await refuse_body(send, self.max_bytes)
            return
        await self.app(scope, limit_body(receive, self.max_bytes), send)


def declared_body_too_large(scope: Scope, max_bytes: int) -> bool:
    declared = _header(scope, b"content-length")
    return declared is not None and declared.isdigit() and int(declared) > max_bytes


def limit_body(receive: Receive, max_bytes: int) -> Receive:
    """`receive`, raising `PayloadTooLarge` once the body's bytes (a chunked body has no length up front) pass
    `max_bytes`."""
    seen = 0

    async def counting_receive() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > max_bytes:
                raise PayloadTooLarge(_body_message(max_bytes))
        return message

    return counting_receive


def _body_message(max_bytes: int) -> str:
    return f"The request body is larger than the limit of {max_bytes} bytes."


async def refuse_body(send: Send, max_bytes: int) -> None:
    body = orjson.dumps(error_body(_body_message(max_bytes), "invalid_request_error", code="request_too_large"))
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and headers_too_large(scope, self.max_bytes):
            await refuse_headers(send, self.max_bytes)
            return
        await self.app(scope, receive, send)


def headers_too_large(scope: Scope, max_bytes: int) -> bool:
    return sum(len(k) + len(v) for k, v in scope["headers"]) > max_bytes


async def refuse_headers(send: Send, max_bytes: int) -> None:
    message = f"The request headers are larger than the limit of {max_bytes} bytes."
    body = orjson.dumps(error_body(message, "invalid_request_error", code="headers_too_large"))
    await send(
        {
            "type": "http.response.start",
            "status": 431,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None

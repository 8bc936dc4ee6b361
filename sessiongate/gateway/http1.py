"""A minimal HTTP/1.1 client for the non-streamed chat turn: POST a JSON body, read the whole answer.

The non-streamed turn is the gateway's cheapest and most frequent request to a worker, and through
`aiohttp.ClientSession` its client side (request and response objects, header multidicts, timers, the connector's
bookkeeping) cost more CPU than the rest of the proxying around it (docs/benchmarks.md, "The gateway's cost per
turn"). It needs none of that: one request shape, to a handful of known workers, on kept-alive connections. Here the
request is written as bytes and the answer parsed by `httptools` (llhttp, which uvicorn uses for the gateway's own
requests). Streamed turns stay on aiohttp, which relays them as they arrive.

A connection idle longer than `keepalive_s` is dropped before SGLang's uvicorn would close it (its keep-alive is
5 s), so a request is not written into a connection the worker is closing. Any error, timeout or cancellation
closes the connection (which makes SGLang abort a request still running); only a complete answer that allows it
puts the connection back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["Http1Pool", "ProtocolError"]


class ProtocolError(Exception):
    """The worker's answer was not valid HTTP/1.1, or its connection closed before the answer was complete."""


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; `httptools` calls the `on_*` methods while parsing."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._answer: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._body: list[bytes] = []
        self._headers_done = False
        self._framed = False  # the answer's end is known from its headers (length or chunked)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def request(self, data: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Send a request; the future gets (status, body, whether the connection may be reused)."""
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._body = []
        self._headers_done = self._framed = False
        self.transport.write(data)
        return self._answer

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"malformed HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._answer is None or self._answer.done():
            return
        if self._headers_done and not self._framed and self._parser is not None:
            # No length and not chunked: the answer ends where the connection does.
            self._settle(self._parser.get_status_code(), keep_alive=False)
            return
        self._fail(ProtocolError("the connection closed before the answer was complete"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self._settle(self._parser.get_status_code(), keep_alive=self._parser.should_keep_alive())

    # the end of one request

    def _settle(self, status: int, *, keep_alive: bool) -> None:
        self._parser = None
        if self._answer is not None and not self._answer.done():
            self._answer.set_result((status, b"".join(self._body), keep_alive and not self.closed))
        self._body = []

    def _fail(self, error: Exception) -> None:
        self._parser = None
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Kept-alive connections per worker origin. `headers` go with every request (e.g. the workers' API key)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float = 4.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._keepalive_s = keepalive_s
        self._extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items())
        self._idle: dict[str, list[_Connection]] = {}
        self._origins: dict[str, tuple[str, int, bytes, bytes]] = {}

    async def post_json(self, url: str, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body` (JSON) to `url` + `path`: the answer's status and body. Raises `TimeoutError` (connecting or
        waiting for the answer), `OSError` (connecting, or the connection failing) or `ProtocolError`."""
        host, port, target, head = self._origin(url)
        data = b"".join(
            (
                b"POST ",
                target,
                path.encode(),
                head,
                self._extra,
                b"content-length: ",
                str(len(body)).encode(),
                b"\r\n\r\n",
                body,
            )
        )
        connection = self._take(url)
        if connection is None:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await asyncio.get_running_loop().create_connection(_Connection, host, port)
        try:
            async with asyncio.timeout(self._read_timeout_s):
                status, content, keep_alive = await connection.request(data)
        except BaseException:
            connection.close()
            raise
        if keep_alive:
            connection.idle_since = time.monotonic()
            self._idle.setdefault(url, []).append(connection)
        else:
            connection.close()
        return status, content

    def _origin(self, url: str) -> tuple[str, int, bytes, bytes]:
        origin = self._origins.get(url)
        if origin is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or parts.hostname is None:
                raise ValueError(f"the chat client speaks plain http only, not {url!r}")
            port = parts.port or 80
            head = (
                f" HTTP/1.1\r\nhost: {parts.hostname}:{port}\r\ncontent-type: application/json\r\n"
                "accept: application/json\r\n"
            ).encode("latin-1")
            # A worker URL may carry a path prefix, which the request's path follows.
            origin = self._origins[url] = (parts.hostname, port, parts.path.rstrip("/").encode(), head)
        return origin

    def _take(self, url: str) -> _Connection | None:
        """The most recently used idle connection to `url` that is still open and fresh; staler ones are closed."""
        idle = self._idle.get(url)
        if not idle:
            return None
        fresh_after = time.monotonic() - self._keepalive_s
        while idle:
            connection = idle.pop()
            if not connection.closed and connection.idle_since > fresh_after:
                return connection
            connection.close()
        return None

    async def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()

"""A minimal HTTP/1.1 client, the gateway's one transport for chat turns (streamed and not) and the load reports'
GET (polled several times a second): POST a JSON body, read the whole answer or relay it as it arrives.

A chat turn is the gateway's most frequent request to a worker, and through `httpx` or `aiohttp.ClientSession` the
client side (request and response objects, header multidicts, timers, the connector's bookkeeping) cost more CPU
than the rest of the proxying around it (docs/benchmarks.md, "The gateway's cost per turn"). It needs none of that:
one request shape, to a handful of known workers, on kept-alive connections. Here the request is written as bytes
and the answer parsed by `httptools` (llhttp, which uvicorn uses for the gateway's own requests). An https://
worker is reached over asyncio's TLS (`ssl_context`: the gateway's one context for its workers, built from
`SSL_CERT_FILE` / `SSL_CERT_DIR` else certifi's roots, as its `httpx` client's is).

A connection idle longer than `keepalive_s` is dropped before SGLang's uvicorn would close it (its keep-alive is
5 s), so a request is not written into a connection the worker is closing. Any error, timeout or cancellation
closes the connection (which makes SGLang abort a request still running); only a complete answer that allows it
puts the connection back.

The read timeout is the connection's own deadline, armed only while its reader waits: `asyncio.timeout` around every
wait cost an object, a timer and, on Python 3.11, three `getpid` system calls (`asyncio.get_running_loop` checks
for a fork), for every non-streamed turn and every read of a streamed one. Nor does arming it make a timer: the
connection keeps one, which checks the deadline when it fires and, when the deadline has moved on since, waits for
the rest; a new timer is made only for a deadline earlier than the pending one. A timer made and cancelled for each
request and for each read of a stream cost a handle, a heap push and the heap's clean-up every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["Http1Pool", "ProtocolError", "Stream"]

# How much of a streamed answer may wait for its reader before the worker's connection stops being read.
_STREAM_BUFFER_BYTES = 256 * 1024


class ProtocolError(Exception):
    """The worker's answer was not valid HTTP/1.1, or its connection closed before the answer was complete."""


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; `httptools` calls the `on_*` methods while parsing."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # the wait's deadline (loop time), while `_armed`
        self._timer_at = 0.0  # the pending timer's time
        self._armed = False
        self.closed = False
        self.idle_since = 0.0
        self._parser: httptools.HttpResponseParser | None = None
        self._body: list[bytes] = []
        self._headers_done = False
        self._framed = False  # the answer's end is known from its headers (length or chunked)
        # A whole answer: set when it is complete.
        self._answer: asyncio.Future[tuple[int, bytes, bool]] | None = None
        # A streamed answer: the status when the headers are in, then the body as `read()` takes it.
        self._head: asyncio.Future[int] | None = None
        self._complete = False
        self._keep_alive = False
        self._error: Exception | None = None
        self._wake: asyncio.Future[None] | None = None
        self._buffered = 0
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def _send(self, data: bytes) -> None:
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._body = []
        self._headers_done = self._framed = False
        self.transport.write(data)

    def request(self, data: bytes, timeout_s: float) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Send a request; the future gets (status, body, whether the connection may be reused), or `TimeoutError`
        when the whole answer is not in within `timeout_s`."""
        self._head = None
        self._answer = self._loop.create_future()
        self._arm(timeout_s)
        self._send(data)
        return self._answer

    def open_stream(self, data: bytes, timeout_s: float) -> asyncio.Future[int]:
        """Send a request whose answer is read as it arrives: the future gets its status once its headers are in
        (`TimeoutError` if they are not within `timeout_s`), then `read()` returns its body piece by piece."""
        self._answer = None
        self._head = self._loop.create_future()
        self._complete = self._keep_alive = False
        self._error = None
        self._buffered = 0
        self._arm(timeout_s)
        self._send(data)
        return self._head

    async def read(self, timeout_s: float) -> bytes:
        """The streamed body's bytes that arrived since the last call; b"" once the answer is complete. Raises
        `TimeoutError` when none came for `timeout_s`."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            self._wake = self._loop.create_future()
            self._arm(timeout_s)
            try:
                await self._wake
            finally:
                self._disarm()
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    @property
    def reusable(self) -> bool:
        """The streamed answer was read to its end and the connection may carry another request."""
        return self._complete and self._keep_alive and not self.closed and not self._body

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
        if self._parser is None:
            return
        if self._headers_done and not self._framed:
            # No length and not chunked: the answer ends where the connection does.
            self._message_done(keep_alive=False)
            return
        self._fail(ProtocolError("the connection closed before the answer was complete"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        if self._head is not None and not self._head.done():
            self._disarm()  # the body's reads arm their own
            assert self._parser is not None
            self._head.set_result(self._parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        if self._head is not None:
            self._buffered += len(body)
            # A client that reads slowly holds the worker back instead of filling the gateway's memory.
            if self._buffered > _STREAM_BUFFER_BYTES and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._wake_reader()

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self._message_done(keep_alive=self._parser.should_keep_alive())

    # the end of one request

    def _message_done(self, *, keep_alive: bool) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        self._parser = None
        self._disarm()
        keep_alive = keep_alive and not self.closed
        if self._head is not None:
            self._complete, self._keep_alive = True, keep_alive
            self._wake_reader()
        elif self._answer is not None and not self._answer.done():
            self._answer.set_result((status, b"".join(self._body), keep_alive))
            self._body = []

    def _fail(self, error: Exception) -> None:
        self._parser = None
        self._disarm()
        if self._head is not None:
            self._error = error
            if not self._head.done():
                self._head.set_exception(error)
            self._wake_reader()
        elif self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)

    def _wake_reader(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # the read timeout: one timer per connection, which checks the deadline when it fires (see the module's doc)

    def _arm(self, timeout_s: float) -> None:
        deadline = self._deadline = self._loop.time() + timeout_s
        self._armed = True
        if self._timer is None or deadline < self._timer_at:
            self._set_timer(deadline)

    def _set_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(at, self._check_deadline), at

    def _disarm(self) -> None:
        self._armed = False  # a timer still pending finds nothing to time out when it fires

    def _check_deadline(self) -> None:
        self._timer = None
        if not self._armed:
            return
        if self._deadline > self._timer_at:  # armed again since this timer was set: wait for the rest
            self._set_timer(self._deadline)
            return
        self._armed = False
        self._fail(TimeoutError("the worker sent nothing within the read timeout"))

    def close(self) -> None:
        self.closed = True
        self._armed = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


class Stream:
    """A streamed answer's body: each `read()` waits at most the read timeout for the worker's next bytes.

    `close()` ends it: the connection goes back to its pool when the answer was read to its end and allows it,
    else it is closed (which makes SGLang abort a request still running). Closing twice is harmless."""

    def __init__(self, pool: Http1Pool, url: str, connection: _Connection, read_timeout_s: float) -> None:
        self._pool = pool
        self._url = url
        self._connection: _Connection | None = connection
        self._read_timeout_s = read_timeout_s

    async def read(self) -> bytes:
        """The bytes that arrived since the last read, b"" at the end."""
        connection = self._connection
        if connection is None:
            raise ProtocolError("the stream is closed")
        return await connection.read(self._read_timeout_s)

    async def read_all(self) -> bytes:
        parts = []
        while data := await self.read():
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool._put_back(self._url, connection, connection.reusable)


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a worker URL's requests go, and their first bytes (request target prefix, `host` header)."""

    host: str
    port: int
    tls: bool
    target: bytes
    head: bytes


_JSON = b"accept: application/json\r\n"
_EVENT_STREAM = b"accept: text/event-stream\r\n"


class Http1Pool:
    """Kept-alive connections per worker origin. `headers` go with every request (e.g. the workers' API key);
    `ssl_context` verifies https:// workers (default: `ssl.create_default_context()`, made on first use)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float = 4.0,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context
        self._read_timeout_s = read_timeout_s
        self._keepalive_s = keepalive_s
        self._extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items())
        self._idle: dict[str, list[_Connection]] = {}
        self._origins: dict[str, _Origin] = {}

    async def post_json(self, url: str, path: str, body: bytes, *, extra: bytes = b"") -> tuple[int, bytes]:
        """POST `body` (JSON) to `url` + `path`: the answer's status and body. Raises `TimeoutError` (connecting or
        waiting for the answer), `OSError` (connecting, or the connection failing) or `ProtocolError`. `extra`:
        more header lines for this request alone (`name: value\r\n` each, e.g. a `traceparent`)."""
        return await self._exchange(url, self._request(url, path, body, _JSON, extra=extra), self._read_timeout_s)

    async def get_json(self, url: str, path: str, *, timeout_s: float) -> tuple[int, bytes]:
        """GET `url` + `path` (a small JSON answer, such as a worker's load report) within `timeout_s`: its status and
        body. Raises as `post_json` does."""
        return await self._exchange(url, self._request(url, path, b"", _JSON, b"GET "), timeout_s)

    async def _exchange(self, url: str, request: bytes, timeout_s: float) -> tuple[int, bytes]:
        """Send `request` on a connection to `url` and read the whole answer; the connection goes back to the pool
        only after a complete answer that allows it."""
        connection = await self._connection(url)
        try:
            status, content, keep_alive = await connection.request(request, timeout_s)
        except BaseException:
            connection.close()
            raise
        self._put_back(url, connection, keep_alive)
        return status, content

    async def open_stream(self, url: str, path: str, body: bytes, *, extra: bytes = b"") -> tuple[int, Stream]:
        """POST `body` (JSON) and read the answer as it arrives: its status, and a `Stream` of its body, which the
        caller closes (`Stream.close`). Raises as `post_json` does, from here or from the stream's reads. `extra`:
        as for `post_json`."""
        connection = await self._connection(url)
        try:
            request = self._request(url, path, body, _EVENT_STREAM, extra=extra)
            status = await connection.open_stream(request, self._read_timeout_s)
        except BaseException:
            connection.close()
            raise
        return status, Stream(self, url, connection, self._read_timeout_s)

    @contextlib.asynccontextmanager
    async def stream_json(
        self, url: str, path: str, body: bytes, *, extra: bytes = b""
    ) -> AsyncIterator[tuple[int, Stream]]:
        """`open_stream` as a context manager: leaving it closes the stream (before the end: the connection)."""
        status, stream = await self.open_stream(url, path, body, extra=extra)
        try:
            yield status, stream
        finally:
            stream.close()

    def _request(
        self, url: str, path: str, body: bytes, accept: bytes, method: bytes = b"POST ", *, extra: bytes = b""
    ) -> bytes:
        origin = self._origin(url)
        target, head = origin.target, origin.head
        length = str(len(body)).encode()
        return b"".join(
            (
                method,
                target,
                path.encode(),
                head,
                accept,
                self._extra,
                extra,
                b"content-length: ",
                length,
                b"\r\n\r\n",
                body,
            )
        )

    async def _connection(self, url: str) -> _Connection:
        connection = self._take(url)
        if connection is None:
            origin = self._origin(url)
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self._connect_timeout_s):  # the TLS handshake included
                if origin.tls:
                    _, connection = await loop.create_connection(
                        _Connection, origin.host, origin.port, ssl=self._tls(), server_hostname=origin.host
                    )
                else:
                    _, connection = await loop.create_connection(_Connection, origin.host, origin.port)
        return connection

    def _tls(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def _put_back(self, url: str, connection: _Connection, reusable: bool) -> None:
        if reusable:
            connection.idle_since = time.monotonic()
            self._idle.setdefault(url, []).append(connection)
        else:
            connection.close()

    def _origin(self, url: str) -> _Origin:
        origin = self._origins.get(url)
        if origin is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or parts.hostname is None:
                raise ValueError(f"the chat client speaks http and https only, not {url!r}")
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 address
            head = f" HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n".encode("latin-1")
            # A worker URL may carry a path prefix, which the request's path follows.
            origin = self._origins[url] = _Origin(parts.hostname, port, tls, parts.path.rstrip("/").encode(), head)
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

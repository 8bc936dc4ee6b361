"""Calling SGLang workers over HTTP, with every transport failure translated here and nowhere else.

One shared `httpx.AsyncClient` (opened in the lifespan) carries the control traffic (health, load reports, the
extension's endpoints). By default it runs over the aiohttp transport; tests inject an ASGI transport instead.
The chat turns themselves, the gateway's hot path, go over `http1.Http1Pool` (a minimal HTTP/1.1 client) when
there is no injected transport, and to an https:// worker over one shared `aiohttp.ClientSession`: httpx's request
and response models, and then aiohttp's, cost more CPU per turn than the rest of the proxying (docs/benchmarks.md,
"The gateway's cost per turn"), and a chat turn needs none of what they add.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx
import orjson

from .errors import UpstreamError, WorkerRejected, WorkerTimeout, WorkerUnreachable
from .http1 import Http1Pool, ProtocolError, Stream

__all__ = ["WorkerClient", "make_chat_pool", "make_chat_session", "make_http_client"]

_JSON = {"content-type": "application/json"}
_JSON_STREAM = {"content-type": "application/json", "accept": "text/event-stream"}


def _with_trace(headers: dict[str, str], traceparent: str | None) -> dict[str, str]:
    """`headers` with the turn's `traceparent` when tracing gave it one (the shared dict otherwise, uncopied)."""
    return headers if traceparent is None else {**headers, "traceparent": traceparent}


def _trace_line(traceparent: str | None) -> bytes:
    """The `traceparent` header line for `http1`, or nothing."""
    return b"" if traceparent is None else b"traceparent: " + traceparent.encode("latin-1") + b"\r\n"


def _auth_headers(worker_api_key: str) -> dict[str, str] | None:
    """The workers' `--api-key` as every client of the gateway sends it (none: no header)."""
    return {"Authorization": f"Bearer {worker_api_key}"} if worker_api_key else None


def make_http_client(
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    fast: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
    worker_api_key: str = "",
) -> httpx.AsyncClient:
    """The gateway's shared client; `transport` is the test seam.

    `worker_api_key`: the workers' `--api-key`, sent as `Authorization: Bearer` on every call through this client
    (generation, health, load reports, the extension's endpoints); the client talks to workers only.
    """
    timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s)
    # Idle upstream connections are dropped before SGLang's uvicorn closes them (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s):
    # a request sent on a connection the worker is closing fails with a reset instead of being served.
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=4.0)
    if transport is None and fast:
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits)
    headers = _auth_headers(worker_api_key)
    return httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport, headers=headers)


def make_chat_session(
    *, connect_timeout_s: float, read_timeout_s: float, worker_api_key: str = ""
) -> aiohttp.ClientSession:
    """The hot path's session: `read_timeout_s` bounds each wait for the worker's next bytes (a non-streamed answer
    as a whole, a stream between two chunks); idle connections go before SGLang's keep-alive closes them.
    `worker_api_key` is sent as `make_http_client` sends it: generation goes through here, not through httpx."""
    connector = aiohttp.TCPConnector(limit=1024, keepalive_timeout=4.0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
    # No cookie jar (workers set none) and no automatic decompression checks beyond aiohttp's defaults.
    headers = _auth_headers(worker_api_key)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        headers=headers,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    )


def make_chat_pool(*, connect_timeout_s: float, read_timeout_s: float, worker_api_key: str = "") -> Http1Pool:
    """The non-streamed turns' connections (`http1`): the same timeouts, keep-alive and key as the session's."""
    headers = _auth_headers(worker_api_key)
    return Http1Pool(
        connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s, keepalive_s=4.0, headers=headers
    )


def _transport_error(exc: BaseException, worker_id: str, *, started: bool = False) -> UpstreamError:
    """A failure of the chat path's own clients (aiohttp, `http1`) as the gateway's error."""
    where = "mid-stream" if started else "before answering"
    if isinstance(exc, TimeoutError):
        what = "went silent mid-stream" if started else "timed out before answering"
        return WorkerTimeout(f"Worker {worker_id} {what}.", worker=worker_id)
    return WorkerUnreachable(f"Worker {worker_id} failed {where}: {type(exc).__name__}.", worker=worker_id)


def _timed_out(exc: BaseException) -> bool:
    """Whether a transport error was a timeout.

    httpx-aiohttp maps every aiohttp connection error to `httpx.ConnectTimeout`, refused connections included,
    so the aiohttp cause decides where there is one.
    """
    cause = exc.__cause__
    if cause is not None and type(cause).__module__.startswith("aiohttp"):
        return isinstance(cause, TimeoutError)
    return isinstance(exc, httpx.TimeoutException)


def translate(exc: httpx.HTTPError, worker_id: str, *, started: bool = False) -> UpstreamError:
    """Map a transport error to the gateway's error tree. `started`: bytes were already relayed."""
    where = "mid-stream" if started else "before answering"
    if _timed_out(exc):
        return WorkerTimeout(f"Worker {worker_id} timed out {where}.", worker=worker_id)
    return WorkerUnreachable(f"Worker {worker_id} failed {where}: {type(exc).__name__}.", worker=worker_id)


def _decode_error(response_body: bytes) -> Mapping[str, Any]:
    try:
        data = orjson.loads(response_body)
    except orjson.JSONDecodeError:
        return {"message": response_body[:500].decode("utf-8", "replace")}
    return data if isinstance(data, dict) else {"message": str(data)}


class WorkerClient:
    """SGLang's HTTP API, as the gateway uses it. Chat turns go over `chat_session` when there is one (production),
    else over `client` (tests, whose client carries an ASGI transport); non-streamed ones to an http:// worker over
    `chat_pool` when there is one (production)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        read_timeout_s: float,
        chat_session: aiohttp.ClientSession | None = None,
        chat_pool: Http1Pool | None = None,
    ) -> None:
        self._client = client
        self._chat_session = chat_session
        self._chat_pool = chat_pool
        # Enforced here as well as by the transport, so that any transport (tests use ASGI) honours it.
        self._read_timeout_s = read_timeout_s

    async def chat(
        self, worker_id: str, url: str, body: Mapping[str, Any], *, traceparent: str | None = None
    ) -> dict[str, Any]:
        """A non-streamed chat completion; the parsed JSON answer. `traceparent`: the W3C trace context header the
        request carries to the worker (tracing on)."""
        if self._chat_pool is not None and url.startswith("http://"):
            return await self._chat_pooled(self._chat_pool, worker_id, url, body, traceparent)
        if self._chat_session is not None:
            return await self._chat_direct(self._chat_session, worker_id, url, body, traceparent)
        try:
            async with asyncio.timeout(self._read_timeout_s):
                response = await self._client.post(
                    f"{url}/v1/chat/completions",
                    content=orjson.dumps(body),
                    headers=_with_trace(_JSON, traceparent),
                )
                content = await response.aread()
        except TimeoutError as exc:
            raise WorkerTimeout(f"Worker {worker_id} timed out before answering.", worker=worker_id) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, worker_id) from exc
        return _answer(response.status_code, content, worker_id)

    async def _chat_direct(
        self,
        session: aiohttp.ClientSession,
        worker_id: str,
        url: str,
        body: Mapping[str, Any],
        traceparent: str | None,
    ) -> dict[str, Any]:
        headers = _with_trace(_JSON, traceparent)
        try:
            async with session.post(f"{url}/v1/chat/completions", data=orjson.dumps(body), headers=headers) as response:
                content = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(exc, worker_id) from exc
        return _answer(status, content, worker_id)

    async def _chat_pooled(
        self, pool: Http1Pool, worker_id: str, url: str, body: Mapping[str, Any], traceparent: str | None
    ) -> dict[str, Any]:
        try:
            status, content = await pool.post_json(
                url, "/v1/chat/completions", orjson.dumps(body), extra=_trace_line(traceparent)
            )
        except (TimeoutError, OSError, ProtocolError) as exc:
            raise _transport_error(exc, worker_id) from exc
        return _answer(status, content, worker_id)

    @contextlib.asynccontextmanager
    async def chat_stream(
        self, worker_id: str, url: str, body: Mapping[str, Any], *, traceparent: str | None = None
    ) -> AsyncIterator[AsyncIterator[list[bytes]]]:
        """Open a streamed chat completion; yields an iterator over its non-empty SSE lines, in the groups that
        arrived together (so that the relay writes them to the client together: one write per network read).
        `traceparent`: as for `chat`.

        Errors before the first byte raise from the `async with`; later ones raise from the iterator.
        """
        if self._chat_pool is not None and url.startswith("http://"):
            async with self._stream_pooled(self._chat_pool, worker_id, url, body, traceparent) as lines:
                yield lines
            return
        if self._chat_session is not None:
            async with self._stream_direct(self._chat_session, worker_id, url, body, traceparent) as lines:
                yield lines
            return
        request = self._client.build_request(
            "POST",
            f"{url}/v1/chat/completions",
            content=orjson.dumps(body),
            headers=_with_trace(_JSON_STREAM, traceparent),
        )
        try:
            async with asyncio.timeout(self._read_timeout_s):
                response = await self._client.send(request, stream=True)
        except TimeoutError as exc:
            raise WorkerTimeout(f"Worker {worker_id} timed out before answering.", worker=worker_id) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, worker_id) from exc
        try:
            if response.status_code != 200:
                raise WorkerRejected(response.status_code, _decode_error(await response.aread()), worker=worker_id)
            yield self._lines(response, worker_id)
        finally:
            await response.aclose()

    @contextlib.asynccontextmanager
    async def _stream_pooled(
        self, pool: Http1Pool, worker_id: str, url: str, body: Mapping[str, Any], traceparent: str | None
    ) -> AsyncIterator[AsyncIterator[list[bytes]]]:
        async with contextlib.AsyncExitStack() as stack:
            try:
                status, stream = await stack.enter_async_context(
                    pool.stream_json(url, "/v1/chat/completions", orjson.dumps(body), extra=_trace_line(traceparent))
                )
            except (TimeoutError, OSError, ProtocolError) as exc:
                raise _transport_error(exc, worker_id) from exc
            if status != 200:
                try:
                    content = await stream.read_all()
                except (TimeoutError, OSError, ProtocolError) as exc:
                    raise _transport_error(exc, worker_id) from exc
                raise WorkerRejected(status, _decode_error(content), worker=worker_id)
            yield _pooled_lines(stream, worker_id)

    @contextlib.asynccontextmanager
    async def _stream_direct(
        self,
        session: aiohttp.ClientSession,
        worker_id: str,
        url: str,
        body: Mapping[str, Any],
        traceparent: str | None,
    ) -> AsyncIterator[AsyncIterator[list[bytes]]]:
        headers = _with_trace(_JSON_STREAM, traceparent)
        try:
            response = await session.post(f"{url}/v1/chat/completions", data=orjson.dumps(body), headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(exc, worker_id) from exc
        try:
            if response.status != 200:
                try:
                    content = await response.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise _transport_error(exc, worker_id) from exc
                raise WorkerRejected(response.status, _decode_error(content), worker=worker_id)
            yield _direct_lines(response, worker_id)
        finally:
            if response.content.at_eof():
                response.release()  # read to the end: the connection goes back to the pool
            else:
                response.close()  # left mid-stream: closing the connection makes SGLang abort the request

    async def _lines(self, response: httpx.Response, worker_id: str) -> AsyncIterator[list[bytes]]:
        lines = response.aiter_lines()
        try:
            while True:
                async with asyncio.timeout(self._read_timeout_s):
                    line = await anext(lines, None)
                if line is None:
                    return
                if line:
                    yield [line.encode()]
        except TimeoutError as exc:
            raise WorkerTimeout(f"Worker {worker_id} went silent mid-stream.", worker=worker_id) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, worker_id, started=True) from exc

    async def models(self, url: str) -> list[dict[str, Any]]:
        response = await self._client.get(f"{url}/v1/models")
        response.raise_for_status()
        data = response.json().get("data", [])
        return [m for m in data if isinstance(m, dict)]


def _answer(status: int, content: bytes, worker_id: str) -> dict[str, Any]:
    if status != 200:
        raise WorkerRejected(status, _decode_error(content), worker=worker_id)
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise WorkerUnreachable(f"Worker {worker_id} sent a malformed answer.", worker=worker_id) from exc
    if not isinstance(answer, dict):
        raise WorkerUnreachable(f"Worker {worker_id} sent a malformed answer.", worker=worker_id)
    return answer


async def _line_groups(reads: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """The stream's non-empty lines, grouped by the network read that completed them."""
    partial = b""
    async for data in reads:
        *complete, partial = (partial + data).split(b"\n")
        lines = [line.rstrip(b"\r") for line in complete if line.strip(b"\r")]
        if lines:
            yield lines
    if partial.strip(b"\r"):
        yield [partial.rstrip(b"\r")]


async def _reads(stream: Stream) -> AsyncIterator[bytes]:
    while data := await stream.read():
        yield data


async def _pooled_lines(stream: Stream, worker_id: str) -> AsyncIterator[list[bytes]]:
    """`_line_groups` of the pool's stream; the stream's read timeout bounds the wait for each read."""
    try:
        async for lines in _line_groups(_reads(stream)):
            yield lines
    except (TimeoutError, OSError, ProtocolError) as exc:
        raise _transport_error(exc, worker_id, started=True) from exc


async def _direct_lines(response: aiohttp.ClientResponse, worker_id: str) -> AsyncIterator[list[bytes]]:
    """`_line_groups` of the aiohttp response; the session's read timeout bounds the wait for each read."""
    try:
        async for lines in _line_groups(response.content.iter_any()):
            yield lines
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _transport_error(exc, worker_id, started=True) from exc

"""Calling SGLang workers over HTTP, with every transport failure translated here and nowhere else.

One shared `httpx.AsyncClient` (opened in the lifespan, over the aiohttp transport) carries the control traffic
(health, the extension's endpoints). The chat turns themselves, streamed and not, the gateway's hot path, go over
`http1.Http1Pool` (a minimal HTTP/1.1 client; TLS for https:// workers) and nothing else: httpx's request and
response models, and aiohttp's, cost more CPU per turn than the rest of the proxying (docs/benchmarks.md, "The
gateway's cost per turn"), and a chat turn needs none of what they add. Both verify https:// workers with one
`ssl.SSLContext` (`worker_ssl_context`).

A transport failure becomes the gateway's error through one table, `_TRANSPORT_ERRORS` (as httpx's transport maps
httpcore's exceptions in one dict), whatever client raised it:

    TimeoutError, httpx.TimeoutException   WorkerTimeout       504
    ssl.SSLCertVerificationError            WorkerUnreachable   502 (the certificate's fault named)
    OSError, ProtocolError, httpx.HTTPError WorkerUnreachable   502
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from sessiongate.gateway.errors import UpstreamError, WorkerRejected, WorkerTimeout, WorkerUnreachable

from .http1 import Http1Pool, ProtocolError, Stream

__all__ = [
    "TRANSPORT_ERRORS",
    "SSELines",
    "WorkerClient",
    "make_chat_pool",
    "make_http_client",
    "translate",
    "worker_ssl_context",
]


def _trace_line(traceparent: str | None) -> bytes:
    """The `traceparent` header line for `http1`, or nothing."""
    return b"" if traceparent is None else b"traceparent: " + traceparent.encode("latin-1") + b"\r\n"


def _auth_headers(worker_api_key: str) -> dict[str, str] | None:
    """The workers' `--api-key` as every client of the gateway sends it (none: no header)."""
    return {"Authorization": f"Bearer {worker_api_key}"} if worker_api_key else None


def worker_ssl_context() -> ssl.SSLContext:
    """How the gateway verifies https:// workers, for its chat turns and its control traffic alike: httpx's default
    (the CA bundle in `SSL_CERT_FILE` or the directory in `SSL_CERT_DIR`, else certifi's roots). Reads files: build it
    once, at start-up."""
    return httpx.create_ssl_context()


def make_http_client(
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    fast: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
    worker_api_key: str = "",
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.AsyncClient:
    """The gateway's shared client; `transport` is the test seam.

    `worker_api_key`: the workers' `--api-key`, sent as `Authorization: Bearer` on every call through this client
    (health, load reports, the extension's endpoints); the client talks to workers only. `ssl_context`: as
    `worker_ssl_context`'s (the default).
    """
    timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s)
    # Idle upstream connections are dropped before SGLang's uvicorn closes them (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s):
    # a request sent on a connection the worker is closing fails with a reset instead of being served.
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=4.0)
    verify: ssl.SSLContext | bool = True if ssl_context is None else ssl_context
    if transport is None and fast:
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits, verify=verify)
    headers = _auth_headers(worker_api_key)
    return httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport, headers=headers, verify=verify)


def make_chat_pool(
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    worker_api_key: str = "",
    ssl_context: ssl.SSLContext | None = None,
) -> Http1Pool:
    """The chat turns' connections (`http1`): the timeouts and key of the shared client, keep-alive shorter than
    SGLang's, and `ssl_context` (as `worker_ssl_context`'s, the default) for https:// workers."""
    return Http1Pool(
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        keepalive_s=4.0,
        headers=_auth_headers(worker_api_key),
        ssl_context=worker_ssl_context() if ssl_context is None else ssl_context,
    )


# What a transport failure means, for the client: the first row whose type matches decides. Each message is said
# of the worker ("Worker w-1 ..."), before its answer began or once bytes were relayed (`started`).
_TRANSPORT_ERRORS: tuple[tuple[type[BaseException], type[UpstreamError], str, str], ...] = (
    (TimeoutError, WorkerTimeout, "timed out before answering", "went silent mid-stream"),
    (httpx.TimeoutException, WorkerTimeout, "timed out before answering", "went silent mid-stream"),
    (
        ssl.SSLCertVerificationError,
        WorkerUnreachable,
        "failed before answering: its TLS certificate was not accepted ({detail})",
        "failed mid-stream: its TLS certificate was not accepted ({detail})",
    ),
    (OSError, WorkerUnreachable, "failed before answering: {name}", "failed mid-stream: {name}"),
    (ProtocolError, WorkerUnreachable, "failed before answering: {name}", "failed mid-stream: {name}"),
    (httpx.HTTPError, WorkerUnreachable, "failed before answering: {name}", "failed mid-stream: {name}"),
)

_OTHER = _TRANSPORT_ERRORS[-1]

# The exceptions `translate` knows: what every call to a worker catches.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = tuple(row[0] for row in _TRANSPORT_ERRORS)


def _cause(exc: BaseException) -> BaseException:
    """The failure that decides the row. httpx-aiohttp maps every aiohttp connection error to
    `httpx.ConnectTimeout`, refused connections and TLS failures included, so the aiohttp cause (or the `OSError`
    under it) decides where there is one."""
    cause = exc.__cause__
    if isinstance(exc, httpx.HTTPError) and cause is not None and type(cause).__module__.startswith("aiohttp"):
        if isinstance(cause, TimeoutError):
            return cause
        inner = getattr(cause, "certificate_error", None) or getattr(cause, "os_error", None) or cause.__cause__
        return inner if isinstance(inner, OSError) else ConnectionError(type(exc).__name__)
    return exc


def translate(exc: BaseException, worker_id: str, *, started: bool = False) -> UpstreamError:
    """Map a transport error (one of `TRANSPORT_ERRORS`) to the gateway's error tree. `started`: bytes were already
    relayed."""
    decisive = _cause(exc)
    _, error, before, during = next((row for row in _TRANSPORT_ERRORS if isinstance(decisive, row[0])), _OTHER)
    detail = getattr(decisive, "verify_message", None) or str(decisive)
    what = (during if started else before).format(name=type(exc).__name__, detail=detail)
    return error(f"Worker {worker_id} {what}.", worker=worker_id)


def _decode_error(response_body: bytes) -> Mapping[str, Any]:
    try:
        data = orjson.loads(response_body)
    except orjson.JSONDecodeError:
        return {"message": response_body[:500].decode("utf-8", "replace")}
    return data if isinstance(data, dict) else {"message": str(data)}


class WorkerClient:
    """SGLang's HTTP API, as the gateway uses it: chat turns over `chat_pool` (`http1`), the rest over `client`."""

    def __init__(self, client: httpx.AsyncClient, *, chat_pool: Http1Pool) -> None:
        self._client = client
        self._chat_pool = chat_pool

    async def chat(
        self, worker_id: str, url: str, body: Mapping[str, Any], *, traceparent: str | None = None
    ) -> dict[str, Any]:
        """A non-streamed chat completion; the parsed JSON answer. `traceparent`: the W3C trace context header the
        request carries to the worker (tracing on)."""
        try:
            status, content = await self._chat_pool.post_json(
                url, "/v1/chat/completions", orjson.dumps(body), extra=_trace_line(traceparent)
            )
        except TRANSPORT_ERRORS as exc:
            raise translate(exc, worker_id) from exc
        return _answer(status, content, worker_id)

    async def open_stream(
        self, worker_id: str, url: str, body: Mapping[str, Any], *, traceparent: str | None = None
    ) -> SSELines:
        """Open a streamed chat completion: its non-empty SSE lines, in the groups that arrived together (so that
        the relay writes them to the client together: one write per network read). The caller closes them
        (`SSELines.close`). `traceparent`: as for `chat`.

        Errors before the first byte raise from here; later ones from the iteration.
        """
        try:
            status, stream = await self._chat_pool.open_stream(
                url, "/v1/chat/completions", orjson.dumps(body), extra=_trace_line(traceparent)
            )
        except TRANSPORT_ERRORS as exc:
            raise translate(exc, worker_id) from exc
        if status != 200:
            try:
                error = _decode_error(await stream.read_all())
            except TRANSPORT_ERRORS as exc:
                raise translate(exc, worker_id) from exc
            finally:
                stream.close()
            raise WorkerRejected(status, error, worker=worker_id)
        return SSELines(stream, worker_id)

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


class SSELines:
    """A streamed answer's non-empty lines, grouped by the network read that completed them; a transport failure
    mid-stream raises as the gateway's error (`translate`, `started`).

    An iterator object, not an async generator: the relay stops reading at `[DONE]`, and an async generator left
    unfinished is closed by the event loop's finaliser hook, through `call_soon_threadsafe` (a write to the loop's
    wake-up pipe and its read, two system calls a streamed turn) and one more task step per generator."""

    __slots__ = ("_ended", "_partial", "_stream", "_worker_id")

    def __init__(self, stream: Stream, worker_id: str) -> None:
        self._stream = stream
        self._worker_id = worker_id
        self._partial = b""
        self._ended = False

    def __aiter__(self) -> SSELines:
        return self

    async def __anext__(self) -> list[bytes]:
        while not self._ended:
            try:
                data = await self._stream.read()
            except TRANSPORT_ERRORS as exc:
                raise translate(exc, self._worker_id, started=True) from exc
            if not data:
                self._ended = True
                tail = self._partial.rstrip(b"\r")
                if tail:
                    return [tail]
                break
            *complete, self._partial = (self._partial + data).split(b"\n")
            lines = [line.rstrip(b"\r") for line in complete if line.strip(b"\r")]
            if lines:
                return lines
        raise StopAsyncIteration

    def close(self) -> None:
        """Give the connection back (read to its end) or close it (which makes SGLang abort the request)."""
        self._stream.close()

"""Calling SGLang workers over HTTP, with every transport failure translated here and nowhere else.

One shared `httpx.AsyncClient` (opened in the lifespan) carries all traffic. By default it runs over the
aiohttp transport, which costs several times less CPU per request than httpx's own (see
docs/gateway-performance.md); tests inject an ASGI transport instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson

from .errors import UpstreamError, WorkerRejected, WorkerTimeout, WorkerUnreachable

__all__ = ["WorkerClient", "make_http_client"]


def make_http_client(
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
    fast: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """The gateway's shared client; `transport` is the test seam."""
    timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s)
    # Idle upstream connections are dropped before SGLang's uvicorn closes them (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s):
    # a request sent on a connection the worker is closing fails with a reset instead of being served.
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=4.0)
    if transport is None and fast:
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits)
    return httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)


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
    """SGLang's HTTP API, as the gateway uses it."""

    def __init__(self, client: httpx.AsyncClient, *, read_timeout_s: float) -> None:
        self._client = client
        # Enforced here as well as by the transport, so that any transport (tests use ASGI) honours it.
        self._read_timeout_s = read_timeout_s

    async def chat(self, worker_id: str, url: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A non-streamed chat completion; the parsed JSON answer."""
        try:
            async with asyncio.timeout(self._read_timeout_s):
                response = await self._client.post(
                    f"{url}/v1/chat/completions",
                    content=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                )
                content = await response.aread()
        except TimeoutError as exc:
            raise WorkerTimeout(f"Worker {worker_id} timed out before answering.", worker=worker_id) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, worker_id) from exc
        if response.status_code != 200:
            raise WorkerRejected(response.status_code, _decode_error(content), worker=worker_id)
        try:
            answer = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise WorkerUnreachable(f"Worker {worker_id} sent a malformed answer.", worker=worker_id) from exc
        if not isinstance(answer, dict):
            raise WorkerUnreachable(f"Worker {worker_id} sent a malformed answer.", worker=worker_id)
        return answer

    @contextlib.asynccontextmanager
    async def chat_stream(self, worker_id: str, url: str, body: Mapping[str, Any]) -> AsyncIterator[AsyncIterator[str]]:
        """Open a streamed chat completion; yields an iterator over its SSE lines.

        Errors before the first byte raise from the `async with`; later ones raise from the iterator.
        """
        request = self._client.build_request(
            "POST",
            f"{url}/v1/chat/completions",
            content=orjson.dumps(body),
            headers={"content-type": "application/json", "accept": "text/event-stream"},
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

    async def _lines(self, response: httpx.Response, worker_id: str) -> AsyncIterator[str]:
        lines = response.aiter_lines()
        try:
            while True:
                async with asyncio.timeout(self._read_timeout_s):
                    line = await anext(lines, None)
                if line is None:
                    return
                if line:
                    yield line
        except TimeoutError as exc:
            raise WorkerTimeout(f"Worker {worker_id} went silent mid-stream.", worker=worker_id) from exc
        except httpx.HTTPError as exc:
            raise translate(exc, worker_id, started=True) from exc

    async def models(self, url: str) -> list[dict[str, Any]]:
        response = await self._client.get(f"{url}/v1/models")
        response.raise_for_status()
        data = response.json().get("data", [])
        return [m for m in data if isinstance(m, dict)]

"""The two clients, `SessionGate` and `AsyncSessionGate`: the I/O edge of the SDK.

Everything but sending, sleeping and closing is inherited from `BaseClient` or done by pure helpers, so the
two classes differ only in `await`. Injection seams, as in httpx: `transport=` (for example
`httpx.MockTransport`) or a whole `http_client=`, and `sleep=` for the wait between retries.

    with SessionGate() as client:
        session = client.sessions.create()
        print(session.chat([{"role": "user", "content": "hi"}]).content)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx

from ._admin import Admin, AsyncAdmin
from ._base import BaseClient, RequestOptions, parse_response
from ._constants import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from ._exceptions import connection_error_from, status_error_from_response
from ._resources import AsyncChat, AsyncSessions, Chat, Sessions

__all__ = ["AsyncSessionGate", "SessionGate"]

T = TypeVar("T")


class SessionGate(BaseClient):
    """Synchronous client. `base_url`: kwarg > `SESSIONGATE_BASE_URL` > http://127.0.0.1:8000;
    `api_key`: kwarg > `SESSIONGATE_API_KEY` > none (sent as `Authorization: Bearer ...`);
    `admin_key` (for `client.admin` only): kwarg > `SESSIONGATE_ADMIN_KEY` > none."""

    sessions: Sessions
    chat: Chat
    admin: Admin
    _client: httpx.Client

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        admin_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
        default_headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            admin_key=admin_key,
        )
        if http_client is not None and transport is not None:
            raise ValueError("pass either http_client or transport, not both")
        self._owns_client = http_client is None
        self._client = http_client or httpx.Client(transport=transport, timeout=self.timeout)
        self._sleep = sleep or time.sleep
        self.sessions = Sessions(self)
        self.chat = Chat(self)
        self.admin = Admin(self)

    def _request(self, options: RequestOptions) -> httpx.Response:
        """Send with retries; returns a 2xx response (still open and unread when `options.stream`)."""
        retries_taken = 0
        while True:
            request = self._build_request(options)
            try:
                response = self._client.send(request, stream=options.stream)
            except httpx.TransportError as exc:
                delay = self._connection_retry_delay(retries_taken)
                if delay is None:
                    raise connection_error_from(exc, request) from exc
            else:
                if response.is_success:
                    return response
                response.read()
                response.close()
                delay = self._status_retry_delay(response, retries_taken)
                if delay is None:
                    raise status_error_from_response(response)
            self._sleep(delay)
            retries_taken += 1

    def _request_parsed(self, options: RequestOptions, parser: Callable[[Any], T]) -> T:
        return parse_response(self._request(options), parser)

    def close(self) -> None:
        """Close the underlying HTTP client, unless it was passed in by the caller."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> SessionGate:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncSessionGate(BaseClient):
    """Asynchronous client; the same settings and resources as `SessionGate`, awaited.

    `sleep` defaults to `asyncio.sleep`; under trio pass `sleep=trio.sleep`."""

    sessions: AsyncSessions
    chat: AsyncChat
    admin: AsyncAdmin
    _client: httpx.AsyncClient

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        admin_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        default_headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=default_headers,
            admin_key=admin_key,
        )
        if http_client is not None and transport is not None:
            raise ValueError("pass either http_client or transport, not both")
        self._owns_client = http_client is None
        self._client = http_client or httpx.AsyncClient(transport=transport, timeout=self.timeout)
        self._sleep = sleep or asyncio.sleep
        self.sessions = AsyncSessions(self)
        self.chat = AsyncChat(self)
        self.admin = AsyncAdmin(self)

    async def _request(self, options: RequestOptions) -> httpx.Response:
        """Send with retries; returns a 2xx response (still open and unread when `options.stream`)."""
        retries_taken = 0
        while True:
            request = self._build_request(options)
            try:
                response = await self._client.send(request, stream=options.stream)
            except httpx.TransportError as exc:
                delay = self._connection_retry_delay(retries_taken)
                if delay is None:
                    raise connection_error_from(exc, request) from exc
            else:
                if response.is_success:
                    return response
                await response.aread()
                await response.aclose()
                delay = self._status_retry_delay(response, retries_taken)
                if delay is None:
                    raise status_error_from_response(response)
            await self._sleep(delay)
            retries_taken += 1

    async def _request_parsed(self, options: RequestOptions, parser: Callable[[Any], T]) -> T:
        return parse_response(await self._request(options), parser)

    async def close(self) -> None:
        """Close the underlying HTTP client, unless it was passed in by the caller."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncSessionGate:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

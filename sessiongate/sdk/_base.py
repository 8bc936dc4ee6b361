"""What the sync and async clients share: settings, request building, retry decisions, error mapping, parsing.

`BaseClient` resolves its settings once (keyword argument > `SESSIONGATE_*` environment variable > default)
and turns a `RequestOptions` into an `httpx.Request`. The retry loop itself is the only I/O and lives in
`_client.py`, written once for `httpx.Client` and once for `httpx.AsyncClient`; every decision it makes
(retry or not, how long to wait, which exception to raise) is a method or function here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from ._constants import ADMIN_KEY_ENV, API_KEY_ENV, BASE_URL_ENV, DEFAULT_BASE_URL, USER_AGENT
from ._exceptions import APIResponseValidationError
from ._retries import retry_delay, should_retry_status

__all__ = ["BaseClient", "RequestOptions", "parse_response"]

T = TypeVar("T")


@dataclass(frozen=True)
class RequestOptions:
    """One logical request, the same across its retries (so is its idempotency key)."""

    method: str
    path: str
    json: Mapping[str, Any] | None = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: bool = False
    idempotency_key: str | None = None
    admin: bool = False  # sent with the admin key (`client.admin`) instead of the tenant key

    @classmethod
    def make(
        cls,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
        admin: bool = False,
    ) -> RequestOptions:
        """Options for one call; a POST gets a fresh uuid4 idempotency key, kept across its retries."""
        return cls(
            method=method,
            path=path,
            json=json,
            params={k: v for k, v in (params or {}).items() if v is not None} or None,
            headers=dict(headers or {}),
            stream=stream,
            idempotency_key=str(uuid.uuid4()) if method.upper() == "POST" else None,
            admin=admin,
        )


class BaseClient:
    """Settings and pure request/response logic shared by `SessionGate` and `AsyncSessionGate`."""

    base_url: str
    api_key: str | None
    admin_key: str | None
    timeout: httpx.Timeout
    max_retries: int
    _client: httpx.Client | httpx.AsyncClient

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        default_headers: Mapping[str, str] | None,
        admin_key: str | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        resolved = base_url if base_url is not None else os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
        self.base_url = resolved.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        self.admin_key = admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV) or None
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.max_retries = max_retries
        self._default_headers = dict(default_headers or {})

    @property
    def default_headers(self) -> dict[str, str]:
        """Headers sent with every request (the caller's `default_headers` win over the SDK's own)."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(self._default_headers)
        return headers

    def _build_request(self, options: RequestOptions) -> httpx.Request:
        """The request for one attempt, built by the HTTP client so its own headers and hooks apply too."""
        headers = httpx.Headers(self.default_headers)
        if options.admin and self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        headers.update(options.headers)
        if options.idempotency_key is not None:
            headers.setdefault("Idempotency-Key", options.idempotency_key)
        if options.stream:
            headers["Accept"] = "text/event-stream"
        return self._client.build_request(
            options.method,
            self.base_url + options.path,
            params=options.params,
            headers=headers,
            json=options.json,
            timeout=self.timeout,
        )

    def _status_retry_delay(self, response: httpx.Response, retries_taken: int) -> float | None:
        """Seconds to wait before resending after this error response, or None to give up."""
        if retries_taken >= self.max_retries or not should_retry_status(response.status_code, response.headers):
            return None
        return retry_delay(retries_taken, response.headers)

    def _connection_retry_delay(self, retries_taken: int) -> float | None:
        """Seconds to wait before resending after a connection error or timeout, or None to give up."""
        return retry_delay(retries_taken) if retries_taken < self.max_retries else None


def parse_response(response: httpx.Response, parser: Callable[[Any], T]) -> T:
    """Decode a successful response's JSON and build its typed view, or raise APIResponseValidationError."""
    try:
        payload = response.json()
    except ValueError as exc:
        raise APIResponseValidationError("Response body is not JSON.", response=response) from exc
    try:
        return parser(payload)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise APIResponseValidationError(
            f"Response body does not match the wire format: {exc!r}", response=response, body=payload
        ) from exc

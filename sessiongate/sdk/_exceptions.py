"""The SDK's one exception tree, and the mapping from an HTTP error response to its class.

```
SessionGateError                     anything this SDK raises on purpose
└── APIError                         .message, .request, .body, .request_id, .type, .code, .param
    ├── APIConnectionError           no response: refused, reset, DNS, a stream cut off mid-way
    │   └── APITimeoutError          the request timed out
    ├── APIResponseValidationError   a 2xx response whose body is not what the wire format promises
    └── APIStatusError               a non-2xx response: .status_code, .response
        ├── BadRequestError              400
        ├── AuthenticationError          401
        ├── PermissionDeniedError        403
        ├── NotFoundError                404
        ├── ConflictError                409
        ├── RequestTooLargeError         413
        ├── UnprocessableEntityError     422
        ├── RateLimitError               429
        └── InternalServerError          >= 500
```

An error event inside a chat stream (`data: {"error": {...}}`) is raised as a plain `APIError`: the HTTP
status was already 200 when it arrived. `.body` is the server's `error` object when the body has one (the
OpenAI error shape: message, type, param, code), else the whole decoded body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTooLargeError",
    "SessionGateError",
    "UnprocessableEntityError",
    "connection_error_from",
    "status_error_from_response",
]


class SessionGateError(Exception):
    """Base class of every exception the SDK raises on purpose."""


class APIError(SessionGateError):
    """The gateway could not be reached, refused the request, or reported an error."""

    message: str
    request: httpx.Request | None
    body: object | None
    request_id: str | None

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        body: object | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request = request
        self.body = body
        self.request_id = request_id

    def _field(self, name: str) -> str | None:
        value = self.body.get(name) if isinstance(self.body, Mapping) else None
        return value if isinstance(value, str) else None

    @property
    def type(self) -> str | None:
        """The error's `type` from the body (for example `invalid_request_error`), if any."""
        return self._field("type")

    @property
    def code(self) -> str | None:
        """The error's machine-readable `code` from the body, if any."""
        return self._field("code")

    @property
    def param(self) -> str | None:
        """The request parameter the error is about, if the body names one."""
        return self._field("param")


class APIConnectionError(APIError):
    """No usable response: the connection failed, or a stream broke after it had started."""

    def __init__(self, message: str = "Connection error.", *, request: httpx.Request | None = None) -> None:
        super().__init__(message, request=request)


class APITimeoutError(APIConnectionError):
    """The request timed out (connect, read, write or pool timeout)."""

    def __init__(self, *, request: httpx.Request | None = None) -> None:
        super().__init__("Request timed out.", request=request)


class APIResponseValidationError(APIError):
    """A successful response whose body does not match the wire format."""

    response: httpx.Response
    status_code: int

    def __init__(self, message: str, *, response: httpx.Response, body: object | None = None) -> None:
        super().__init__(message, request=response.request, body=body, request_id=response.headers.get("x-request-id"))
        self.response = response
        self.status_code = response.status_code


class APIStatusError(APIError):
    """The gateway answered with a non-2xx status."""

    response: httpx.Response
    status_code: int

    def __init__(self, message: str, *, response: httpx.Response, body: object | None) -> None:
        super().__init__(message, request=response.request, body=body, request_id=response.headers.get("x-request-id"))
        self.response = response
        self.status_code = response.status_code


class BadRequestError(APIStatusError):
    """400."""


class AuthenticationError(APIStatusError):
    """401."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError):
    """404."""


class ConflictError(APIStatusError):
    """409."""


class RequestTooLargeError(APIStatusError):
    """413."""


class UnprocessableEntityError(APIStatusError):
    """422."""


class RateLimitError(APIStatusError):
    """429."""


class InternalServerError(APIStatusError):
    """500 and above."""


_STATUS_ERRORS: Mapping[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: RequestTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}


def error_body(payload: object) -> object:
    """The `error` object of an OpenAI-shaped error payload, or the payload itself when it has none."""
    if isinstance(payload, Mapping):
        inner: object = payload.get("error")
        if isinstance(inner, Mapping):
            return inner
    return payload


def error_message(body: object | None, fallback: str) -> str:
    """The human message of an error body, or `fallback`."""
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        return str(body["message"])
    return fallback


def status_error_from_response(response: httpx.Response) -> APIStatusError:
    """The exception for a non-2xx response whose body has been read."""
    try:
        payload: Any = response.json()
    except ValueError:
        payload = response.text or None
    body = error_body(payload)
    message = error_message(body, f"HTTP {response.status_code} {response.reason_phrase}".strip())
    cls = _STATUS_ERRORS.get(response.status_code)
    if cls is None:
        cls = InternalServerError if response.status_code >= 500 else APIStatusError
    return cls(f"Error code: {response.status_code} - {message}", response=response, body=body)


def connection_error_from(exc: httpx.TransportError, request: httpx.Request | None) -> APIConnectionError:
    """The exception for a transport failure: `APITimeoutError` for timeouts, else `APIConnectionError`."""
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(request=request)
    return APIConnectionError(f"Connection error: {exc}" if str(exc) else "Connection error.", request=request)

"""The gateway's errors and their one translation into OpenAI-format HTTP responses.

    GatewayError                      status, OpenAI error type, code
    ├── InvalidRequest                400 invalid_request_error (param names the field)
    ├── AuthenticationFailed          401 authentication_error
    ├── PermissionDenied              403 permission_error
    ├── NotFound                      404 not_found_error
    ├── Conflict                      409 conflict_error (e.g. the same Idempotency-Key in progress)
    ├── PayloadTooLarge               413 invalid_request_error / request_too_large
    ├── RateLimited                   429 rate_limit_error, with Retry-After and retry-after-ms (a tenant's limit)
    ├── ServiceUnavailable            503 service_unavailable (no healthy worker, store down)
    │   └── Saturated                 503 gateway_saturated, with both as well (the admission queue's bound)
    └── UpstreamError                 502 upstream_error (a worker failed us)
        ├── WorkerUnreachable         502 worker_unreachable (refused, reset, closed mid-way)
        ├── WorkerTimeout             504 worker_timeout
        └── WorkerRejected            the worker's own 4xx/5xx, relayed with its status and message

Store errors (`sessions.StoreError`) and Starlette's `HTTPException` are mapped here as well, so handlers
raise and never build error responses themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sessiongate import sessions

__all__ = [
    "AuthenticationFailed",
    "Conflict",
    "GatewayError",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RateLimited",
    "Saturated",
    "ServiceUnavailable",
    "UpstreamError",
    "WorkerRejected",
    "WorkerTimeout",
    "WorkerUnreachable",
    "error_body",
    "exception_handlers",
]

log = structlog.get_logger(__name__)


def retry_after_headers(seconds: float) -> dict[str, str]:
    """`Retry-After` in whole seconds (at least one, as HTTP has it) and `retry-after-ms`, the exact wait (as
    OpenAI's API sends it; the SDK reads it first): a queue spacing returns a few milliseconds apart would otherwise
    send them back a whole second at a time."""
    return {"Retry-After": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(0, round(seconds * 1000)))}


class GatewayError(Exception):
    status_code = 500
    error_type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status_code = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class Conflict(GatewayError):
    status_code = 409
    error_type = "conflict_error"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class PayloadTooLarge(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class RateLimited(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float, code: str) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return retry_after_headers(self.retry_after_s)


class ServiceUnavailable(GatewayError):
    status_code = 503
    error_type = "service_unavailable"


class Saturated(ServiceUnavailable):
    """A turn shed because it would wait past the bound (`gateway.turn.admission`)."""

    code = "gateway_saturated"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return retry_after_headers(self.retry_after_s)


class UpstreamError(GatewayError):
    status_code = 502
    error_type = "upstream_error"

    def __init__(self, message: str, *, worker: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.worker = worker


class WorkerUnreachable(UpstreamError):
    code = "worker_unreachable"


class WorkerTimeout(UpstreamError):
    status_code = 504
    code = "worker_timeout"


class WorkerRejected(UpstreamError):
    """The worker answered with an error status; its status and OpenAI error body are relayed."""

    def __init__(self, status_code: int, body: Mapping[str, Any], *, worker: str) -> None:
        error = body.get("error") if isinstance(body.get("error"), Mapping) else None
        message = str((error or {}).get("message") or body.get("message") or f"worker answered {status_code}")
        super().__init__(message, worker=worker)
        self.status_code = status_code
        if error is not None:
            self.error_type = str(
                error.get("type") or ("invalid_request_error" if status_code < 500 else "upstream_error")
            )
            self.param = error.get("param") if isinstance(error.get("param"), str) else None
            self.code = str(error["code"]) if error.get("code") is not None else None
        elif status_code < 500:
            self.error_type = "invalid_request_error"


def error_body(message: str, error_type: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _response(status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    if exc.status_code >= 500 and not isinstance(exc, Saturated):  # shed turns are counted, not logged one by one
        log.warning(
            "request_failed", status=exc.status_code, error_type=exc.error_type, code=exc.code, error=exc.message
        )
    return _response(exc.status_code, exc.body(), exc.headers())


_STORE_ERRORS: tuple[tuple[type[sessions.StoreError], int, str, str], ...] = (
    (sessions.SessionNotFound, 404, "not_found_error", "session_not_found"),
    (sessions.TurnNotFound, 404, "not_found_error", "turn_not_found"),
    (sessions.ResponseNotFound, 404, "not_found_error", "response_not_found"),
    (sessions.ToolCallNotFound, 404, "not_found_error", "tool_call_not_found"),
    (sessions.ApiKeyNotFound, 404, "not_found_error", "api_key_not_found"),
    (sessions.SessionExists, 409, "conflict_error", "session_exists"),
    (sessions.InvalidTransition, 409, "conflict_error", "invalid_transition"),
    (sessions.StoreUnavailable, 503, "service_unavailable", "store_unavailable"),
)


async def _store_error(request: Request, exc: Exception) -> Response:
    for kind, status, error_type, code in _STORE_ERRORS:
        if isinstance(exc, kind):
            if status >= 500:
                log.warning("store_unavailable", error=str(exc))
                return _response(
                    status,
                    error_body("The session store is unavailable; retry shortly.", error_type, code=code),
                    {"Retry-After": "1"},
                )
            # A conflict is final: retrying the same write cannot succeed (SDKs read this header).
            headers = {"x-should-retry": "false"} if status == 409 else None
            return _response(status, error_body(str(exc), error_type, code=code), headers)
    log.error("store_error", error=str(exc), exc_info=exc)
    return _response(500, error_body("Internal store error.", "internal_error"))


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return _response(exc.status_code, error_body(str(exc.detail), error_type), exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled_error", exc_info=exc)
    return _response(500, error_body("Internal error in the gateway.", "internal_error"))


def exception_handlers() -> dict[Any, Any]:
    return {
        GatewayError: _gateway_error,
        sessions.StoreError: _store_error,
        HTTPException: _http_exception,
        Exception: _unexpected,
    }

"""Who is calling: the tenant of a request.

The foundation knows one tenant ("default") and, optionally, one static client key. Without a key the
gateway is open, which `sessiongate serve` says at start-up; per-tenant keys replace this module's body later.
Admin endpoints need the separate admin key (`require_admin`); without one configured they are refused, so an
open local gateway never exposes its admin API by accident.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from .errors import AuthenticationFailed, PermissionDenied
from .settings import GatewaySettings

__all__ = ["DEFAULT_TENANT", "authenticate", "require_admin"]

DEFAULT_TENANT = "default"


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
    return token.strip()


def authenticate(request: Request, settings: GatewaySettings) -> str:
    """The caller's tenant id, or `AuthenticationFailed`."""
    if not settings.api_key:
        return DEFAULT_TENANT
    if not hmac.compare_digest(_bearer(request).encode(), settings.api_key.encode()):
        raise AuthenticationFailed("Invalid API key.")
    return DEFAULT_TENANT


def require_admin(request: Request, settings: GatewaySettings) -> None:
    """Pass only with the admin key; client keys get 403, no key 401."""
    if not settings.admin_key:
        raise PermissionDenied(
            "The admin API is disabled: set SESSIONGATE_ADMIN_KEY to enable it.", code="admin_disabled"
        )
    token = _bearer(request)
    if not hmac.compare_digest(token.encode(), settings.admin_key.encode()):
        if settings.api_key and hmac.compare_digest(token.encode(), settings.api_key.encode()):
            raise PermissionDenied("A client key cannot use the admin API.", code="not_admin")
        raise AuthenticationFailed("Invalid admin key.")

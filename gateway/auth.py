"""Who is calling: the tenant of a request.

The foundation knows one tenant ("default") and, optionally, one static client key. Without a key the
gateway is open, which `sessiongate serve` says at start-up; per-tenant keys replace this module's body later.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from .errors import AuthenticationFailed
from .settings import GatewaySettings

__all__ = ["DEFAULT_TENANT", "authenticate"]

DEFAULT_TENANT = "default"


def authenticate(request: Request, settings: GatewaySettings) -> str:
    """The caller's tenant id, or `AuthenticationFailed`."""
    if not settings.api_key:
        return DEFAULT_TENANT
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
    if not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
        raise AuthenticationFailed("Invalid API key.")
    return DEFAULT_TENANT

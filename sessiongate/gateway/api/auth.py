"""Who is calling: the tenant of a request.

A client presents `Authorization: Bearer <key>`: a tenant key from the store (`gateway.api.tenancy`), or the optional
static `api_key`, which stands for the "default" tenant. Without a key a request is refused, unless the gateway
was explicitly configured for local use (`allow_unauthenticated`, which `sessiongate up` sets and says at
start-up): then it is served as the "default" tenant. Admin endpoints need the separate admin key
(`require_admin`); without one configured they are refused, so a local gateway never exposes its admin API.
"""

from __future__ import annotations

import hmac

import structlog
from starlette.requests import Request

from sessiongate.gateway.errors import AuthenticationFailed, PermissionDenied
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.gateway.state import gateway_state

__all__ = ["DEFAULT_TENANT", "authenticate", "authentication_mode", "require_admin"]

DEFAULT_TENANT = "default"


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed("Malformed Authorization header: send 'Authorization: Bearer <key>'.")
    return token.strip()


def _bearer(request: Request) -> str:
    token = _token(request)
    if token is None:
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
    return token


def _equal(a: str, b: str) -> bool:
    return bool(b) and hmac.compare_digest(a.encode(), b.encode())


def authentication_mode(settings: GatewaySettings) -> str:
    """How the gateway authenticates clients, in words for the start-up log."""
    if settings.allow_unauthenticated:
        return "none required (local use only): callers without a key are the 'default' tenant"
    return "tenant API keys" + (" and the static api_key" if settings.api_key else "")


async def authenticate(request: Request, settings: GatewaySettings) -> str:
    """The caller's tenant id, or `AuthenticationFailed` (`StoreUnavailable` if keys cannot be checked)."""
    token = _token(request)
    if token is None:
        if not settings.allow_unauthenticated:
            raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.")
        tenant = DEFAULT_TENANT
    elif _equal(token, settings.api_key):
        tenant = DEFAULT_TENANT
    else:
        found = await gateway_state(request).keys.tenant_for(token)
        if found is None:
            raise AuthenticationFailed("Invalid API key.")
        tenant = found
    structlog.contextvars.bind_contextvars(tenant_id=tenant)
    return tenant


def require_admin(request: Request, settings: GatewaySettings) -> None:
    """Pass only with the admin key; the static client key gets 403, no key 401."""
    if not settings.admin_key:
        raise PermissionDenied(
            "The admin API is disabled: set SESSIONGATE_ADMIN_KEY to enable it.", code="admin_disabled"
        )
    token = _bearer(request)
    if not _equal(token, settings.admin_key):
        if _equal(token, settings.api_key):
            raise PermissionDenied("A client key cannot use the admin API.", code="not_admin")
        raise AuthenticationFailed("Invalid admin key.")

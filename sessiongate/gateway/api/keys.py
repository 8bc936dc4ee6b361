"""The admin API for tenants and their keys: keys created (the secret is in this one answer only), listed,
revoked; tenants' limit overrides set and shown.

    POST   /v1/admin/keys              {"tenant": "acme", "name": "ci"}  -> 201, the key with its secret
    GET    /v1/admin/keys[?tenant=T]   -> the keys, never their secrets
    DELETE /v1/admin/keys/{key_id}     -> the revoked key (revoking twice is harmless)
    GET    /v1/admin/tenants           -> the tenants, with their overrides and the limits they get
    GET    /v1/admin/tenants/{id}      -> one tenant (404 if it has neither key, session nor limits)
    PUT    /v1/admin/tenants/{id}/limits  {"max_concurrent": 4, "tokens_per_minute": null}  -> the tenant
           (replaces both overrides: null or absent = the global setting, 0 = no limit; creates the tenant)

Every call needs the admin key (`require_admin`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sessiongate import sessions
from sessiongate.gateway.errors import InvalidRequest, NotFound
from sessiongate.gateway.state import gateway_state
from sessiongate.gateway.turn.limits import TenantLimits

from .auth import require_admin
from .schemas import parse_json, validate
from .tenancy import create_key, revoke_key

__all__ = ["TENANT_ID_PATTERN", "CreateKeyBody", "TenantLimitsBody", "key_routes", "serialize_key"]

TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
_KEY_ID = re.compile(r"^key_[0-9a-f]{24}$")


class CreateKeyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(pattern=TENANT_ID_PATTERN)
    name: str = Field(default="", max_length=256)


class TenantLimitsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_concurrent: int | None = Field(default=None, ge=0, le=1_000_000)
    tokens_per_minute: int | None = Field(default=None, ge=0, le=10**12)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def serialize_key(record: sessions.ApiKeyRecord, secret: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": record.id,
        "object": "api_key",
        "tenant_id": record.tenant_id,
        "name": record.name,
        "prefix": record.prefix,
        "created_at": _iso(record.created_at),
        "revoked_at": _iso(record.revoked_at),
    }
    if secret is not None:
        out["key"] = secret
    return out


async def create_api_key(request: Request) -> Response:
    state = gateway_state(request)
    require_admin(request, state.settings)
    body = validate(CreateKeyBody, parse_json(await request.body()))
    new = await create_key(state.store, tenant_id=body.tenant, name=body.name)
    return JSONResponse(serialize_key(new.record, new.secret), status_code=201)


async def list_api_keys(request: Request) -> Response:
    state = gateway_state(request)
    require_admin(request, state.settings)
    tenant = request.query_params.get("tenant")
    if tenant is not None:
        validate(CreateKeyBody, {"tenant": tenant})
    records = await state.store.list_api_keys(tenant_id=tenant)
    return JSONResponse({"object": "list", "data": [serialize_key(r) for r in records]})


async def revoke_api_key(request: Request) -> Response:
    state = gateway_state(request)
    require_admin(request, state.settings)
    key_id = request.path_params["key_id"]
    if not _KEY_ID.fullmatch(key_id):
        raise InvalidRequest("Invalid key id: expected 'key_' and 24 hex digits.", param="key_id")
    record = await revoke_key(state.store, key_id, state.keys)
    return JSONResponse(serialize_key(record))


def serialize_tenant(record: sessions.TenantRecord, limits: TenantLimits) -> dict[str, Any]:
    effective = limits.for_tenant(record.id)
    return {
        "id": record.id,
        "object": "tenant",
        "name": record.name,
        "created_at": _iso(record.created_at),
        "limits": {"max_concurrent": record.max_concurrent, "tokens_per_minute": record.tokens_per_minute},
        "effective_limits": {
            "max_concurrent": effective.max_concurrent,
            "tokens_per_minute": effective.tokens_per_minute,
        },
    }


def _tenant_id(request: Request) -> str:
    tenant = request.path_params["tenant_id"]
    validate(CreateKeyBody, {"tenant": tenant})
    return str(tenant)


async def list_tenants(request: Request) -> Response:
    state = gateway_state(request)
    require_admin(request, state.settings)
    records = await state.store.list_tenants()
    return JSONResponse({"object": "list", "data": [serialize_tenant(r, state.limits) for r in records]})


async def show_tenant(request: Request) -> Response:
    state = gateway_state(request)
    require_admin(request, state.settings)
    tenant_id = _tenant_id(request)
    found = await state.store.list_tenants(tenant_id=tenant_id)
    if not found:
        raise NotFound(f"No tenant {tenant_id!r}.", code="tenant_not_found")
    return JSONResponse(serialize_tenant(found[0], state.limits))


async def set_tenant_limits(request: Request) -> Response:
    state = gateway_state(request)
    require_admin(request, state.settings)
    tenant_id = _tenant_id(request)
    body = validate(TenantLimitsBody, parse_json(await request.body()))
    record = await state.store.set_tenant_limits(
        tenant_id, max_concurrent=body.max_concurrent, tokens_per_minute=body.tokens_per_minute
    )
    state.limits.set_override(record)  # at once here; other replicas at their next reload
    return JSONResponse(serialize_tenant(record, state.limits))


def key_routes() -> list[Route]:
    return [
        Route("/v1/admin/keys", create_api_key, methods=["POST"]),
        Route("/v1/admin/keys", list_api_keys, methods=["GET"]),
        Route("/v1/admin/keys/{key_id}", revoke_api_key, methods=["DELETE"]),
        Route("/v1/admin/tenants", list_tenants, methods=["GET"]),
        Route("/v1/admin/tenants/{tenant_id}", show_tenant, methods=["GET"]),
        Route("/v1/admin/tenants/{tenant_id}/limits", set_tenant_limits, methods=["PUT"]),
    ]

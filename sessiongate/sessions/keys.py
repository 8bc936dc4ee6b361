"""Tenants and their API keys in the store: keys inserted, looked up by hash, listed, revoked; tenants' limit
overrides set and listed.

The store only ever sees a key's sha256 (`secret_hash`) and its short `prefix`; making the secret, hashing it
and showing it once is the gateway's business (`gateway.api.tenancy`). Creating a key creates its tenant on first
use, as a session does. Revoking is a timestamp, not a delete, so listings keep the history of a tenant's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from ._sql import insert_on_conflict, tenant_values
from .errors import ApiKeyNotFound
from .models import ApiKey, Tenant
from .records import ApiKeyRecord, TenantRecord

__all__ = ["create_api_key", "find_api_key", "list_api_keys", "list_tenants", "revoke_api_key", "set_tenant_limits"]


def _record(row: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        name=row.name,
        prefix=row.prefix,
        secret_hash=row.secret_hash,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


async def create_api_key(
    db: AsyncSession,
    backend: str,
    *,
    key_id: str,
    tenant_id: str,
    name: str,
    prefix: str,
    secret_hash: str,
    created_at: datetime,
) -> ApiKeyRecord:
    await db.execute(insert_on_conflict(backend, Tenant, tenant_values(tenant_id, created_at)))
    row = ApiKey(
        id=key_id,
        tenant_id=tenant_id,
        name=name,
        prefix=prefix,
        secret_hash=secret_hash,
        created_at=created_at,
        revoked_at=None,
    )
    db.add(row)
    await db.flush()
    return _record(row)


async def find_api_key(db: AsyncSession, secret_hash: str) -> ApiKeyRecord | None:
    """The live (not revoked) key with this hash, or None."""
    row = await db.scalar(select(ApiKey).where(ApiKey.secret_hash == secret_hash, ApiKey.revoked_at.is_(None)))
    return _record(row) if row is not None else None


async def list_api_keys(db: AsyncSession, *, tenant_id: str | None) -> Sequence[ApiKeyRecord]:
    stmt = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
    if tenant_id is not None:
        stmt = stmt.where(ApiKey.tenant_id == tenant_id)
    return [_record(row) for row in await db.scalars(stmt)]


async def revoke_api_key(db: AsyncSession, key_id: str, *, revoked_at: datetime) -> ApiKeyRecord:
    """Revoke a key; revoking it again keeps the first revocation time."""
    await db.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=revoked_at)
        .execution_options(synchronize_session=False)
    )
    row = await db.scalar(select(ApiKey).where(ApiKey.id == key_id).execution_options(populate_existing=True))
    if row is None:
        raise ApiKeyNotFound(key_id)
    return _record(row)


def _tenant(row: Tenant) -> TenantRecord:
    return TenantRecord(
        id=row.id,
        name=row.name,
        created_at=row.created_at,
        max_concurrent=row.max_concurrent,
        tokens_per_minute=row.tokens_per_minute,
    )


async def set_tenant_limits(
    db: AsyncSession,
    backend: str,
    tenant_id: str,
    *,
    max_concurrent: int | None,
    tokens_per_minute: int | None,
    now: datetime,
) -> TenantRecord:
    """Replace a tenant's limit overrides (creating the tenant on first use, as a key does)."""
    await db.execute(insert_on_conflict(backend, Tenant, tenant_values(tenant_id, now)))
    await db.execute(
        update(Tenant)
        .where(Tenant.id == tenant_id)
        .values(max_concurrent=max_concurrent, tokens_per_minute=tokens_per_minute)
        .execution_options(synchronize_session=False)
    )
    row = await db.scalar(select(Tenant).where(Tenant.id == tenant_id).execution_options(populate_existing=True))
    assert row is not None  # inserted above if it was missing
    return _tenant(row)


async def list_tenants(
    db: AsyncSession, *, tenant_id: str | None = None, with_overrides: bool = False
) -> list[TenantRecord]:
    stmt = select(Tenant).order_by(Tenant.id)
    if tenant_id is not None:
        stmt = stmt.where(Tenant.id == tenant_id)
    if with_overrides:
        stmt = stmt.where(or_(Tenant.max_concurrent.is_not(None), Tenant.tokens_per_minute.is_not(None)))
    return [_tenant(row) for row in await db.scalars(stmt)]

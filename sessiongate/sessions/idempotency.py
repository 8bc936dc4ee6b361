"""Idempotency keys in the store: claim one for a request, complete it with the response, or release it.

`claim` is one `INSERT ... ON CONFLICT DO NOTHING`: of concurrent claims of a (tenant, key) exactly one wins;
the others get the existing row back (pending: in progress; done: replay its response). A pending row older
than `stale_before` (its gateway died mid-request) is taken over by a conditional UPDATE, which again only one
claimer wins. A request that failed releases its key (deletes the row) so that the client's retry runs anew.
Rows older than the gateway's retention are deleted by `delete_older_than` (a retry that late runs anew).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from ._sql import insert_on_conflict
from .models import IdempotencyKey
from .records import IdempotencyRecord

__all__ = ["claim", "complete", "delete_older_than", "release"]


def _record(row: IdempotencyKey) -> IdempotencyRecord:
    return IdempotencyRecord(
        tenant_id=row.tenant_id,
        key=row.key,
        request_hash=row.request_hash,
        status=row.status,
        created_at=row.created_at,
        turn_id=row.turn_id,
        response=dict(row.response) if row.response is not None else None,
    )


async def claim(
    db: AsyncSession,
    backend: str,
    *,
    tenant_id: str,
    key: str,
    request_hash: str,
    now: datetime,
    stale_before: datetime,
) -> IdempotencyRecord | None:
    """None when this caller now holds the key; else the row another request holds (or completed)."""
    values = {"tenant_id": tenant_id, "key": key, "request_hash": request_hash, "status": "pending", "created_at": now}
    inserted = await db.scalar(
        insert_on_conflict(backend, IdempotencyKey, values, conflict=("tenant_id", "key")).returning(IdempotencyKey.key)
    )
    if inserted is not None:
        return None
    row = await db.scalar(
        select(IdempotencyKey)
        .where(IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key)
        .execution_options(populate_existing=True)
    )
    if row is None:  # released between our insert and select: the key is free again
        return await claim(
            db, backend, tenant_id=tenant_id, key=key, request_hash=request_hash, now=now, stale_before=stale_before
        )
    if row.status == "pending" and row.created_at < stale_before and row.request_hash == request_hash:
        taken = await db.scalar(
            update(IdempotencyKey)
            .where(
                IdempotencyKey.tenant_id == tenant_id,
                IdempotencyKey.key == key,
                IdempotencyKey.status == "pending",
                IdempotencyKey.created_at == row.created_at,
            )
            .values(created_at=now)
            .returning(IdempotencyKey.key)
            .execution_options(synchronize_session=False)
        )
        if taken is not None:
            return None
    return _record(row)


async def complete(db: AsyncSession, *, tenant_id: str, key: str, turn_id: str, response: Mapping[str, Any]) -> None:
    await db.execute(
        update(IdempotencyKey)
        .where(IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key)
        .values(status="done", turn_id=turn_id, response=dict(response))
        .execution_options(synchronize_session=False)
    )


async def release(db: AsyncSession, *, tenant_id: str, key: str) -> None:
    await db.execute(
        delete(IdempotencyKey)
        .where(IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key, IdempotencyKey.status == "pending")
        .execution_options(synchronize_session=False)
    )


async def delete_older_than(db: AsyncSession, cutoff: datetime) -> int:
    """Delete every key claimed before `cutoff` (done or pending); how many."""
    deleted = await db.execute(
        delete(IdempotencyKey)
        .where(IdempotencyKey.created_at < cutoff)
        .returning(IdempotencyKey.key)
        .execution_options(synchronize_session=False)
    )
    return len(deleted.all())

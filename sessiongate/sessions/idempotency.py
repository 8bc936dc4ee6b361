"""Idempotency keys in the store: claim one for a request, complete it with the response, or release it.

A claim records its holder (`IdempotencyHolder`): the gateway instance id and run serving the request, whose lease
is a row of `gateway_instances` (`sessions.instances`). `claim` is one `INSERT ... ON CONFLICT DO NOTHING`: of
concurrent claims of a (tenant, key) exactly one wins; the others get the existing row back (pending: in progress;
done: replay its response). A pending row of the same request is taken over when its holder is dead (its lease is
gone, held by another run of the instance, or last renewed before `holder_stale_before`) or, whoever holds it, when
it was claimed before `stale_before` (no turn can still be running behind it; the only rule for a row claimed
before holders were recorded). The takeover is one conditional UPDATE on the row as it was seen, reading the lease
in the same statement, so again only one claimer wins; it makes the caller the holder. `complete` and `release`
touch only a pending row that their caller still holds: a holder that lost its key neither overwrites the new
holder's answer nor frees the key under the new holder's turn. A request that failed releases its key (deletes the
row) so that the client's retry runs anew. Rows older than the gateway's retention are deleted by
`delete_older_than` (a retry that late runs anew).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from ._sql import insert_on_conflict
from .models import GatewayInstance, IdempotencyKey
from .records import IdempotencyHolder, IdempotencyRecord

__all__ = ["claim", "complete", "delete_older_than", "release"]


def _holder(row: IdempotencyKey) -> IdempotencyHolder | None:
    if row.holder_instance is None or row.holder_run is None:
        return None
    return IdempotencyHolder(instance=row.holder_instance, run=row.holder_run)


def _record(row: IdempotencyKey) -> IdempotencyRecord:
    return IdempotencyRecord(
        tenant_id=row.tenant_id,
        key=row.key,
        request_hash=row.request_hash,
        status=row.status,
        created_at=row.created_at,
        turn_id=row.turn_id,
        response=dict(row.response) if row.response is not None else None,
        holder=_holder(row),
    )


def _held_by(holder: IdempotencyHolder) -> ColumnElement[bool]:
    return (IdempotencyKey.holder_instance == holder.instance) & (IdempotencyKey.holder_run == holder.run)


def _holder_lease_alive(renewed_since: datetime) -> ColumnElement[bool]:
    """Whether the row's holder still holds its instance lease, renewed at or after `renewed_since`."""
    return exists().where(
        GatewayInstance.id == IdempotencyKey.holder_instance,
        GatewayInstance.run == IdempotencyKey.holder_run,
        GatewayInstance.heartbeat_at >= renewed_since,
    )


async def claim(
    db: AsyncSession,
    backend: str,
    *,
    tenant_id: str,
    key: str,
    request_hash: str,
    holder: IdempotencyHolder,
    now: datetime,
    stale_before: datetime,
    holder_stale_before: datetime,
) -> IdempotencyRecord | None:
    """None when `holder` now holds the key; else the row another request holds (or completed)."""
    values = {
        "tenant_id": tenant_id,
        "key": key,
        "request_hash": request_hash,
        "status": "pending",
        "created_at": now,
        "holder_instance": holder.instance,
        "holder_run": holder.run,
    }
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
            db,
            backend,
            tenant_id=tenant_id,
            key=key,
            request_hash=request_hash,
            holder=holder,
            now=now,
            stale_before=stale_before,
            holder_stale_before=holder_stale_before,
        )
    if row.status != "pending" or row.request_hash != request_hash:
        return _record(row)
    seen_holder = _holder(row)
    may_take_over = IdempotencyKey.created_at < stale_before
    # The caller is alive, running this: its own claim (a duplicate racing its first request) is never dead.
    if seen_holder is not None and seen_holder != holder:
        may_take_over = or_(may_take_over, ~_holder_lease_alive(holder_stale_before))
    taken = await db.scalar(
        update(IdempotencyKey)
        .where(
            IdempotencyKey.tenant_id == tenant_id,
            IdempotencyKey.key == key,
            IdempotencyKey.status == "pending",
            # The claim as it was seen: of two claimers taking it over, the second finds it changed.
            IdempotencyKey.created_at == row.created_at,
            IdempotencyKey.holder_instance.is_not_distinct_from(row.holder_instance),
            IdempotencyKey.holder_run.is_not_distinct_from(row.holder_run),
            may_take_over,
        )
        .values(created_at=now, holder_instance=holder.instance, holder_run=holder.run)
        .returning(IdempotencyKey.key)
        .execution_options(synchronize_session=False)
    )
    return None if taken is not None else _record(row)


async def complete(
    db: AsyncSession,
    *,
    tenant_id: str,
    key: str,
    holder: IdempotencyHolder,
    turn_id: str,
    response: Mapping[str, Any],
) -> bool:
    """Record the response on the key `holder` holds; False (nothing written) when it lost the key."""
    completed = await db.scalar(
        update(IdempotencyKey)
        .where(
            IdempotencyKey.tenant_id == tenant_id,
            IdempotencyKey.key == key,
            IdempotencyKey.status == "pending",
            _held_by(holder),
        )
        .values(status="done", turn_id=turn_id, response=dict(response))
        .returning(IdempotencyKey.key)
        .execution_options(synchronize_session=False)
    )
    return completed is not None


async def release(db: AsyncSession, *, tenant_id: str, key: str, holder: IdempotencyHolder) -> None:
    await db.execute(
        delete(IdempotencyKey)
        .where(
            IdempotencyKey.tenant_id == tenant_id,
            IdempotencyKey.key == key,
            IdempotencyKey.status == "pending",
            _held_by(holder),
        )
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

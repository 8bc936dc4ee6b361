"""Gateway instance leases: one row per instance id, held by the process run that claimed it.

A run claims its id at start-up and renews `heartbeat_at` while it serves. A claim succeeds when the id is free,
when its holder's heartbeat is older than `stale_before` (the holder stopped), or when the caller vouches that
the holder is dead (`holder_dead`: the gateway checks a holder on its own host by pid); otherwise the holder is
returned and the caller must not serve. Take-overs are conditional UPDATEs on the holder's run and heartbeat, so
of two claimers only one wins. Stopping releases the lease, so a clean restart claims it at once. The lease also
tells whether the holder of a pending idempotency key still lives (`sessions.idempotency`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from ._sql import insert_on_conflict
from .models import GatewayInstance
from .records import InstanceLease

__all__ = ["claim", "heartbeat", "release"]


def _lease(row: GatewayInstance) -> InstanceLease:
    return InstanceLease(
        id=row.id, run=row.run, host=row.host, pid=row.pid, started_at=row.started_at, heartbeat_at=row.heartbeat_at
    )


async def claim(
    db: AsyncSession,
    backend: str,
    *,
    instance_id: str,
    run: str,
    host: str,
    pid: int,
    now: datetime,
    stale_before: datetime,
    holder_dead: Callable[[InstanceLease], bool],
) -> InstanceLease | None:
    """None when `run` now holds the lease; else the live holder."""
    values = {"id": instance_id, "run": run, "host": host, "pid": pid, "started_at": now, "heartbeat_at": now}
    inserted = await db.scalar(
        insert_on_conflict(backend, GatewayInstance, values, conflict=("id",)).returning(GatewayInstance.id)
    )
    if inserted is not None:
        return None
    row = await db.scalar(
        select(GatewayInstance).where(GatewayInstance.id == instance_id).execution_options(populate_existing=True)
    )
    if row is None:  # released between our insert and select: free again
        return await claim(
            db,
            backend,
            instance_id=instance_id,
            run=run,
            host=host,
            pid=pid,
            now=now,
            stale_before=stale_before,
            holder_dead=holder_dead,
        )
    holder = _lease(row)
    if holder.run != run and holder.heartbeat_at >= stale_before and not holder_dead(holder):
        return holder
    taken = await db.scalar(
        update(GatewayInstance)
        .where(
            GatewayInstance.id == instance_id,
            GatewayInstance.run == holder.run,
            GatewayInstance.heartbeat_at == row.heartbeat_at,
        )
        .values({k: v for k, v in values.items() if k != "id"})
        .returning(GatewayInstance.id)
        .execution_options(synchronize_session=False)
    )
    return None if taken is not None else holder


async def heartbeat(db: AsyncSession, *, instance_id: str, run: str, now: datetime) -> bool:
    """Renew the lease; False when `run` no longer holds it (another run took it over)."""
    renewed = await db.scalar(
        update(GatewayInstance)
        .where(GatewayInstance.id == instance_id, GatewayInstance.run == run)
        .values(heartbeat_at=now)
        .returning(GatewayInstance.id)
        .execution_options(synchronize_session=False)
    )
    return renewed is not None


async def release(db: AsyncSession, *, instance_id: str, run: str) -> None:
    await db.execute(
        delete(GatewayInstance)
        .where(GatewayInstance.id == instance_id, GatewayInstance.run == run)
        .execution_options(synchronize_session=False)
    )

"""Advisories in the store: written one at a time as the advisor creates them, the "missed" records in batches;
settled once; listed by session.

SQLAlchemy Core statements built once (`turn_write.statements`), not the ORM's unit of work: the advisor writes a
"missed" record for most follow-up turns, so these are on the per-request path. The missed records of many turns go in
one transaction (`insert_missed`): on SQLite every transaction takes the single write lock that the turns' own
writes queue for, so one per turn would double the writers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from . import _convert as cv
from .errors import AdvisoryNotFound, InvalidTransition, SessionNotFound
from .models import Advisory
from .records import AdvisoryRecord, MissedTurn
from .turn_write import raw
from .turn_write import statements as sql

__all__ = ["insert_advisory", "insert_missed", "list_advisories", "resolve_advisory"]


def _values(advisory: Advisory) -> dict[str, Any]:
    return {c.key: getattr(advisory, c.key) for c in sql.ADVISORY_COLUMNS}


def insert_advisory(
    conn: Connection,
    session_id: str,
    *,
    tenant_id: str,
    kind: str,
    target_worker: str | None,
    created_at: datetime,
    expires_at: datetime,
    detail: Mapping[str, Any] | None,
    outcome: str,
    resolved_at: datetime | None,
    turn_id: str | None,
) -> AdvisoryRecord:
    if outcome != "pending":
        cv.one_of(outcome, cv.ADVISORY_OUTCOMES, "outcome")
    if (outcome == "pending") != (resolved_at is None):
        raise ValueError("an advisory has a resolved_at exactly when its outcome is not pending")
    advisory = Advisory(
        id=cv.new_id("adv_"),
        session_id=session_id,
        kind=cv.one_of(kind, cv.ADVISORY_KINDS, "kind"),
        target_worker=target_worker,
        created_at=cv.aware(created_at, "created_at"),
        expires_at=cv.aware(expires_at, "expires_at"),
        outcome=outcome,
        resolved_at=cv.aware(resolved_at, "resolved_at") if resolved_at is not None else None,
        turn_id=turn_id,
        detail=dict(detail) if detail is not None else None,
    )
    owner = conn.execute(sql.SESSION_OWNER, {"p_session": session_id}).first()
    if owner is None or owner.tenant_id != tenant_id:
        raise SessionNotFound(session_id)
    conn.execute(sql.INSERT_ADVISORY, _values(advisory))
    return cv.advisory_record(advisory)


def _missed_row(missed: MissedTurn) -> dict[str, Any]:
    at = cv.aware(missed.at, "at")
    return {
        "id": cv.new_id("adv_"),
        "session_id": missed.session_id,
        "kind": "none",
        "target_worker": None,
        "created_at": at,
        "expires_at": at,
        "outcome": "missed",
        "resolved_at": at,
        "turn_id": missed.turn_id,
        "detail": None,
    }


def insert_missed(conn: Connection, missed: Sequence[MissedTurn]) -> int:
    """Record each turn as an advisory of kind "none", settled `missed` at its time; the number written.

    A turn whose session is gone by now (deleted), or belongs to another tenant, is skipped.
    """
    if not missed:
        return 0
    ids = sorted({m.session_id for m in missed})
    owners = {row.id: row.tenant_id for row in conn.execute(sql.SESSION_OWNERS, {"p_sessions": ids})}
    rows = [_missed_row(m) for m in missed if owners.get(m.session_id) == m.tenant_id]
    if rows:
        raw.execute_many(conn, sql.INSERT_MISSED, rows)
    return len(rows)


async def resolve_advisory(
    db: AsyncSession, advisory_id: str, *, outcome: str, resolved_at: datetime, turn_id: str | None
) -> AdvisoryRecord:
    """Settle a pending advisory; `InvalidTransition` if it is settled already (an advisory is settled once)."""
    values = {
        Advisory.outcome: cv.one_of(outcome, cv.ADVISORY_OUTCOMES, "outcome"),
        Advisory.resolved_at: cv.aware(resolved_at, "resolved_at"),
        Advisory.turn_id: turn_id,
    }
    row = await db.scalar(
        update(Advisory)
        .where(Advisory.id == advisory_id, Advisory.outcome == "pending")
        .values(values)
        .returning(Advisory)
        .execution_options(populate_existing=True)
    )
    if row is not None:
        return cv.advisory_record(row)
    current = await db.scalar(select(Advisory.outcome).where(Advisory.id == advisory_id))
    if current is None:
        raise AdvisoryNotFound(advisory_id)
    raise InvalidTransition(f"advisory {advisory_id!r} is already resolved ({current})")


async def list_advisories(
    db: AsyncSession, session_id: str, *, outcome: str | None, limit: int
) -> list[AdvisoryRecord]:
    """The session's advisories, oldest first (the caller has checked the session is the tenant's)."""
    stmt = select(Advisory).where(Advisory.session_id == session_id)
    if outcome is not None:
        stmt = stmt.where(Advisory.outcome == outcome)
    stmt = stmt.order_by(Advisory.created_at, Advisory.id).limit(limit)
    return [cv.advisory_record(row) for row in await db.scalars(stmt)]

"""Turn rows through the ORM, for the API's and the admin's calls: a session's turns a page at a time with their
tool calls and settled advisories, its context's turns, and the pending turns failed at start-up.

A turn's own writes, from `begin_turn` to its end, are the per-turn write path (`turn_write.persist`); these are
the reads and the one bulk update, as functions over an `AsyncSession` whose transaction the store opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from .models import Advisory, Turn
from .records import TurnAdvisory
from .turn_write import statements as sql

__all__ = ["context_turns", "fail_pending_turns", "list_turns", "turn_advisories"]


async def context_turns(db: AsyncSession, session_id: str, *, before_seq: int | None = None) -> Sequence[Row[Any]]:
    """The ok turns from the last context reset on (of those before `before_seq`), in seq order, with only what the
    context needs."""
    rows: Sequence[Row[Any]] = (await db.execute(sql.context_turns(session_id, before_seq=before_seq))).all()
    return rows


async def list_turns(db: AsyncSession, session_id: str, *, limit: int, after_seq: int | None) -> Sequence[Turn]:
    stmt = select(Turn).where(Turn.session_id == session_id)
    if after_seq is not None:
        stmt = stmt.where(Turn.seq > after_seq)
    stmt = stmt.order_by(Turn.seq).limit(limit).options(selectinload(Turn.tool_calls))
    return (await db.scalars(stmt)).all()


async def turn_advisories(db: AsyncSession, session_id: str, turn_ids: Sequence[str]) -> dict[str, TurnAdvisory]:
    """The settled advisory of each of these turns that has one, in one query for a whole page of turns.

    Filtered by session first, so the (session_id, created_at) index serves it. A turn normally has at most one
    (the advisory its request claimed, or its "missed" record); should two name it, the later-resolved wins.
    """
    if not turn_ids:
        return {}
    rows = await db.execute(
        select(Advisory.id, Advisory.kind, Advisory.outcome, Advisory.target_worker, Advisory.turn_id)
        .where(Advisory.session_id == session_id, Advisory.turn_id.in_(turn_ids), Advisory.outcome != "pending")
        .order_by(Advisory.resolved_at, Advisory.id)
    )
    return {
        row.turn_id: TurnAdvisory(id=row.id, kind=row.kind, outcome=row.outcome, target_worker=row.target_worker)
        for row in rows
    }


async def fail_pending_turns(
    db: AsyncSession,
    *,
    older_than: datetime | None,
    error_type: str,
    error_message: str,
    now: datetime,
    gateway_instance: str | None = None,
    except_run: str | None = None,
) -> int:
    # 'pending' written as the pending turns' partial index has it: a planner that plans without the bound values
    # (PostgreSQL's generic plan of a prepared statement) cannot use that index for `status = $1`.
    stmt = update(Turn).where(Turn.status == literal_column("'pending'"))
    if older_than is not None:
        stmt = stmt.where(Turn.received_at < older_than)
    if gateway_instance is not None:
        stmt = stmt.where(Turn.gateway_instance == gateway_instance)
        if except_run is not None:
            stmt = stmt.where(Turn.gateway_run != except_run)
    failed = await db.scalars(
        stmt.values(status="failed", error={"type": error_type, "message": error_message}, ended_at=now)
        .returning(Turn.id)
        .execution_options(synchronize_session=False)
    )
    return len(failed.all())

"""Session rows through the ORM: created (with their tenant on first use), read, listed a page at a time, updated
and deleted, for `SqlSessionStore`, which opens each call's transaction.

These are the API's and the admin's calls, not the per-turn path: a turn claims its session's row with Core
statements of its own (`turn_write.persist.begin_turn`). Listings are keyset pages, newest first (`newest_first`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from . import _convert as cv
from ._sql import insert_on_conflict, session_values, tenant_values
from .errors import SessionExists, SessionNotFound
from .models import Session, Tenant
from .records import Page, SessionRecord
from .turn_write import statements as sql

__all__ = [
    "delete_session",
    "find_session",
    "get_or_create_session",
    "insert_session",
    "list_sessions",
    "newest_first",
    "search_sessions",
    "session_row",
    "update_session",
]


async def insert_session(
    db: AsyncSession,
    backend: str,
    session_id: str,
    tenant_id: str,
    *,
    priority: int,
    metadata: Mapping[str, Any],
    now: datetime,
) -> Session | None:
    """The new session's row, its tenant created on first use; None when the id is taken."""
    await db.execute(insert_on_conflict(backend, Tenant, tenant_values(tenant_id, now)))
    values = session_values(session_id, tenant_id, now=now, priority=priority, metadata=metadata)
    return await db.scalar(insert_on_conflict(backend, Session, values).returning(Session))


async def session_row(db: AsyncSession, session_id: str, tenant_id: str) -> Session:
    """The tenant's session; `SessionNotFound` for another tenant's, as for one that does not exist."""
    row = await db.scalar(select(Session).where(Session.id == session_id, Session.tenant_id == tenant_id))
    if row is None:
        raise SessionNotFound(session_id)
    return row


async def get_or_create_session(
    db: AsyncSession, backend: str, session_id: str, tenant_id: str, *, clock: Callable[[], datetime]
) -> tuple[Session, bool]:
    """The session and whether this call created it; `clock` is read only to create it."""
    by_id = {"p_session": session_id}
    row = await db.scalar(sql.SESSION_BY_ID, by_id)
    if row is None:
        row = await insert_session(db, backend, session_id, tenant_id, priority=0, metadata={}, now=clock())
        if row is not None:
            return row, True
        # Another caller inserted it since our SELECT (its transaction has committed by now).
        row = await db.scalar(sql.SESSION_BY_ID, by_id, execution_options={"populate_existing": True})
        if row is None:
            raise SessionNotFound(session_id)  # and it was deleted again in between
    if row.tenant_id != tenant_id:
        raise SessionExists(session_id)
    return row, False


async def list_sessions(
    db: AsyncSession, *, tenant_id: str, limit: int, after: str | None, state: str | None
) -> Page[SessionRecord]:
    stmt = select(Session).where(Session.tenant_id == tenant_id)
    if state is not None:
        stmt = stmt.where(Session.state == cv.one_of(state, cv.SESSION_STATES, "state"))
    return await newest_first(
        db, stmt, Session.created_at, after=after, limit=limit, cursor_scope=(Session.tenant_id == tenant_id,)
    )


async def update_session(db: AsyncSession, session_id: str, tenant_id: str, values: dict[Any, Any]) -> Session:
    """The row with `values` set; the row as it is when there are none."""
    if not values:
        return await session_row(db, session_id, tenant_id)
    row = await db.scalar(
        update(Session)
        .where(Session.id == session_id, Session.tenant_id == tenant_id)
        .values(values)
        .returning(Session)
        .execution_options(populate_existing=True)
    )
    if row is None:
        raise SessionNotFound(session_id)
    return row


async def delete_session(db: AsyncSession, session_id: str, tenant_id: str) -> None:
    deleted = await db.scalar(
        delete(Session)
        .where(Session.id == session_id, Session.tenant_id == tenant_id)
        .returning(Session.id)
        .execution_options(synchronize_session=False)
    )
    if deleted is None:
        raise SessionNotFound(session_id)


async def find_session(db: AsyncSession, session_id: str) -> Session:
    """The session of any tenant (administration)."""
    row = await db.get(Session, session_id)
    if row is None:
        raise SessionNotFound(session_id)
    return row


async def search_sessions(
    db: AsyncSession,
    *,
    tenant_id: str | None,
    state: str | None,
    active_after: datetime | None,
    active_before: datetime | None,
    min_priority: int | None,
    max_priority: int | None,
    limit: int,
    after: str | None,
    min_prefix_breaks: int | None = None,
) -> Page[SessionRecord]:
    """Sessions across tenants (administration), the most recently active first."""
    stmt = select(Session)
    if tenant_id is not None:
        stmt = stmt.where(Session.tenant_id == tenant_id)
    if state is not None:
        stmt = stmt.where(Session.state == cv.one_of(state, cv.SESSION_STATES, "state"))
    if active_after is not None:
        stmt = stmt.where(Session.last_active_at >= cv.aware(active_after, "active_after"))
    if active_before is not None:
        stmt = stmt.where(Session.last_active_at < cv.aware(active_before, "active_before"))
    if min_priority is not None:
        stmt = stmt.where(Session.priority >= min_priority)
    if max_priority is not None:
        stmt = stmt.where(Session.priority <= max_priority)
    if min_prefix_breaks is not None:
        stmt = stmt.where(Session.prefix_breaks >= min_prefix_breaks)
    return await newest_first(db, stmt, Session.last_active_at, after=after, limit=limit)


async def newest_first(
    db: AsyncSession,
    stmt: Select[Session],
    column: InstrumentedAttribute[datetime],
    *,
    after: str | None,
    limit: int,
    cursor_scope: tuple[ColumnElement[bool], ...] = (),
) -> Page[SessionRecord]:
    """One page of sessions, newest `column` first and ties by id (keyset pagination: `after` is the last id
    of the previous page; `cursor_scope` restricts which sessions may serve as that cursor)."""
    if after is not None:
        cursor = await db.scalar(select(column).where(Session.id == after, *cursor_scope))
        if cursor is None:
            raise SessionNotFound(after)
        stmt = stmt.where(or_(column < cursor, and_(column == cursor, Session.id > after)))
    rows = (await db.scalars(stmt.order_by(column.desc(), Session.id).limit(limit + 1))).all()
    return Page(items=[cv.session_record(row) for row in rows[:limit]], has_more=len(rows) > limit)


async def find_extended_sessions(
    db: AsyncSession, tenant_id: str, contexts: Sequence[tuple[str, int]], *, limit: int
) -> list[tuple[str, int]]:
    """The tenant's active sessions whose (context_digest, context_length) is one of `contexts`, longest context
    first; of the longest length found, at most `limit` (two tell an ambiguous match from a unique one)."""
    if not contexts:
        return []
    digests = [digest for digest, _ in contexts]
    rows = (
        await db.execute(
            select(Session.id, Session.context_length, Session.context_digest)
            .where(Session.tenant_id == tenant_id, Session.state == "active", Session.context_digest.in_(digests))
            .order_by(Session.context_length.desc(), Session.id)
            .limit(64)
        )
    ).all()
    wanted = set(contexts)
    found = [(row.id, row.context_length) for row in rows if (row.context_digest, row.context_length) in wanted]
    if not found:
        return []
    longest = found[0][1]
    return [match for match in found if match[1] == longest][:limit]

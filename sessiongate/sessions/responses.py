"""The stored Responses API responses (`ResponseRow`): each is a turn of the session its chain is.

A response's *context* (what the next response in its chain continues) is the session's context as it stood after
that turn: the ok turns up to its seq, folded as `history.context_messages` folds them. Reading it per turn keeps
the row small (no copy of the conversation per response) and makes a chain that branches from an older response
see exactly the context that response saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from . import history
from .errors import ResponseNotFound
from .models import ResponseRow, Turn
from .records import ResponseRecord

__all__ = [
    "delete_response",
    "insert_response_sync",
    "response_context_sync",
    "response_row",
]


def _record(row: Any) -> ResponseRecord:
    """A `ResponseRow`, or a Core row of its columns (the per-request path reads those)."""
    return ResponseRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        session_id=row.session_id,
        turn_id=row.turn_id,
        previous_response_id=row.previous_response_id,
        instructions=row.instructions,
        input_items=[dict(item) for item in row.input_items],
        body=dict(row.body),
        created_at=row.created_at,
    )


async def response_row(db: AsyncSession, response_id: str, tenant_id: str) -> ResponseRow:
    """The tenant's response; `ResponseNotFound` for another tenant's, as for one that does not exist."""
    row = await db.scalar(select(ResponseRow).where(ResponseRow.id == response_id, ResponseRow.tenant_id == tenant_id))
    if row is None:
        raise ResponseNotFound(response_id)
    return row


async def get_response(db: AsyncSession, response_id: str, tenant_id: str) -> ResponseRecord:
    return _record(await response_row(db, response_id, tenant_id))


async def delete_response(db: AsyncSession, response_id: str, tenant_id: str) -> tuple[ResponseRecord, bool]:
    """Delete the tenant's response; returns it and whether it was its chain's last (the session's newest)."""
    row = await response_row(db, response_id, tenant_id)
    newest = await db.scalar(
        select(ResponseRow.id)
        .where(ResponseRow.session_id == row.session_id)
        .order_by(ResponseRow.created_at.desc())
        .limit(1)
    )
    record = _record(row)
    await db.delete(row)
    return record, newest == response_id


# The per-request path: plain `Connection` work, run by the store's `_per_request` (on an SQLite file, in the group
# commit's transaction on its thread, without aiosqlite's hop per statement), as a chat turn's own writes are.


def insert_response_sync(conn: Connection, values: Mapping[str, Any]) -> None:
    conn.execute(insert(ResponseRow).values(**values))


def response_context_sync(
    conn: Connection, response_id: str, tenant_id: str
) -> tuple[ResponseRecord, list[dict[str, Any]]]:
    row = conn.execute(
        select(ResponseRow).where(ResponseRow.id == response_id, ResponseRow.tenant_id == tenant_id)
    ).first()
    if row is None:
        raise ResponseNotFound(response_id)
    seq = conn.scalar(select(Turn.seq).where(Turn.id == row.turn_id))
    turns = conn.execute(
        select(Turn.seq, Turn.status, Turn.context_reset, Turn.input_messages, Turn.output_message)
        .where(Turn.session_id == row.session_id, Turn.status == "ok", Turn.seq <= (seq or 0))
        .order_by(Turn.seq)
    ).all()
    return _record(row), history.context_messages(turns)

"""Forking a session: a new session of the same tenant whose context is its parent's, up to a turn.

The child's first turn (seq 1) is the parent's context as of that turn, recorded `ok` with `context_reset` and no
output (`request.forked_from` names the parent and the turn), and the child's context digest and length are set to
it in the same transaction. So the child's next request, which resends that context and adds to it, extends the
child's context like any turn, and its prompt's prefix is the parent's token for token: on the worker (same tenant,
same cache salt) it is a cache hit, not a new prefill.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from . import _convert as cv
from . import history
from .errors import SessionExists, TurnNotFound
from .models import Turn
from .records import SessionRecord
from .session_rows import insert_session, session_row

__all__ = ["fork_session"]


async def fork_session(
    db: AsyncSession,
    backend: str,
    parent_id: str,
    *,
    tenant_id: str,
    child_id: str,
    at_seq: int | None,
    metadata: Mapping[str, Any],
    now: datetime,
) -> tuple[SessionRecord, int]:
    """The child session and the number of messages of context it shares with its parent."""
    parent = await session_row(db, parent_id, tenant_id)
    stmt = select(Turn.seq, Turn.status, Turn.context_reset, Turn.input_messages, Turn.output_message).where(
        Turn.session_id == parent_id, Turn.status == "ok"
    )
    if at_seq is not None:
        stmt = stmt.where(Turn.seq <= at_seq)
    turns = (await db.execute(stmt.order_by(Turn.seq))).all()
    if at_seq is not None and not any(turn.seq == at_seq for turn in turns):
        raise TurnNotFound(f"{parent_id}#{at_seq}")
    context = history.context_messages(turns)
    row = await insert_session(
        db, backend, child_id, tenant_id, priority=parent.priority, metadata=dict(metadata), now=now
    )
    if row is None:
        raise SessionExists(child_id)
    if context:
        db.add(
            Turn(
                id=cv.new_id("turn_"),
                session_id=child_id,
                seq=1,
                status="ok",
                input_messages=context,
                context_reset=True,
                request={"forked_from": parent_id, "at_turn": at_seq if at_seq is not None else parent.turn_count},
                received_at=now,
                ended_at=now,
                session_source="fork",
            )
        )
        row.context_digest = history.context_digest(context)
        row.context_length = len(context)
        row.context_seq = 1
        row.turn_count = 1
        await db.flush()
    return cv.session_record(row), len(context)

"""Tool calls in the store, through the ORM: a result posted through the API, and the calls still waiting for one.

A call is inserted when the answer that requests it completes its turn, and closed by a later request's role=tool
message (both on the per-turn write path, `turn_write.persist`); these are the API's calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from . import _convert as cv
from .errors import InvalidTransition, ToolCallNotFound
from .models import ToolCall

__all__ = ["pending_tool_calls", "record_tool_result"]


async def record_tool_result(
    db: AsyncSession, session_id: str, call_id: str, *, content: str, returned_at: datetime
) -> ToolCall:
    """Set a tool call's result from the API; the same result twice is a no-op, a different one an error."""
    by_call = select(ToolCall).where(ToolCall.session_id == session_id, ToolCall.call_id == call_id)
    call = await db.scalar(by_call)
    if call is None:
        raise ToolCallNotFound(session_id, call_id)
    if call.result is None:
        updated = await db.scalar(
            update(ToolCall)
            .where(ToolCall.id == call.id, ToolCall.result.is_(None))
            .values(
                result=content,
                returned_at=returned_at,
                duration_ms=cv.duration_ms(call.requested_at, returned_at),
                result_source="api",
            )
            .returning(ToolCall)
            .execution_options(populate_existing=True)
        )
        if updated is not None:
            return updated
        call = await db.scalar(by_call.execution_options(populate_existing=True))  # someone else was first
        if call is None:
            raise ToolCallNotFound(session_id, call_id)
    if call.result != content:
        raise InvalidTransition(f"tool call {call_id!r} already has a different result")
    return call


async def pending_tool_calls(db: AsyncSession, session_id: str) -> Sequence[ToolCall]:
    """The session's calls without a result, oldest first."""
    rows = await db.scalars(
        select(ToolCall)
        .where(ToolCall.session_id == session_id, ToolCall.result.is_(None))
        .order_by(ToolCall.requested_at, ToolCall.id)
    )
    return rows.all()

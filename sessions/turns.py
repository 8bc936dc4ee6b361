"""Turn and tool-call operations, as functions over an `AsyncSession` whose transaction the caller owns.

`SqlSessionStore` opens one session and transaction per call and delegates here. State changes are
conditional UPDATEs (`... WHERE status = 'pending'`), so two replicas racing to finish the same turn cannot
both win; the loser gets `InvalidTransition`. `begin_turn` starts with the UPDATE of the session row: that
takes the write lock first (SQLite) or the row lock (PostgreSQL), which serialises turns of one session
and makes the seq allocation and the history comparison consistent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, literal, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import load_only, selectinload

from . import history
from ._convert import duration_ms, int_or_none, new_id
from .errors import InvalidTransition, SessionNotFound, ToolCallNotFound, TurnNotFound
from .models import Session, ToolCall, Turn, UTCDateTime

__all__ = [
    "begin_turn",
    "complete_turn",
    "context_turns",
    "fail_pending_turns",
    "fail_turn",
    "list_turns",
    "mark_dispatched",
    "record_tool_result",
    "session_row",
]


async def session_row(db: AsyncSession, session_id: str, tenant_id: str) -> Session:
    row = await db.scalar(select(Session).where(Session.id == session_id, Session.tenant_id == tenant_id))
    if row is None:
        raise SessionNotFound(session_id)
    return row


async def context_turns(db: AsyncSession, session_id: str) -> Sequence[Turn]:
    """The ok turns from the last context reset on, in seq order, with only what the context needs."""
    last_reset = (
        select(func.coalesce(func.max(Turn.seq), 0))
        .where(Turn.session_id == session_id, Turn.status == "ok", Turn.context_reset.is_(True))
        .scalar_subquery()
    )
    stmt = (
        select(Turn)
        .where(Turn.session_id == session_id, Turn.status == "ok", Turn.seq >= last_reset)
        .order_by(Turn.seq)
        .options(load_only(Turn.status, Turn.context_reset, Turn.input_messages, Turn.output_message, raiseload=True))
    )
    return (await db.scalars(stmt)).all()


def _later(column: Any, value: datetime) -> Any:
    """SQL for max(column, value), so that an older event never moves last_active_at back."""
    bound = literal(value, UTCDateTime())
    return case((column < bound, bound), else_=column)


async def begin_turn(
    db: AsyncSession,
    session_id: str,
    *,
    tenant_id: str,
    messages: Sequence[Mapping[str, Any]],
    request: Mapping[str, Any],
    received_at: datetime,
) -> Turn:
    seq = await db.scalar(
        update(Session)
        .where(Session.id == session_id, Session.tenant_id == tenant_id, Session.state == "active")
        .values(
            {
                Session.turn_count: Session.turn_count + 1,
                Session.last_active_at: _later(Session.last_active_at, received_at),
            }
        )
        .returning(Session.turn_count)
        .execution_options(synchronize_session=False)
    )
    if seq is None:
        await session_row(db, session_id, tenant_id)  # raises SessionNotFound
        raise InvalidTransition(f"session {session_id!r} is closed")

    delta = history.split_delta(history.context_messages(await context_turns(db, session_id)), messages)
    turn = Turn(
        id=new_id("turn_"),
        session_id=session_id,
        seq=seq,
        status="pending",
        input_messages=delta.input_messages,
        context_reset=delta.context_reset,
        request=dict(request),
        received_at=received_at,
    )
    db.add(turn)

    results: dict[str, str] = {}
    for call_id, text in history.tool_results(delta.input_messages):
        results.setdefault(call_id, text)
    if results:
        pending = await db.scalars(
            select(ToolCall)
            .where(ToolCall.session_id == session_id, ToolCall.call_id.in_(results), ToolCall.result.is_(None))
            .with_for_update()
        )
        for call in pending:
            call.result = results[call.call_id]
            call.returned_at = received_at
            call.duration_ms = duration_ms(call.requested_at, received_at)
            call.result_source = "message"
    await db.flush()
    return turn


async def _pending_turn_update(db: AsyncSession, turn_id: str, values: Mapping[str, Any]) -> Turn:
    row = await db.scalar(
        update(Turn)
        .where(Turn.id == turn_id, Turn.status == "pending")
        .values(dict(values))
        .returning(Turn)
        .execution_options(populate_existing=True)
    )
    if row is not None:
        return row
    status = await db.scalar(select(Turn.status).where(Turn.id == turn_id))
    if status is None:
        raise TurnNotFound(turn_id)
    raise InvalidTransition(f"turn {turn_id!r} is {status}, not pending")


async def _touch_session(db: AsyncSession, session_id: str, at: datetime) -> None:
    await db.execute(
        update(Session)
        .where(Session.id == session_id)
        .values({Session.last_active_at: _later(Session.last_active_at, at)})
        .execution_options(synchronize_session=False)
    )


async def mark_dispatched(db: AsyncSession, turn_id: str, *, worker: str, dispatched_at: datetime) -> None:
    await _pending_turn_update(db, turn_id, {"worker": worker, "dispatched_at": dispatched_at})


async def complete_turn(
    db: AsyncSession,
    turn_id: str,
    *,
    output_message: Mapping[str, Any],
    finish_reason: str | None,
    model: str | None,
    usage: Mapping[str, Any] | None,
    cached_tokens_details: Mapping[str, Any] | None,
    first_token_at: datetime | None,
    ended_at: datetime,
    worker: str | None,
    dispatched_at: datetime | None = None,
) -> tuple[Turn, list[ToolCall]]:
    usage = usage or {}
    prompt_details = usage.get("prompt_tokens_details")
    cached_tokens = int_or_none(prompt_details.get("cached_tokens")) if isinstance(prompt_details, Mapping) else None
    details = dict(cached_tokens_details) if cached_tokens_details is not None else None
    values: dict[str, Any] = {
        "status": "ok",
        "output_message": dict(output_message),
        "finish_reason": finish_reason,
        "model": model,
        "first_token_at": first_token_at,
        "ended_at": ended_at,
        "prompt_tokens": int_or_none(usage.get("prompt_tokens")),
        "completion_tokens": int_or_none(usage.get("completion_tokens")),
        "cached_tokens": cached_tokens,
        "cached_tokens_details": details,
        "cached_device": int_or_none((details or {}).get("device")),
        "cached_host": int_or_none((details or {}).get("host")),
        "cached_storage": int_or_none((details or {}).get("storage")),
    }
    if worker is not None:
        values["worker"] = worker
    if dispatched_at is not None:
        values["dispatched_at"] = dispatched_at
    turn = await _pending_turn_update(db, turn_id, values)
    await _touch_session(db, turn.session_id, ended_at)

    requested = history.requested_tool_calls(output_message)
    taken: set[str] = set()
    if requested:
        taken = set(
            await db.scalars(
                select(ToolCall.call_id).where(
                    ToolCall.session_id == turn.session_id,
                    ToolCall.call_id.in_([call.call_id for call in requested]),
                )
            )
        )
    calls: list[ToolCall] = []
    for call in requested:
        if call.call_id in taken:  # a model that reuses ids: the first call keeps the row
            continue
        taken.add(call.call_id)
        calls.append(
            ToolCall(
                session_id=turn.session_id,
                turn_id=turn.id,
                call_id=call.call_id,
                name=call.name,
                arguments=call.arguments,
                requested_at=ended_at,
            )
        )
    db.add_all(calls)
    await db.flush()
    return turn, calls


async def fail_turn(
    db: AsyncSession,
    turn_id: str,
    *,
    status: str,
    error_type: str,
    error_message: str,
    ended_at: datetime,
    partial_output: Mapping[str, Any] | None,
    first_token_at: datetime | None,
    worker: str | None = None,
    dispatched_at: datetime | None = None,
) -> Turn:
    """End a pending turn without an answer (`status` is "failed" or "cancelled")."""
    values: dict[str, Any] = {
        "status": status,
        "error": {"type": error_type, "message": error_message},
        "ended_at": ended_at,
        "output_message": dict(partial_output) if partial_output is not None else None,
    }
    if first_token_at is not None:
        values["first_token_at"] = first_token_at
    if worker is not None:
        values["worker"] = worker
    if dispatched_at is not None:
        values["dispatched_at"] = dispatched_at
    turn = await _pending_turn_update(db, turn_id, values)
    await _touch_session(db, turn.session_id, ended_at)
    return turn


async def list_turns(db: AsyncSession, session_id: str, *, limit: int, after_seq: int | None) -> Sequence[Turn]:
    stmt = select(Turn).where(Turn.session_id == session_id)
    if after_seq is not None:
        stmt = stmt.where(Turn.seq > after_seq)
    stmt = stmt.order_by(Turn.seq).limit(limit).options(selectinload(Turn.tool_calls))
    return (await db.scalars(stmt)).all()


async def fail_pending_turns(
    db: AsyncSession, *, older_than: datetime | None, error_type: str, error_message: str, now: datetime
) -> int:
    stmt = update(Turn).where(Turn.status == "pending")
    if older_than is not None:
        stmt = stmt.where(Turn.received_at < older_than)
    failed = await db.scalars(
        stmt.values(status="failed", error={"type": error_type, "message": error_message}, ended_at=now)
        .returning(Turn.id)
        .execution_options(synchronize_session=False)
    )
    return len(failed.all())


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
                duration_ms=duration_ms(call.requested_at, returned_at),
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

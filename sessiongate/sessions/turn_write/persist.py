"""Persisting a chat turn: `begin_turn`, `mark_dispatched`, `complete_turn`, `fail_turn`, as functions of SQLAlchemy
Core over a synchronous `Connection` whose transaction the caller owns. `begin_turn` returns the pending turn's
record; a turn's end returns nothing (nobody reads it back on the chat path, and its 30-field record was 6% of a
chat turn's instructions).

The store runs each call's whole transaction in one step (`StoreTransactions._per_request`: the group commit on an
SQLite file, `run_sync` on PostgreSQL), with the statements built once (`statements`) and, on SQLite, run straight on
the driver (`raw`). State changes are conditional UPDATEs (`... WHERE status = 'pending'`), so two replicas racing to
finish the same turn cannot both win; the loser gets `InvalidTransition`.

`begin_turn` starts with the UPDATE of the session row: that takes the write lock first (SQLite) or the row lock
(PostgreSQL), which serialises turns of one session and makes the seq allocation and the comparison with the
session's context digest consistent. It never reads the turns: the session row keeps the context's digest, its
length and the highest seq folded into it (`context_seq`). `complete_turn` locks the session row after its turn
and folds the ok turn into the digest when it is newer than every turn already folded in; a turn that completes
out of seq order (another request of the session overtook it) rebuilds the digest from the turns instead. So the
digest always describes `history.context_messages` of the session's ok turns, as `session_context` reads them.

A store keeps `memory.StoreMemory`: what it knows from its own writes. Completing a turn it began and has not ended
reads nothing back, and the session's context moves in one conditional UPDATE when it is still the context the turn
extends (the usual case); when it is not (another request of the session, possibly on another replica, ended
meanwhile), or when the turn is not known here, the general path runs. Likewise a turn of a session whose row this
store's last write left claims its seq with one UPDATE that checks the row is still as remembered, instead of one
that returns the row, and its resent history is compared with the session's remembered context instead of hashed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import Connection, Row
from sqlalchemy.sql.dml import Update

from sessiongate.sessions import _convert as cv
from sessiongate.sessions import history
from sessiongate.sessions._sql import session_values, tenant_values
from sessiongate.sessions.errors import InvalidTransition, SessionExists, SessionNotFound, TurnNotFound
from sessiongate.sessions.records import TurnRecord

from . import raw
from . import statements as sql
from .memory import BegunTurn, ClaimedRow, RememberedContext, StoreMemory

__all__ = ["begin_turn", "complete_turn", "fail_turn", "mark_dispatched"]


def begin_turn(
    conn: Connection,
    session_id: str,
    *,
    tenant_id: str,
    messages: Sequence[Mapping[str, Any]],
    request: Mapping[str, Any],
    received_at: datetime,
    create_session: bool,
    clock: Callable[[], datetime],
    gateway_instance: str | None = None,
    gateway_run: str | None = None,
    memory: StoreMemory | None = None,
    session_source: str | None = None,
) -> TurnRecord:
    context = _claim_seq(conn, session_id, tenant_id, received_at, memory)
    if context is None and create_session:
        context = _create_for_turn(conn, session_id, tenant_id, received_at, clock(), memory)
    if context is None:
        _raise_not_active(conn, session_id, tenant_id, create_session=create_session)
    seq, digest, length, priority = context

    normalised = [history.normalise_message(message) for message in messages]
    known = memory.context(session_id, digest, length) if memory is not None else None
    extends = history.starts_with_context(digest, length, normalised, known.messages if known is not None else None)
    start = length if extends else 0  # the first new message: the context's end, or all of them on a reset
    input_messages = [dict(message) for message in messages[start:]]
    turn_id = cv.new_id("turn_")
    values = {
        "id": turn_id,
        "session_id": session_id,
        "seq": seq,
        "status": "pending",
        "input_messages": input_messages,
        "context_reset": not extends,
        "request": dict(request),
        "received_at": received_at,
        "session_source": session_source,
    }
    raw.execute(conn, sql.INSERT_TURN, {**values, "gateway_instance": gateway_instance, "gateway_run": gateway_run})
    _return_tool_calls(conn, session_id, input_messages, received_at)
    if memory is not None:
        # The context the turn's input extends: the remembered one, else the request's first messages (none on a
        # reset), which matched the row's digest.
        base = known if extends and known is not None else None
        if base is None:
            kept = normalised[:start]
            base = RememberedContext(
                digest if extends else history.EMPTY_DIGEST, start, kept, sum(map(history.message_chars, kept))
            )
        with_input = base.extended(normalised[start:])
        memory.add(turn_id, BegunTurn(values, (digest, length) if extends else None, with_input))
    return cv.pending_turn_record(values, session_priority=priority)


def _claim_seq(
    conn: Connection, session_id: str, tenant_id: str, received_at: datetime, memory: StoreMemory | None
) -> tuple[int, str, int, int] | None:
    """The next seq, the context (digest, length) and the priority of an active session of this tenant; None if
    there is none.

    When this store's own writes left the session's row, the claim is one UPDATE that checks every value it
    relies on (a row another writer changed meanwhile matches no row, and the claim reads it back instead): on
    SQLite an UPDATE with RETURNING runs through a temporary table, which cost about as much as the UPDATE."""
    if memory is not None and (known := memory.session(session_id)) is not None:
        checked = {
            "p_session": session_id,
            "p_tenant": tenant_id,
            "p_at": received_at,
            "p_turn_count": known.turn_count,
            "p_digest": known.digest,
            "p_length": known.length,
            "p_priority": known.priority,
        }
        if raw.count(conn, sql.CLAIM_KNOWN_SEQ, checked):
            claimed = ClaimedRow(known.turn_count + 1, known.digest, known.length, known.priority)
            memory.remember_session(session_id, claimed)
            return claimed.turn_count, claimed.digest, claimed.length, claimed.priority
    rows = raw.execute(conn, sql.CLAIM_SEQ, {"p_session": session_id, "p_tenant": tenant_id, "p_at": received_at})
    if not rows:
        if memory is not None:
            memory.forget_session(session_id)
        return None
    row = rows[0]
    if memory is not None:
        memory.remember_session(
            session_id, ClaimedRow(row.turn_count, row.context_digest, row.context_length, row.priority)
        )
    return row.turn_count, row.context_digest, row.context_length, row.priority


def _create_for_turn(
    conn: Connection,
    session_id: str,
    tenant_id: str,
    received_at: datetime,
    now: datetime,
    memory: StoreMemory | None,
) -> tuple[int, str, int, int] | None:
    """Create the session with this turn as its first; if another request created it meanwhile, join that one."""
    inserts = sql.INSERTS[conn.dialect.name]
    raw.execute(conn, inserts.tenant, tenant_values(tenant_id, now))
    values = session_values(session_id, tenant_id, now=now, turn_count=1, last_active_at=max(now, received_at))
    if raw.count(conn, inserts.session, values):
        if memory is not None:
            memory.remember_session(session_id, ClaimedRow(1, history.EMPTY_DIGEST, 0, values["priority"]))
        return 1, history.EMPTY_DIGEST, 0, values["priority"]
    # The other request's transaction has committed by now (ON CONFLICT waited for it): its row is visible.
    return _claim_seq(conn, session_id, tenant_id, received_at, memory)


def _raise_not_active(conn: Connection, session_id: str, tenant_id: str, *, create_session: bool) -> NoReturn:
    row = conn.execute(sql.SESSION_OWNER, {"p_session": session_id}).first()
    if row is not None and row.tenant_id != tenant_id and create_session:
        raise SessionExists(session_id)  # as get_or_create_session: the id is taken by another tenant
    if row is None or row.tenant_id != tenant_id:
        raise SessionNotFound(session_id)
    raise InvalidTransition(f"session {session_id!r} is closed")


def _return_tool_calls(
    conn: Connection, session_id: str, messages: Sequence[Mapping[str, Any]], received_at: datetime
) -> None:
    """Record the results that role=tool messages bring for calls still waiting for one."""
    results: dict[str, str] = {}
    for call_id, text in history.tool_results(messages):
        results.setdefault(call_id, text)
    if not results:
        return
    pending = conn.execute(sql.PENDING_TOOL_CALLS, {"p_session": session_id, "p_call_ids": list(results)}).all()
    if pending:
        conn.execute(
            sql.RETURN_TOOL_CALLS,
            [
                {
                    "p_call": call.id,
                    "p_result": results[call.call_id],
                    "p_duration_ms": cv.duration_ms(call.requested_at, received_at),
                    "p_at": received_at,
                }
                for call in pending
            ],
        )


def _end_pending(conn: Connection, statement: Update, params: dict[str, Any]) -> Any:
    rows = raw.execute(conn, statement, params)
    if not rows:
        _raise_not_pending(conn, params["p_turn"])
    return rows[0]


def _raise_not_pending(conn: Connection, turn_id: str) -> NoReturn:
    status = conn.scalar(sql.TURN_STATUS, {"p_turn": turn_id})
    if status is None:
        raise TurnNotFound(turn_id)
    raise InvalidTransition(f"turn {turn_id!r} is {status}, not pending")


def _touch_session(conn: Connection, session_id: str, at: datetime) -> Any:
    """Move last_active_at (never back) and return the context, holding the session's row lock from now on."""
    (row,) = raw.execute(conn, sql.TOUCH_SESSION, {"p_session": session_id, "p_at": at})
    return row


def mark_dispatched(conn: Connection, turn_id: str, *, worker: str, dispatched_at: datetime) -> None:
    params = {"p_turn": turn_id, "p_worker": worker, "p_dispatched_at": dispatched_at}
    if not raw.execute(conn, sql.MARK_DISPATCHED, params):
        _raise_not_pending(conn, turn_id)


def complete_turn(
    conn: Connection,
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
    memory: StoreMemory | None = None,
) -> None:
    usage = usage or {}
    prompt_details = usage.get("prompt_tokens_details")
    cached_tokens = None
    # `type(...) is dict` first: the ABC's instance check on a plain dict (what the usage is) costs more.
    if type(prompt_details) is dict or isinstance(prompt_details, Mapping):
        cached_tokens = cv.int_or_none(prompt_details.get("cached_tokens"))
    details = dict(cached_tokens_details) if cached_tokens_details is not None else None
    params = {
        "p_turn": turn_id,
        "p_output_message": dict(output_message),
        "p_finish_reason": finish_reason,
        "p_model": model,
        "p_first_token_at": first_token_at,
        "p_ended_at": ended_at,
        "p_prompt_tokens": cv.int_or_none(usage.get("prompt_tokens")),
        "p_completion_tokens": cv.int_or_none(usage.get("completion_tokens")),
        "p_cached_tokens": cached_tokens,
        "p_cached_tokens_details": details,
        "p_cached_device": cv.int_or_none((details or {}).get("device")),
        "p_cached_host": cv.int_or_none((details or {}).get("host")),
        "p_cached_storage": cv.int_or_none((details or {}).get("storage")),
        "p_worker": worker,
        "p_dispatched_at": dispatched_at,
    }
    known = memory.pop(turn_id) if memory is not None else None
    if known is not None:
        assert memory is not None
        _complete_begun(conn, known, params, memory)
        return
    turn = _end_pending(conn, sql.COMPLETE_TURN, params)
    _fold_into_context(conn, turn, _touch_session(conn, turn.session_id, ended_at))
    if memory is not None:
        memory.forget_session(turn.session_id)
    _record_requested_calls(conn, turn, ended_at)


def _complete_begun(conn: Connection, known: BegunTurn, params: dict[str, Any], memory: StoreMemory) -> None:
    """`complete_turn` for a turn this store began: its row is not read back."""
    if not raw.count(conn, sql.FINISH_BEGUN_TURN, params):
        _raise_not_pending(conn, params["p_turn"])
    values = known.values
    output = params["p_output_message"]
    turn = _EndedTurn(
        values["id"], values["session_id"], values["seq"], values["input_messages"], output, values["context_reset"]
    )
    ended_at = params["p_ended_at"]
    with_output = known.context.extended([history.normalise_message(output)])
    context = {
        "p_session": turn.session_id,
        "p_seq": turn.seq,
        "p_at": ended_at,
        "p_digest": with_output.digest,
        "p_length": with_output.length,
    }
    if known.base is None:
        moved = raw.count(conn, sql.RESTART_CONTEXT, context)
    else:
        context["p_base_digest"], context["p_base_length"] = known.base
        moved = raw.count(conn, sql.EXTEND_CONTEXT, context)
    if moved:
        memory.move_context(turn.session_id, with_output)
    else:  # the context is no longer the one this turn extends
        _fold_into_context(conn, turn, _touch_session(conn, turn.session_id, ended_at))
        memory.forget_session(turn.session_id)
    _record_requested_calls(conn, turn, ended_at)


@dataclass(frozen=True, slots=True)
class _EndedTurn:
    """What `_fold_into_context` and `_record_requested_calls` read of a turn's row."""

    id: str
    session_id: str
    seq: int
    input_messages: list[dict[str, Any]]
    output_message: dict[str, Any] | None
    context_reset: bool


def _fold_into_context(conn: Connection, turn: Row[Any] | _EndedTurn, session: Row[str, int, int]) -> None:
    """Add an ok turn to the context digest of its session, whose row (`session`) this transaction has locked."""
    if turn.seq > session.context_seq:
        # The newest ok turn: it extends the context, or on a reset starts it again, by its messages.
        added = [*turn.input_messages, *([turn.output_message] if turn.output_message is not None else [])]
        digest, length = (
            (history.EMPTY_DIGEST, 0) if turn.context_reset else (session.context_digest, session.context_length)
        )
        digest, length, seq = history.extend_digest(digest, added), length + len(added), turn.seq
    else:
        # Completed after a later turn of the session: its messages go in the middle of the context. Rare.
        messages = history.context_messages(conn.execute(sql.context_turns(turn.session_id)).all())
        digest, length, seq = history.context_digest(messages), len(messages), session.context_seq
    params = {"p_session": turn.session_id, "p_digest": digest, "p_length": length, "p_seq": seq}
    raw.execute(conn, sql.SET_CONTEXT, params)


def _record_requested_calls(conn: Connection, turn: Row[Any] | _EndedTurn, ended_at: datetime) -> None:
    """Insert the tool calls the answer requests; a call id the session already has keeps its first row."""
    requested: dict[str, history.RequestedToolCall] = {}
    for call in history.requested_tool_calls(turn.output_message):
        requested.setdefault(call.call_id, call)
    if not requested:
        return
    rows = [
        {
            "session_id": turn.session_id,
            "turn_id": turn.id,
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
            "requested_at": ended_at,
        }
        for call in requested.values()
    ]
    conn.execute(sql.INSERTS[conn.dialect.name].tool_calls, rows)


def fail_turn(
    conn: Connection,
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
    memory: StoreMemory | None = None,
) -> None:
    """End a pending turn without an answer (`status` is "failed" or "cancelled"); the context stays as it is."""
    if memory is not None:
        memory.pop(turn_id)
    turn = _end_pending(
        conn,
        sql.FAIL_TURN,
        {
            "p_turn": turn_id,
            "p_status": status,
            "p_error": {"type": error_type, "message": error_message},
            "p_ended_at": ended_at,
            "p_output_message": dict(partial_output) if partial_output is not None else None,
            "p_first_token_at": first_token_at,
            "p_worker": worker,
            "p_dispatched_at": dispatched_at,
        },
    )
    _touch_session(conn, turn.session_id, ended_at)

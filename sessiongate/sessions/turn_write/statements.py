"""The statements of the per-request path (`begin_turn` ... `fail_turn`, `get_or_create_session`, the advisor's
`create_advisory`), built once.

Building a statement and its cache key costs SQLAlchemy about as much CPU as running it on SQLite (a few hundred
microseconds on a small machine); a statement object built once keeps its cache key and finds its compiled form
in the engine's cache, so a call only binds parameters. Parameters are named `p_*`
so that none is taken for a column: in an UPDATE a parameter named like a column would be added to its SET.
A bare `bindparam` in a SET gets the column's type; one inside an expression is given its type here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy import Select, String, bindparam, func, insert, select, update
from sqlalchemy.sql.dml import Insert

from sessiongate.sessions._sql import insert_on_conflict, later
from sessiongate.sessions.models import Advisory, NullableJSON, Session, Tenant, ToolCall, Turn, UTCDateTime

from .raw import register

__all__ = [
    "ADVISORY_COLUMNS",
    "CLAIM_KNOWN_SEQ",
    "CLAIM_SEQ",
    "COMPLETE_TURN",
    "EXTEND_CONTEXT",
    "FAIL_TURN",
    "FINISH_BEGUN_TURN",
    "INSERTS",
    "INSERT_ADVISORY",
    "INSERT_MISSED",
    "INSERT_TURN",
    "MARK_DISPATCHED",
    "PENDING_TOOL_CALLS",
    "RESTART_CONTEXT",
    "RETURN_TOOL_CALLS",
    "SESSION_BY_ID",
    "SESSION_OWNER",
    "SESSION_OWNERS",
    "SET_CONTEXT",
    "TOUCH_SESSION",
    "TURN_STATUS",
    "Inserts",
    "context_turns",
]

_AT = bindparam("p_at", type_=UTCDateTime())

# get_or_create_session (an ORM statement: it loads a `Session`)

SESSION_BY_ID = select(Session).where(Session.id == bindparam("p_session"))

# begin_turn

_CLAIM = (
    update(Session)
    .where(
        Session.id == bindparam("p_session"),
        Session.tenant_id == bindparam("p_tenant"),
        Session.state == "active",
    )
    .values({Session.turn_count: Session.turn_count + 1, Session.last_active_at: later(Session.last_active_at, _AT)})
)
CLAIM_SEQ = _CLAIM.returning(Session.turn_count, Session.context_digest, Session.context_length, Session.priority)
# The same claim when this store knows the row (`memory.StoreMemory`): every value the claim returns is checked.
CLAIM_KNOWN_SEQ = _CLAIM.where(
    Session.turn_count == bindparam("p_turn_count"),
    Session.context_digest == bindparam("p_digest"),
    Session.context_length == bindparam("p_length"),
    Session.priority == bindparam("p_priority"),
)
SESSION_OWNER = select(Session.tenant_id, Session.state).where(Session.id == bindparam("p_session"))
SESSION_OWNERS = select(Session.id, Session.tenant_id).where(Session.id.in_(bindparam("p_sessions", expanding=True)))
INSERT_TURN = insert(Turn)
INSERT_ADVISORY = insert(Advisory)
INSERT_MISSED = insert(Advisory)  # a "missed" record per turn without a signal: registered for the raw path below
ADVISORY_COLUMNS = tuple(Advisory.__mapper__.column_attrs)
PENDING_TOOL_CALLS = (
    select(ToolCall.id, ToolCall.call_id, ToolCall.requested_at)
    .where(
        ToolCall.session_id == bindparam("p_session"),
        ToolCall.call_id.in_(bindparam("p_call_ids", expanding=True)),
        ToolCall.result.is_(None),
    )
    .with_for_update()
)
RETURN_TOOL_CALLS = (  # executemany: one parameter set per call
    update(ToolCall)
    .where(ToolCall.id == bindparam("p_call"), ToolCall.result.is_(None))
    .values(
        result=bindparam("p_result"),
        duration_ms=bindparam("p_duration_ms"),
        returned_at=_AT,
        result_source="message",
    )
)

# the end of a turn

_PENDING = (Turn.id == bindparam("p_turn"), Turn.status == "pending")
_KEPT_UNLESS_GIVEN = {  # None keeps what mark_dispatched (or the stream) recorded
    Turn.worker: func.coalesce(bindparam("p_worker", type_=String()), Turn.worker),
    Turn.dispatched_at: func.coalesce(bindparam("p_dispatched_at", type_=UTCDateTime()), Turn.dispatched_at),
}

TURN_STATUS = select(Turn.status).where(Turn.id == bindparam("p_turn"))
MARK_DISPATCHED = (
    update(Turn)
    .where(*_PENDING)
    .values(worker=bindparam("p_worker"), dispatched_at=bindparam("p_dispatched_at"))
    .returning(Turn.id)
)
_COMPLETED: dict[Any, Any] = {
    Turn.status: "ok",
    Turn.output_message: bindparam("p_output_message"),
    Turn.finish_reason: bindparam("p_finish_reason"),
    Turn.model: bindparam("p_model"),
    Turn.first_token_at: bindparam("p_first_token_at"),
    Turn.ended_at: bindparam("p_ended_at"),
    Turn.prompt_tokens: bindparam("p_prompt_tokens"),
    Turn.completion_tokens: bindparam("p_completion_tokens"),
    Turn.cached_tokens: bindparam("p_cached_tokens"),
    Turn.cached_tokens_details: bindparam("p_cached_tokens_details"),
    Turn.cached_device: bindparam("p_cached_device"),
    Turn.cached_host: bindparam("p_cached_host"),
    Turn.cached_storage: bindparam("p_cached_storage"),
    **_KEPT_UNLESS_GIVEN,
}
COMPLETE_TURN = update(Turn).where(*_PENDING).values(_COMPLETED).returning(*Turn.__table__.columns)
FAIL_TURN = (
    update(Turn)
    .where(*_PENDING)
    .values(
        {
            Turn.status: bindparam("p_status"),
            Turn.error: bindparam("p_error", type_=NullableJSON),
            Turn.ended_at: bindparam("p_ended_at"),
            Turn.output_message: bindparam("p_output_message"),
            Turn.first_token_at: func.coalesce(bindparam("p_first_token_at", type_=UTCDateTime()), Turn.first_token_at),
            **_KEPT_UNLESS_GIVEN,
        }
    )
    .returning(Turn.session_id)
)
# Moves last_active_at (never back) and, for an ok turn, takes the session's row lock before its context is read.
TOUCH_SESSION = (
    update(Session)
    .where(Session.id == bindparam("p_session"))
    .values({Session.last_active_at: later(Session.last_active_at, _AT)})
    .returning(Session.context_digest, Session.context_length, Session.context_seq)
)
SET_CONTEXT = (
    update(Session)
    .where(Session.id == bindparam("p_session"))
    .values(
        context_digest=bindparam("p_digest"),
        context_length=bindparam("p_length"),
        context_seq=bindparam("p_seq"),
    )
)

# The end of a turn that this process began (`memory.StoreMemory`): the turn's row is not read back, and the session's
# context is moved only if it is still the one the turn extends (or, for a turn that resets it, if no later turn
# has been folded in); otherwise the turn takes the general path (TOUCH_SESSION, then its fold).
# SQLite runs a statement's RETURNING through a temporary table: ~4 us of its ~8 us for these small UPDATEs. So the
# statements whose answer is only "did a row change" go without and are counted instead (`raw.count`).
FINISH_BEGUN_TURN = update(Turn).where(*_PENDING).values(_COMPLETED)
_NEW_CONTEXT = {
    Session.context_digest: bindparam("p_digest"),
    Session.context_length: bindparam("p_length"),
    Session.context_seq: bindparam("p_seq"),
    Session.last_active_at: later(Session.last_active_at, _AT),
}
EXTEND_CONTEXT = (
    update(Session)
    .where(
        Session.id == bindparam("p_session"),
        Session.context_seq < bindparam("p_seq"),
        Session.context_digest == bindparam("p_base_digest"),
        Session.context_length == bindparam("p_base_length"),
    )
    .values(_NEW_CONTEXT)
)
RESTART_CONTEXT = (
    update(Session)
    .where(Session.id == bindparam("p_session"), Session.context_seq < bindparam("p_seq"))
    .values(_NEW_CONTEXT)
)


def context_turns(session_id: str, *, before_seq: int | None = None) -> Select[tuple[int, str, bool, list[Any], Any]]:
    """The ok turns from the session's last context reset on, in seq order, with only what the context needs
    (`history.context_messages`); with `before_seq`, of the turns before that one only (the context that turn's
    request was compared with, even once the turn has ended). Built per call, with the session's id in it: the rare
    out-of-order completion, the prefix breaks and the API's reads of a context run it, not every turn."""
    earlier = (Turn.seq < before_seq,) if before_seq is not None else ()
    last_reset = (
        select(func.coalesce(func.max(Turn.seq), 0))
        .where(Turn.session_id == session_id, Turn.status == "ok", Turn.context_reset.is_(True), *earlier)
        .scalar_subquery()
    )
    return (
        select(Turn.seq, Turn.status, Turn.context_reset, Turn.input_messages, Turn.output_message)
        .where(Turn.session_id == session_id, Turn.status == "ok", Turn.seq >= last_reset, *earlier)
        .order_by(Turn.seq)
    )


@dataclass(frozen=True, slots=True)
class Inserts:
    """The backend's `INSERT ... ON CONFLICT DO NOTHING` statements of the per-request path."""

    tenant: Insert  # creates the tenant on first use
    session: Insert  # creates the session unless it exists (the rows it changed say which)
    tool_calls: Insert  # executemany (a call id the session has is skipped)

    @classmethod
    def build(cls, backend: str) -> Inserts:
        return cls(
            tenant=insert_on_conflict(backend, Tenant),
            session=insert_on_conflict(backend, Session),
            tool_calls=insert_on_conflict(backend, ToolCall, conflict=("session_id", "call_id")),
        )


INSERTS: Mapping[str, Inserts] = MappingProxyType(
    {backend: Inserts.build(backend) for backend in ("sqlite", "postgresql")}
)


# The per-turn statements also run on the raw sqlite3 path of the group commit (`raw`).
for _statement in (
    CLAIM_KNOWN_SEQ,
    CLAIM_SEQ,
    MARK_DISPATCHED,
    COMPLETE_TURN,
    FAIL_TURN,
    TOUCH_SESSION,
    SET_CONTEXT,
    FINISH_BEGUN_TURN,
    EXTEND_CONTEXT,
    RESTART_CONTEXT,
):
    register(_statement)
# A session's first turn creates it (and its tenant on first use): every eighth turn of an eight-turn conversation.
register(INSERTS["sqlite"].tenant, column_keys=("id", "name", "created_at"))
register(
    INSERTS["sqlite"].session,
    column_keys=("id", "tenant_id", "state", "priority", "metadata", "created_at", "last_active_at", "turn_count"),
)
register(
    INSERT_TURN,
    column_keys=(
        "id",
        "session_id",
        "seq",
        "status",
        "input_messages",
        "context_reset",
        "request",
        "received_at",
        "gateway_instance",
        "gateway_run",
        "session_source",
    ),
)
register(
    INSERT_MISSED,
    column_keys=(
        "id",
        "session_id",
        "kind",
        "target_worker",
        "created_at",
        "expires_at",
        "outcome",
        "resolved_at",
        "turn_id",
        "detail",
    ),
)

"""Small helpers shared by the store's modules: ids, argument checks, row -> record conversion.

A "row" is an ORM object or a Core `Row` with the table's columns: the converters read attributes only.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row

from . import models
from .records import AdvisoryRecord, SessionRecord, ToolCallRecord, TurnAdvisory, TurnRecord, WorkerRecord

MAX_SESSION_ID_LENGTH = 128
SESSION_STATES = frozenset({"active", "closed"})
TURN_END_STATES = frozenset({"failed", "cancelled"})
ADVISORY_KINDS = frozenset({"typing", "tool_result", "tool_call", "explicit", "none"})  # none: a missed request
ADVISORY_OUTCOMES = frozenset({"used", "late", "wasted", "missed", "cancelled"})  # besides "pending"
WORKER_STATES = frozenset({"healthy", "unhealthy", "draining"})


def new_id(prefix: str) -> str:
    """`prefix` + 24 hex digits: the time in milliseconds (12), then 48 random bits. Ids made later sort later, so
    a new row's key goes at the end of its primary-key index instead of on a random page of it: a random key made
    every commit write as many index pages as it inserted rows (SQLite), ~20 us of store CPU per turn even in a
    small database, and more as the table grows. The random half keeps ids unguessable and unique across replicas."""
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{secrets.token_hex(6)}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is UTC:  # the usual case (the gateway's own clock): already what `astimezone` would make
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def aware_or_none(value: datetime | None, name: str) -> datetime | None:
    return None if value is None else aware(value, name)


def one_of(value: str, allowed: Iterable[str], name: str) -> str:
    allowed = frozenset(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


def check_session_id(session_id: str) -> str:
    if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH or not session_id.isprintable():
        raise ValueError(f"a session id is 1 to {MAX_SESSION_ID_LENGTH} printable characters, got {session_id[:200]!r}")
    return session_id


def check_limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def duration_ms(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000.0


def session_record(row: models.Session) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        tenant_id=row.tenant_id,
        state=row.state,
        priority=row.priority,
        metadata=dict(row.metadata_),
        created_at=row.created_at,
        last_active_at=row.last_active_at,
        turn_count=row.turn_count,
        prefix_breaks=getattr(row, "prefix_breaks", 0) or 0,
    )


def tool_call_record(row: models.ToolCall | Row[Any]) -> ToolCallRecord:
    return ToolCallRecord(
        id=row.id,
        session_id=row.session_id,
        turn_id=row.turn_id,
        call_id=row.call_id,
        name=row.name,
        arguments=row.arguments,
        requested_at=row.requested_at,
        result=row.result,
        returned_at=row.returned_at,
        duration_ms=row.duration_ms,
        result_source=row.result_source,
    )


def turn_record(
    row: models.Turn | Row[Any],
    tool_calls: Iterable[models.ToolCall | Row[Any]],
    advisory: TurnAdvisory | None = None,
) -> TurnRecord:
    return TurnRecord(
        id=row.id,
        session_id=row.session_id,
        seq=row.seq,
        status=row.status,
        input_messages=list(row.input_messages),
        context_reset=row.context_reset,
        session_source=getattr(row, "session_source", None),
        prefix_break=getattr(row, "prefix_break", None),
        request=dict(row.request),
        output_message=row.output_message,
        finish_reason=row.finish_reason,
        model=row.model,
        worker=row.worker,
        error=row.error,
        received_at=row.received_at,
        dispatched_at=row.dispatched_at,
        first_token_at=row.first_token_at,
        ended_at=row.ended_at,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        cached_tokens=row.cached_tokens,
        cached_tokens_details=row.cached_tokens_details,
        cached_device=row.cached_device,
        cached_host=row.cached_host,
        cached_storage=row.cached_storage,
        tool_calls=tuple(tool_call_record(call) for call in tool_calls),
        advisory=advisory,
    )


# What a turn inserted by `begin_turn` does not have yet.
_NOT_YET: dict[str, Any] = dict.fromkeys(
    (
        "output_message",
        "finish_reason",
        "model",
        "worker",
        "error",
        "dispatched_at",
        "first_token_at",
        "ended_at",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "cached_tokens_details",
        "cached_device",
        "cached_host",
        "cached_storage",
    )
)


def pending_turn_record(values: Mapping[str, Any], *, session_priority: int = 0) -> TurnRecord:
    """The record of a turn just inserted with `values` (id, session_id, seq, status, input_messages,
    context_reset, request, received_at); everything else is still unset."""
    return TurnRecord(**_NOT_YET, **values, session_priority=session_priority, tool_calls=())


def advisory_record(row: models.Advisory) -> AdvisoryRecord:
    return AdvisoryRecord(
        id=row.id,
        session_id=row.session_id,
        kind=row.kind,
        target_worker=row.target_worker,
        created_at=row.created_at,
        expires_at=row.expires_at,
        outcome=row.outcome,
        resolved_at=row.resolved_at,
        turn_id=row.turn_id,
        detail=row.detail,
    )


def worker_record(row: models.Worker) -> WorkerRecord:
    return WorkerRecord(id=row.id, url=row.url, state=row.state, last_seen_at=row.last_seen_at, info=dict(row.info))

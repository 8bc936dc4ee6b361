"""Typed, read-only views of the gateway's session resources: sessions, pages of sessions, turns, and the
answers to a session's signals (typing, tool results, explicit hints).

Frozen dataclasses built from the wire dicts by the `parse_*` functions, keeping the dict in `.raw`.
Timestamps arrive as ISO-8601 strings with a timezone and become aware `datetime`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._types import CachedTokens, JSONDict, Usage, as_mapping, parse_usage

__all__ = [
    "SessionDeleted",
    "SessionInfo",
    "SessionPage",
    "SignalResult",
    "ToolResultReceipt",
    "Turn",
    "TurnAdvisory",
    "TurnTimings",
    "TurnToolCall",
    "parse_deleted",
    "parse_session",
    "parse_session_page",
    "parse_signal",
    "parse_tool_result",
    "parse_turn",
]


@dataclass(frozen=True)
class SessionInfo:
    id: str
    tenant_id: str | None
    state: str
    priority: int
    metadata: JSONDict
    created_at: datetime | None
    last_active_at: datetime | None
    turn_count: int
    raw: JSONDict = field(repr=False, compare=False)


@dataclass(frozen=True)
class SessionPage:
    data: list[SessionInfo]
    has_more: bool

    @property
    def next_after(self) -> str | None:
        """The cursor to pass as `after=` for the next page, or None on the last page."""
        return self.data[-1].id if self.has_more and self.data else None


@dataclass(frozen=True)
class SessionDeleted:
    id: str
    deleted: bool


@dataclass(frozen=True)
class SessionClosed:
    """A closed session, and what each worker dropped of its KV (`worker`, `device_tokens`, `host_tokens`,
    `storage_tokens`; or `error` for a worker that could not)."""

    info: SessionInfo
    dropped: tuple[JSONDict, ...]

    @property
    def dropped_tokens(self) -> int:
        """Tokens of the session's KV found and dropped, over every worker and tier."""
        return sum(
            int(entry.get(tier) or 0)
            for entry in self.dropped
            for tier in ("device_tokens", "host_tokens", "storage_tokens")
        )


@dataclass(frozen=True)
class TurnTimings:
    received_at: datetime | None
    dispatched_at: datetime | None
    first_token_at: datetime | None
    ended_at: datetime | None

    @property
    def ttft_ms(self) -> float | None:
        """Time from the gateway receiving the request to the first token, in milliseconds."""
        if self.received_at is None or self.first_token_at is None:
            return None
        return (self.first_token_at - self.received_at).total_seconds() * 1000.0


@dataclass(frozen=True)
class TurnToolCall:
    id: str
    name: str
    arguments: str
    requested_at: datetime | None
    result: str | None
    returned_at: datetime | None
    duration_ms: float | None


@dataclass(frozen=True)
class TurnAdvisory:
    """The advisory settled against a turn: the signal that foresaw it and how its prefetch ended.

    `kind`: typing | tool_result | tool_call | explicit, or none (no signal came: `outcome` is missed).
    `outcome`: used (the turn found the prefetched KV on the worker it went to), late (it arrived before the
    prefetch finished), wasted (it went elsewhere, or found nothing), missed, or cancelled.
    """

    id: str
    kind: str
    outcome: str
    target_worker: str | None


@dataclass(frozen=True)
class Turn:
    """One recorded turn. `advisory` is None for a session's first turn, and for a moment after any turn ends:
    the gateway settles the advisory just after the answer is sent."""

    id: str
    session_id: str
    seq: int
    status: str
    input_messages: tuple[JSONDict, ...]
    context_reset: bool
    output_message: JSONDict | None
    finish_reason: str | None
    model: str | None
    worker: str | None
    error: Any
    usage: Usage | None
    timings: TurnTimings
    tool_calls: tuple[TurnToolCall, ...]
    advisory: TurnAdvisory | None
    raw: JSONDict = field(repr=False, compare=False)

    @property
    def cached_tokens_by_tier(self) -> CachedTokens:
        """Prompt tokens of this turn whose KV came from the device, host memory or the shared pool."""
        return self.usage.cached_tokens_by_tier if self.usage is not None else CachedTokens()


@dataclass(frozen=True)
class SignalResult:
    """What the advisor did with a signal (the 202 answer of typing, advise, and within a tool result).

    `state`: fired (a prefetch was asked of `worker`), scheduled (it fires later: a tool expected to end later),
    refreshed (an advisory was already live: its expiry moved), stopping (typing stopped: cancelled after a
    grace), skipped (`reason`: e.g. this kind of hint was mostly wasted lately, or no worker is routable), none.
    """

    state: str
    id: str | None
    kind: str | None
    worker: str | None
    target: str | None
    expires_in_s: float | None
    reason: str | None
    raw: JSONDict = field(repr=False, compare=False)

    @property
    def live(self) -> bool:
        """An advisory is live for the session: its next turn can use the prefetch."""
        return self.state in ("fired", "scheduled", "refreshed", "stopping")


@dataclass(frozen=True)
class ToolResultReceipt:
    """A tool result the gateway recorded; `advisory` is None while other calls of the same turn are out."""

    session_id: str
    tool_call_id: str
    name: str
    duration_ms: float | None
    advisory: SignalResult | None
    raw: JSONDict = field(repr=False, compare=False)


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def parse_session(raw: JSONDict) -> SessionInfo:
    return SessionInfo(
        id=str(raw["id"]),
        tenant_id=raw.get("tenant_id"),
        state=str(raw.get("state") or ""),
        priority=int(raw.get("priority") or 0),
        metadata=as_mapping(raw.get("metadata")),
        created_at=_time(raw.get("created_at")),
        last_active_at=_time(raw.get("last_active_at")),
        turn_count=int(raw.get("turn_count") or 0),
        raw=raw,
    )


def parse_session_page(raw: JSONDict) -> SessionPage:
    return SessionPage(data=[parse_session(item) for item in raw["data"]], has_more=bool(raw.get("has_more", False)))


def parse_closed(raw: JSONDict) -> SessionClosed:
    kv = raw.get("kv")
    return SessionClosed(
        info=parse_session(raw), dropped=tuple(dict(e) for e in kv if isinstance(e, dict)) if kv else ()
    )


def parse_deleted(raw: JSONDict) -> SessionDeleted:
    return SessionDeleted(id=str(raw["id"]), deleted=bool(raw.get("deleted", False)))


def _parse_turn_tool_call(raw: JSONDict) -> TurnToolCall:
    duration = raw.get("duration_ms")
    return TurnToolCall(
        id=str(raw.get("id") or ""),
        name=str(raw.get("name") or ""),
        arguments=str(raw.get("arguments") or ""),
        requested_at=_time(raw.get("requested_at")),
        result=raw.get("result"),
        returned_at=_time(raw.get("returned_at")),
        duration_ms=float(duration) if duration is not None else None,
    )


def parse_turn(raw: JSONDict) -> Turn:
    timings = as_mapping(raw.get("timings"))
    output = raw.get("output_message")
    return Turn(
        id=str(raw["id"]),
        session_id=str(raw.get("session_id") or ""),
        seq=int(raw.get("seq") or 0),
        status=str(raw.get("status") or ""),
        input_messages=tuple(as_mapping(m) for m in raw.get("input_messages") or ()),
        context_reset=bool(raw.get("context_reset", False)),
        output_message=output if isinstance(output, Mapping) else None,
        finish_reason=raw.get("finish_reason"),
        model=raw.get("model"),
        worker=raw.get("worker"),
        error=raw.get("error"),
        usage=parse_usage(raw.get("usage")),
        timings=TurnTimings(
            received_at=_time(timings.get("received_at")),
            dispatched_at=_time(timings.get("dispatched_at")),
            first_token_at=_time(timings.get("first_token_at")),
            ended_at=_time(timings.get("ended_at")),
        ),
        tool_calls=tuple(_parse_turn_tool_call(as_mapping(c)) for c in raw.get("tool_calls") or ()),
        advisory=_parse_turn_advisory(raw.get("advisory")),
        raw=raw,
    )


def _parse_turn_advisory(raw: Any) -> TurnAdvisory | None:
    if not isinstance(raw, Mapping):
        return None
    return TurnAdvisory(
        id=str(raw.get("id") or ""),
        kind=str(raw.get("kind") or ""),
        outcome=str(raw.get("outcome") or ""),
        target_worker=raw.get("target_worker"),
    )


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def parse_signal(raw: JSONDict) -> SignalResult:
    return SignalResult(
        state=str(raw["state"]),
        id=raw.get("id"),
        kind=raw.get("kind"),
        worker=raw.get("worker"),
        target=raw.get("target"),
        expires_in_s=_float(raw.get("expires_in_s")),
        reason=raw.get("reason"),
        raw=raw,
    )


def parse_tool_result(raw: JSONDict) -> ToolResultReceipt:
    advisory = raw.get("advisory")
    return ToolResultReceipt(
        session_id=str(raw["session_id"]),
        tool_call_id=str(raw["tool_call_id"]),
        name=str(raw.get("name") or ""),
        duration_ms=_float(raw.get("duration_ms")),
        advisory=parse_signal(advisory) if isinstance(advisory, Mapping) else None,
        raw=raw,
    )

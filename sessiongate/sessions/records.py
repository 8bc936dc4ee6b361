"""The frozen values the store hands back to its callers, never ORM objects.

Plain fields only; serialising them for the wire is the gateway's business. JSON-shaped fields
(`metadata`, `input_messages`, ...) are fresh `dict`/`list` objects owned by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

__all__ = [
    "AdvisoryRecord",
    "ApiKeyRecord",
    "IdempotencyHolder",
    "IdempotencyRecord",
    "InstanceLease",
    "MissedTurn",
    "Page",
    "ResponseRecord",
    "SessionRecord",
    "StoreHealth",
    "TenantRecord",
    "ToolCallRecord",
    "TurnAdvisory",
    "TurnRecord",
    "WorkerRecord",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class MissedTurn:
    """A follow-up turn that no advisory foresaw, for `record_missed_turns`."""

    session_id: str
    tenant_id: str
    turn_id: str
    at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseRecord:
    """A stored Responses API response: the turn of its chain's session it was, and what the turns do not keep."""

    id: str
    tenant_id: str
    session_id: str
    turn_id: str
    previous_response_id: str | None
    instructions: str | None
    input_items: list[dict[str, Any]]
    body: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreHealth:
    """How this process's calls to the database fare, for `/metrics`: a database that stopped answering shows in
    `oldest_call_s` at once, seconds before any call times out."""

    calls_in_flight: int
    oldest_call_s: float
    """How long the oldest call still waiting for the database has waited; 0 with none in flight."""
    unavailable: int
    """Calls that failed with `StoreUnavailable` since the store was made."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceLease:
    """Who holds a gateway instance id: the process run, where it runs, and its last heartbeat."""

    id: str
    run: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantRecord:
    """A tenant and its limit overrides: None means the gateway's global setting applies, 0 means no limit."""

    id: str
    name: str
    created_at: datetime
    max_concurrent: int | None
    tokens_per_minute: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKeyRecord:
    """A tenant's API key as listed: never the secret, only its hash and a short prefix."""

    id: str
    tenant_id: str
    name: str
    prefix: str
    secret_hash: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotencyHolder:
    """The gateway process holding an idempotency key: its instance id and run, whose lease (`InstanceLease`) tells
    whether it is still alive."""

    instance: str
    run: str


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotencyRecord:
    """An idempotency key already claimed: "pending" (in progress) or "done" (with the response to replay).
    `holder`: who claimed it; None on a key claimed before holders were recorded."""

    tenant_id: str
    key: str
    request_hash: str
    status: str
    created_at: datetime
    turn_id: str | None
    response: dict[str, Any] | None
    holder: IdempotencyHolder | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    id: str
    tenant_id: str
    state: str  # "active" | "closed"
    priority: int
    metadata: dict[str, Any]
    created_at: datetime
    last_active_at: datetime
    turn_count: int
    prefix_breaks: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRecord:
    id: int
    session_id: str
    turn_id: str  # the turn whose assistant output requested the call
    call_id: str  # the model's id for the call, unique within the session
    name: str
    arguments: str
    requested_at: datetime
    result: str | None
    returned_at: datetime | None
    duration_ms: float | None  # returned_at - requested_at
    result_source: str | None  # "message" (a role=tool message in a later request) | "api"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnAdvisory:
    """The advisory settled against a turn: the signal that foresaw it (kind "none" with outcome "missed" when
    none did), the worker it prefetched on, and how it ended."""

    id: str
    kind: str  # "typing" | "tool_result" | "tool_call" | "explicit" | "none"
    outcome: str  # "used" | "late" | "wasted" | "missed" | "cancelled"
    target_worker: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    id: str
    session_id: str
    seq: int
    status: str  # "pending" | "ok" | "failed" | "cancelled"
    input_messages: list[dict[str, Any]]  # only the messages new in this request
    context_reset: bool  # the request did not extend the session's context: input_messages is all of it
    request: dict[str, Any]
    output_message: dict[str, Any] | None  # on a failed turn: the partial output, if any
    finish_reason: str | None
    model: str | None
    worker: str | None
    error: dict[str, Any] | None  # {"type": ..., "message": ...}
    received_at: datetime
    dispatched_at: datetime | None
    first_token_at: datetime | None
    ended_at: datetime | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    cached_tokens_details: dict[str, Any] | None
    cached_device: int | None
    cached_host: int | None
    cached_storage: int | None
    tool_calls: tuple[ToolCallRecord, ...]
    # The session's priority as the turn began (read in the same statement that claimed its seq): what the
    # gateway sends the worker as the request's `priority`. 0 on records read back later.
    session_priority: int = 0
    # How the request named its session ("header", "body", "inferred", "response", "new"); None before 0006.
    session_source: str | None = None
    # Where its resent history first differed from the session's stored context (index, kind, tokens kept/lost).
    prefix_break: dict[str, Any] | None = None
    # Filled by `list_turns` once the advisor settled an advisory against the turn (settling runs after the turn
    # ends, so a turn read back at once may not have it yet); None on the records the turn's own writes return.
    advisory: TurnAdvisory | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvisoryRecord:
    id: str
    session_id: str
    kind: str  # "typing" | "tool_result" | "tool_call" | "explicit" | "none" (a missed request: no signal)
    target_worker: str | None
    created_at: datetime
    expires_at: datetime
    outcome: str  # "pending" | "used" | "late" | "wasted" | "missed" | "cancelled"
    resolved_at: datetime | None
    turn_id: str | None
    detail: dict[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerRecord:
    id: str
    url: str
    state: str  # "healthy" | "unhealthy" | "draining"
    last_seen_at: datetime
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing; pass the last item's id as `after` to get the next one."""

    items: Sequence[T]
    has_more: bool

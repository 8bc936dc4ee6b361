"""The turns aggregate of `SessionStore`: a chat turn from its beginning to its end, the tool calls its answer requests
and the advisories settled against it. `SqlSessionStore` implements them in `sessions.store.turns`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from sessiongate.sessions.records import AdvisoryRecord, MissedTurn, ToolCallRecord, TurnRecord

__all__ = ["AdvisoriesStore", "ToolCallsStore", "TurnsStore"]


class TurnsStore(Protocol):
    """Turns: begun pending, dispatched, ended ok, failed or cancelled; listed; failed in bulk at start-up."""

    async def begin_turn(
        self,
        session_id: str,
        *,
        tenant_id: str,
        messages: Sequence[Mapping[str, Any]],
        request: Mapping[str, Any],
        received_at: datetime,
        create_session: bool = False,
        gateway_instance: str | None = None,
        gateway_run: str | None = None,
        session_source: str | None = None,
    ) -> TurnRecord:
        """Record a request as a pending turn, storing only the messages new to the context, and the tool
        results among them. `InvalidTransition` if the session is closed.

        `create_session=True` creates a missing session in the same transaction, as `get_or_create_session`
        would (concurrent first turns of one id all succeed, one of them creating it; `SessionExists` if the
        id belongs to another tenant). `gateway_instance`/`gateway_run` name the gateway process serving it
        (see `fail_pending_turns`)."""
        ...

    async def mark_dispatched(self, turn_id: str, *, worker: str, dispatched_at: datetime) -> None: ...

    async def complete_turn(
        self,
        turn_id: str,
        *,
        output_message: Mapping[str, Any],
        finish_reason: str | None,
        model: str | None,
        usage: Mapping[str, Any] | None = None,
        cached_tokens_details: Mapping[str, Any] | None = None,
        first_token_at: datetime | None = None,
        ended_at: datetime,
        worker: str | None = None,
        dispatched_at: datetime | None = None,
    ) -> None:
        """Mark a pending turn ok with its answer; records the tool calls the answer requests.

        `worker` and `dispatched_at` may be given here instead of through `mark_dispatched` (one write
        less per request); None keeps what is stored. Nothing is returned: the gateway does not read a turn back
        at its end, and building its record cost 6% of a chat turn's instructions (docs/benchmarks.md);
        `list_turns` reads the ended turn."""
        ...

    async def fail_turn(
        self,
        turn_id: str,
        *,
        status: str = "failed",
        error_type: str,
        error_message: str,
        ended_at: datetime,
        partial_output: Mapping[str, Any] | None = None,
        first_token_at: datetime | None = None,
        worker: str | None = None,
        dispatched_at: datetime | None = None,
    ) -> None:
        """End a pending turn as "failed" or "cancelled"; it keeps its input but leaves the context.

        `partial_output` is stored as the turn's output_message; `worker`/`dispatched_at` and what is returned as in
        `complete_turn`."""
        ...

    async def list_turns(
        self, session_id: str, *, tenant_id: str, limit: int = 100, after_seq: int | None = None
    ) -> list[TurnRecord]:
        """Turns in seq order (those after `after_seq`), each with its tool calls and its settled advisory."""
        ...

    async def fail_pending_turns(
        self,
        *,
        older_than: datetime | None = None,
        error_message: str,
        error_type: str = "interrupted",
        gateway_instance: str | None = None,
        except_run: str | None = None,
    ) -> int:
        """Fail the turns still pending (received before `older_than`); returns how many.

        With `gateway_instance`, only that replica's turns, and with `except_run` not those of its current run:
        what a restarted replica calls to fail its dead predecessor's turns at once, leaving other replicas'
        turns alone."""
        ...


class ToolCallsStore(Protocol):
    """Tool calls: requested by an answer, closed by a result (a role=tool message, or posted here)."""

    async def record_tool_result(
        self, session_id: str, call_id: str, *, tenant_id: str, content: str, returned_at: datetime
    ) -> ToolCallRecord:
        """A tool result posted through the API. Posting the same content again returns the call unchanged;
        different content for a returned call is `InvalidTransition`."""
        ...

    async def pending_tool_calls(self, session_id: str, *, tenant_id: str) -> list[ToolCallRecord]: ...


class AdvisoriesStore(Protocol):
    """Advisories: created by the advisor, settled once against a turn, listed by session."""

    async def create_advisory(
        self,
        session_id: str,
        *,
        tenant_id: str,
        kind: str,
        target_worker: str | None,
        created_at: datetime,
        expires_at: datetime,
        detail: Mapping[str, Any] | None = None,
        outcome: str = "pending",
        resolved_at: datetime | None = None,
        turn_id: str | None = None,
    ) -> AdvisoryRecord:
        """A new advisory, pending; or already settled (`outcome` and `resolved_at`), in one write."""
        ...

    async def record_missed_turns(self, missed: Sequence[MissedTurn]) -> int:
        """Record follow-up turns that no advisory foresaw (advisories of kind "none", settled `missed`), in one
        write; turns of sessions that are gone are skipped. The number recorded."""
        ...

    async def resolve_advisory(
        self, advisory_id: str, *, outcome: str, resolved_at: datetime, turn_id: str | None = None
    ) -> AdvisoryRecord:
        """Settle a pending advisory; `InvalidTransition` if it was already resolved."""
        ...

    async def list_advisories(
        self, session_id: str, *, tenant_id: str, outcome: str | None = None, limit: int = 100
    ) -> list[AdvisoryRecord]: ...

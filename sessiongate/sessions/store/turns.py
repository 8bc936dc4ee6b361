"""The turns aggregate on SQL: turns, tool calls and advisories. A turn's own writes and the advisor's go through the
per-turn write path (`turn_write`, run by `_per_request`); the API's reads through the ORM (`turn_rows`,
`tool_calls`, `advisories`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sessiongate.sessions import _convert as cv
from sessiongate.sessions import advisories, session_rows, tool_calls, turn_rows
from sessiongate.sessions.protocol.turns import AdvisoriesStore, ToolCallsStore, TurnsStore
from sessiongate.sessions.records import AdvisoryRecord, MissedTurn, ToolCallRecord, TurnRecord
from sessiongate.sessions.turn_write import persist

from .transactions import StoreTransactions

__all__ = ["SqlAdvisories", "SqlToolCalls", "SqlTurns"]


class SqlTurns(StoreTransactions):
    """`TurnsStore` on SQL."""

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
        received_at = cv.aware(received_at, "received_at")
        if create_session:
            cv.check_session_id(session_id)
        return await self._per_request(
            persist.begin_turn,
            session_id,
            tenant_id=tenant_id,
            messages=messages,
            request=request,
            received_at=received_at,
            create_session=create_session,
            clock=self._clock,
            gateway_instance=gateway_instance,
            gateway_run=gateway_run,
            memory=self._memory,
            session_source=session_source,
        )

    async def mark_dispatched(self, turn_id: str, *, worker: str, dispatched_at: datetime) -> None:
        dispatched_at = cv.aware(dispatched_at, "dispatched_at")
        await self._per_request(persist.mark_dispatched, turn_id, worker=worker, dispatched_at=dispatched_at)

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
        await self._per_request(
            persist.complete_turn,
            turn_id,
            output_message=output_message,
            finish_reason=finish_reason,
            model=model,
            usage=usage,
            cached_tokens_details=cached_tokens_details,
            first_token_at=cv.aware_or_none(first_token_at, "first_token_at"),
            ended_at=cv.aware(ended_at, "ended_at"),
            worker=worker,
            dispatched_at=cv.aware_or_none(dispatched_at, "dispatched_at"),
            memory=self._memory,
        )

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
        await self._per_request(
            persist.fail_turn,
            turn_id,
            status=cv.one_of(status, cv.TURN_END_STATES, "status"),
            error_type=error_type,
            error_message=error_message,
            ended_at=cv.aware(ended_at, "ended_at"),
            partial_output=partial_output,
            first_token_at=cv.aware_or_none(first_token_at, "first_token_at"),
            worker=worker,
            dispatched_at=cv.aware_or_none(dispatched_at, "dispatched_at"),
            memory=self._memory,
        )

    async def list_turns(
        self, session_id: str, *, tenant_id: str, limit: int = 100, after_seq: int | None = None
    ) -> list[TurnRecord]:
        cv.check_limit(limit)
        async with self._transaction(write=False) as db:
            await session_rows.session_row(db, session_id, tenant_id)
            rows = await turn_rows.list_turns(db, session_id, limit=limit, after_seq=after_seq)
            advised = await turn_rows.turn_advisories(db, session_id, [row.id for row in rows])
            return [cv.turn_record(row, row.tool_calls, advised.get(row.id)) for row in rows]

    async def fail_pending_turns(
        self,
        *,
        older_than: datetime | None = None,
        error_message: str,
        error_type: str = "interrupted",
        gateway_instance: str | None = None,
        except_run: str | None = None,
    ) -> int:
        older_than = cv.aware_or_none(older_than, "older_than")
        async with self._transaction() as db:
            return await turn_rows.fail_pending_turns(
                db,
                older_than=older_than,
                error_type=error_type,
                error_message=error_message,
                now=self._clock(),
                gateway_instance=gateway_instance,
                except_run=except_run,
            )


class SqlToolCalls(StoreTransactions):
    """`ToolCallsStore` on SQL."""

    async def record_tool_result(
        self, session_id: str, call_id: str, *, tenant_id: str, content: str, returned_at: datetime
    ) -> ToolCallRecord:
        returned_at = cv.aware(returned_at, "returned_at")
        async with self._transaction() as db:
            await session_rows.session_row(db, session_id, tenant_id)
            call = await tool_calls.record_tool_result(
                db, session_id, call_id, content=content, returned_at=returned_at
            )
            return cv.tool_call_record(call)

    async def pending_tool_calls(self, session_id: str, *, tenant_id: str) -> list[ToolCallRecord]:
        async with self._transaction(write=False) as db:
            await session_rows.session_row(db, session_id, tenant_id)
            return [cv.tool_call_record(row) for row in await tool_calls.pending_tool_calls(db, session_id)]


class SqlAdvisories(StoreTransactions):
    """`AdvisoriesStore` on SQL."""

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
        return await self._per_request(
            advisories.insert_advisory,
            session_id,
            tenant_id=tenant_id,
            kind=kind,
            target_worker=target_worker,
            created_at=created_at,
            expires_at=expires_at,
            detail=detail,
            outcome=outcome,
            resolved_at=resolved_at,
            turn_id=turn_id,
        )

    async def record_missed_turns(self, missed: Sequence[MissedTurn]) -> int:
        return await self._per_request(advisories.insert_missed, missed)

    async def resolve_advisory(
        self, advisory_id: str, *, outcome: str, resolved_at: datetime, turn_id: str | None = None
    ) -> AdvisoryRecord:
        async with self._transaction() as db:
            return await advisories.resolve_advisory(
                db, advisory_id, outcome=outcome, resolved_at=resolved_at, turn_id=turn_id
            )

    async def list_advisories(
        self, session_id: str, *, tenant_id: str, outcome: str | None = None, limit: int = 100
    ) -> list[AdvisoryRecord]:
        cv.check_limit(limit)
        async with self._transaction(write=False) as db:
            await session_rows.session_row(db, session_id, tenant_id)
            return await advisories.list_advisories(db, session_id, outcome=outcome, limit=limit)


def _implements_protocols(
    m0: SqlTurns, m1: SqlToolCalls, m2: SqlAdvisories
) -> tuple[TurnsStore, ToolCallsStore, AdvisoriesStore]:
    return m0, m1, m2  # mypy checks that each mixin satisfies its aggregate's Protocol

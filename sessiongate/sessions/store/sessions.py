"""The sessions aggregate on SQL: session rows, forks, prefix breaks and Responses API responses, each call in a
transaction of `StoreTransactions`, delegating to `session_rows`, `forks` and `responses`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import update

from sessiongate.sessions import _convert as cv
from sessiongate.sessions import forks, history, responses, session_rows, turn_rows
from sessiongate.sessions.errors import SessionExists
from sessiongate.sessions.models import Session, Turn
from sessiongate.sessions.protocol.sessions import ForksStore, PrefixBreaksStore, ResponsesStore, SessionsStore
from sessiongate.sessions.records import Page, ResponseRecord, SessionRecord

from .transactions import StoreTransactions

__all__ = ["SqlForks", "SqlPrefixBreaks", "SqlResponses", "SqlSessions"]


class SqlSessions(StoreTransactions):
    """`SessionsStore` on SQL."""

    async def create_session(
        self,
        *,
        tenant_id: str = "default",
        session_id: str | None = None,
        priority: int = 0,
        metadata: Mapping[str, Any] | None = None,
    ) -> SessionRecord:
        session_id = cv.check_session_id(session_id) if session_id is not None else cv.new_id("sess_")
        async with self._transaction() as db:
            row = await session_rows.insert_session(
                db, self._backend, session_id, tenant_id, priority=priority, metadata=metadata or {}, now=self._clock()
            )
            if row is None:
                raise SessionExists(session_id)
            return cv.session_record(row)

    async def get_session(self, session_id: str, *, tenant_id: str) -> SessionRecord:
        async with self._transaction(write=False) as db:
            return cv.session_record(await session_rows.session_row(db, session_id, tenant_id))

    async def get_or_create_session(self, session_id: str, *, tenant_id: str) -> tuple[SessionRecord, bool]:
        cv.check_session_id(session_id)
        async with self._transaction() as db:
            row, created = await session_rows.get_or_create_session(
                db, self._backend, session_id, tenant_id, clock=self._clock
            )
            return cv.session_record(row), created

    async def list_sessions(
        self, *, tenant_id: str, limit: int = 20, after: str | None = None, state: str | None = None
    ) -> Page[SessionRecord]:
        cv.check_limit(limit)
        async with self._transaction(write=False) as db:
            return await session_rows.list_sessions(db, tenant_id=tenant_id, limit=limit, after=after, state=state)

    async def update_session(
        self,
        session_id: str,
        *,
        tenant_id: str,
        priority: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        state: str | None = None,
    ) -> SessionRecord:
        values: dict[Any, Any] = {}
        if priority is not None:
            values[Session.priority] = priority
        if metadata is not None:
            values[Session.metadata_] = dict(metadata)
        if state is not None:
            values[Session.state] = cv.one_of(state, cv.SESSION_STATES, "state")
        async with self._transaction() as db:
            return cv.session_record(await session_rows.update_session(db, session_id, tenant_id, values))

    async def delete_session(self, session_id: str, *, tenant_id: str) -> None:
        async with self._transaction() as db:
            await session_rows.delete_session(db, session_id, tenant_id)

    async def session_context(
        self, session_id: str, *, tenant_id: str, before_seq: int | None = None
    ) -> list[dict[str, Any]]:
        async with self._transaction(write=False) as db:
            await session_rows.session_row(db, session_id, tenant_id)
            return history.context_messages(await turn_rows.context_turns(db, session_id, before_seq=before_seq))

    async def find_extended_sessions(
        self, *, tenant_id: str, contexts: Sequence[tuple[str, int]], limit: int = 2
    ) -> list[tuple[str, int]]:
        async with self._transaction(write=False) as db:
            return await session_rows.find_extended_sessions(db, tenant_id, contexts, limit=limit)

    async def find_session(self, session_id: str) -> SessionRecord:
        async with self._transaction(write=False) as db:
            return cv.session_record(await session_rows.find_session(db, session_id))

    async def search_sessions(
        self,
        *,
        tenant_id: str | None = None,
        state: str | None = None,
        active_after: datetime | None = None,
        active_before: datetime | None = None,
        min_priority: int | None = None,
        max_priority: int | None = None,
        limit: int = 50,
        after: str | None = None,
        min_prefix_breaks: int | None = None,
    ) -> Page[SessionRecord]:
        cv.check_limit(limit)
        async with self._transaction(write=False) as db:
            return await session_rows.search_sessions(
                db,
                tenant_id=tenant_id,
                state=state,
                active_after=active_after,
                active_before=active_before,
                min_priority=min_priority,
                max_priority=max_priority,
                limit=limit,
                after=after,
                min_prefix_breaks=min_prefix_breaks,
            )


class SqlForks(StoreTransactions):
    """`ForksStore` on SQL."""

    async def fork_session(
        self,
        parent_id: str,
        *,
        tenant_id: str,
        child_id: str | None = None,
        at_seq: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[SessionRecord, int]:
        child_id = cv.check_session_id(child_id) if child_id is not None else cv.new_id("sess_")
        async with self._transaction() as db:
            return await forks.fork_session(
                db,
                self._backend,
                parent_id,
                tenant_id=tenant_id,
                child_id=child_id,
                at_seq=at_seq,
                metadata=metadata or {},
                now=self._clock(),
            )


class SqlPrefixBreaks(StoreTransactions):
    """`PrefixBreaksStore` on SQL."""

    async def record_prefix_break(self, turn_id: str, *, session_id: str, detail: Mapping[str, Any]) -> None:
        async with self._transaction() as db:
            await db.execute(update(Turn).where(Turn.id == turn_id).values(prefix_break=dict(detail)))
            await db.execute(
                update(Session).where(Session.id == session_id).values(prefix_breaks=Session.prefix_breaks + 1)
            )


class SqlResponses(StoreTransactions):
    """`ResponsesStore` on SQL: a response is written and its context read on the per-request path."""

    async def create_response(
        self,
        response_id: str,
        *,
        tenant_id: str,
        session_id: str,
        turn_id: str,
        previous_response_id: str | None,
        instructions: str | None,
        input_items: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
    ) -> ResponseRecord:
        record = ResponseRecord(
            id=response_id,
            tenant_id=tenant_id,
            session_id=session_id,
            turn_id=turn_id,
            previous_response_id=previous_response_id,
            instructions=instructions,
            input_items=[dict(item) for item in input_items],
            body=dict(body),
            created_at=self._clock(),
        )
        await self._per_request(responses.insert_response_sync, dataclasses.asdict(record))
        return record

    async def get_response(self, response_id: str, *, tenant_id: str) -> ResponseRecord:
        async with self._transaction(write=False) as db:
            return await responses.get_response(db, response_id, tenant_id)

    async def response_context(
        self, response_id: str, *, tenant_id: str
    ) -> tuple[ResponseRecord, list[dict[str, Any]]]:
        return await self._per_request(responses.response_context_sync, response_id, tenant_id)

    async def delete_response(self, response_id: str, *, tenant_id: str) -> tuple[ResponseRecord, bool]:
        async with self._transaction() as db:
            return await responses.delete_response(db, response_id, tenant_id)


def _implements_protocols(
    m0: SqlSessions, m1: SqlForks, m2: SqlPrefixBreaks, m3: SqlResponses
) -> tuple[SessionsStore, ForksStore, PrefixBreaksStore, ResponsesStore]:
    return m0, m1, m2, m3  # mypy checks that each mixin satisfies its aggregate's Protocol

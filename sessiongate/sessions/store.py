"""`SqlSessionStore`: the `SessionStore` on SQLAlchemy's async engine (SQLite or PostgreSQL).

The gateway holds one store for the life of the process and calls it from many tasks at once: every call
opens its own transaction, commits before returning and returns frozen records, never ORM objects. The calls
made for every chat turn (`begin_turn`, `mark_dispatched`, `complete_turn`, `fail_turn`) run SQLAlchemy Core on
a connection (`_connection`), the others the ORM on an `AsyncSession` (`_transaction`); both translate database
failures into `StoreUnavailable` (`_store_errors`). The store opens transactions and delegates: a turn's own
writes to `turn_write/`, the other calls on turns and tool calls to `turn_rows.py` and `tool_calls.py`, session rows
to `session_rows.py`, advisories, keys and tenants, idempotency keys and instance leases to their modules.
Inserts that may race (session get-or-create, tenants, worker upserts) use the backend's `INSERT ... ON CONFLICT`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, select, text, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from . import _convert as cv
from . import advisories, forks, history, idempotency, instances, keys, responses, session_rows, tool_calls, turn_rows
from ._sql import insert_on_conflict
from .database import create_engine, sqlite_file_engine
from .errors import (
    SessionExists,
    StoreError,
    StoreUnavailable,
    is_unavailable,
)
from .models import Session, Turn, Worker
from .protocol import SessionStore
from .records import (
    AdvisoryRecord,
    ApiKeyRecord,
    IdempotencyRecord,
    InstanceLease,
    MissedTurn,
    Page,
    ResponseRecord,
    SessionRecord,
    TenantRecord,
    ToolCallRecord,
    TurnRecord,
    WorkerRecord,
)
from .turn_write import GroupCommitter, StoreMemory, persist

__all__ = ["SessionStore", "SqlSessionStore"]

P = ParamSpec("P")
T = TypeVar("T")


class SqlSessionStore:
    """The session store on `engine`, whose schema `sessions.upgrade` has created. `close()` disposes it."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], datetime] = cv.utcnow) -> None:
        self._backend = engine.dialect.name
        if self._backend not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported database {self._backend!r}: use sqlite or postgresql")
        self._engine = engine
        self._sessionmaker = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock
        self._memory = StoreMemory()
        # SQLite admits one writer at a time and makes the others poll with growing sleeps until its busy timeout,
        # which under a few dozen concurrent turns gives long tails and then "database is locked". Queueing this
        # process's writers on a lock instead hands the file over in order and at once; readers never wait (WAL).
        # Other processes writing the same file still meet the busy timeout. PostgreSQL needs none of this.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self._backend == "sqlite" else None
        self._sqlite_file = sqlite_file_engine(engine)
        # On an SQLite file the per-request writes queued meanwhile share one transaction
        # (sessiongate/sessions/turn_write/group_commit.py).
        self._group_commit = (
            None
            if self._sqlite_file is None
            else GroupCommitter(
                self._sqlite_file,
                guard=lambda: self._writer_turn(True),
                translate=_store_error,
                guard_held=lambda: self._write_lock is not None and self._write_lock.locked(),
            )
        )

    @classmethod
    def from_url(cls, url: str | URL) -> SqlSessionStore:
        return cls(create_engine(url))

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @asynccontextmanager
    async def _store_errors(self) -> AsyncIterator[None]:
        try:
            yield
        except Exception as exc:
            translated = _store_error(exc)
            if translated is exc:
                raise
            raise translated from exc

    @asynccontextmanager
    async def _writer_turn(self, write: bool) -> AsyncIterator[None]:
        if not write or self._write_lock is None:
            yield
            return
        async with self._write_lock:
            yield

    @asynccontextmanager
    async def _transaction(self, *, write: bool = True) -> AsyncIterator[AsyncSession]:
        async with self._store_errors(), self._writer_turn(write), self._sessionmaker() as db, db.begin():
            yield db

    @asynccontextmanager
    async def _connection(self, *, write: bool = True) -> AsyncIterator[AsyncConnection]:
        async with self._store_errors(), self._writer_turn(write), self._engine.begin() as conn:
            yield conn

    async def _per_request(self, work: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`work(conn, ...)` committed as a whole before this returns, as one step for the event loop. For the
        per-request writes (`turns`, `advisories`).

        On an SQLite file it joins a group commit: the writes queued while the file is busy run on a worker
        thread in one transaction, each in its own savepoint (its error rolls back only its writes), with one
        commit; a caller cancelled meanwhile waits for its end. On PostgreSQL `run_sync` runs it in a transaction
        of its own (asyncpg has no thread hops to save, and the server takes concurrent writers).
        """
        if self._group_commit is None:
            async with self._connection() as conn:
                return await conn.run_sync(work, *args, **kwargs)
        # With at most one turn in flight here (a turn's own at its end, one other at a turn's start), no other
        # write is coming to share the batch: it commits at once.
        alone = self._memory.turns_in_flight() <= 1
        return await self._group_commit.run(lambda conn: work(conn, *args, **kwargs), alone=alone)

    # sessions

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

    async def session_context(self, session_id: str, *, tenant_id: str) -> list[dict[str, Any]]:
        async with self._transaction(write=False) as db:
            await session_rows.session_row(db, session_id, tenant_id)
            return history.context_messages(await turn_rows.context_turns(db, session_id))

    async def find_extended_sessions(
        self, *, tenant_id: str, contexts: Sequence[tuple[str, int]], limit: int = 2
    ) -> list[tuple[str, int]]:
        async with self._transaction(write=False) as db:
            return await session_rows.find_extended_sessions(db, tenant_id, contexts, limit=limit)

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

    async def record_prefix_break(self, turn_id: str, *, session_id: str, detail: Mapping[str, Any]) -> None:
        async with self._transaction() as db:
            await db.execute(update(Turn).where(Turn.id == turn_id).values(prefix_break=dict(detail)))
            await db.execute(
                update(Session).where(Session.id == session_id).values(prefix_breaks=Session.prefix_breaks + 1)
            )

    # Responses API responses (sessiongate/sessions/responses.py)

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

    # administration (across tenants)

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

    # turns

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
    ) -> TurnRecord:
        return await self._per_request(
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
    ) -> TurnRecord:
        return await self._per_request(
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

    # tool calls

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

    # advisories

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

    # workers

    async def upsert_worker(
        self,
        worker_id: str,
        *,
        url: str,
        state: str,
        last_seen_at: datetime,
        info: Mapping[str, Any] | None = None,
    ) -> WorkerRecord:
        values = {
            "id": worker_id,
            "url": url,
            "state": cv.one_of(state, cv.WORKER_STATES, "state"),
            "last_seen_at": cv.aware(last_seen_at, "last_seen_at"),
            "info": dict(info) if info is not None else {},
        }
        update_keys = ["url", "state", "last_seen_at"] + (["info"] if info is not None else [])
        upsert = insert_on_conflict(self._backend, Worker, values, update_keys=update_keys)
        async with self._transaction() as db:
            row = await db.scalar(upsert.returning(Worker).execution_options(populate_existing=True))
            assert row is not None  # an upsert always returns its row
            return cv.worker_record(row)

    async def list_workers(self, *, state: str | None = None) -> list[WorkerRecord]:
        stmt = select(Worker).order_by(Worker.id)
        if state is not None:
            stmt = stmt.where(Worker.state == state)
        async with self._transaction(write=False) as db:
            return [cv.worker_record(row) for row in await db.scalars(stmt)]

    # API keys

    async def create_api_key(
        self, *, tenant_id: str, name: str, prefix: str, secret_hash: str, created_at: datetime
    ) -> ApiKeyRecord:
        async with self._transaction() as db:
            return await keys.create_api_key(
                db,
                self._backend,
                key_id=cv.new_id("key_"),
                tenant_id=tenant_id,
                name=name,
                prefix=prefix,
                secret_hash=secret_hash,
                created_at=cv.aware(created_at, "created_at"),
            )

    async def find_api_key(self, secret_hash: str) -> ApiKeyRecord | None:
        async with self._transaction(write=False) as db:
            return await keys.find_api_key(db, secret_hash)

    async def list_api_keys(self, *, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        async with self._transaction(write=False) as db:
            return list(await keys.list_api_keys(db, tenant_id=tenant_id))

    async def revoke_api_key(self, key_id: str, *, revoked_at: datetime) -> ApiKeyRecord:
        async with self._transaction() as db:
            return await keys.revoke_api_key(db, key_id, revoked_at=cv.aware(revoked_at, "revoked_at"))

    # tenants

    async def set_tenant_limits(
        self, tenant_id: str, *, max_concurrent: int | None, tokens_per_minute: int | None
    ) -> TenantRecord:
        async with self._transaction() as db:
            return await keys.set_tenant_limits(
                db,
                self._backend,
                tenant_id,
                max_concurrent=max_concurrent,
                tokens_per_minute=tokens_per_minute,
                now=self._clock(),
            )

    async def list_tenants(self, *, tenant_id: str | None = None, with_overrides: bool = False) -> list[TenantRecord]:
        async with self._transaction(write=False) as db:
            return await keys.list_tenants(db, tenant_id=tenant_id, with_overrides=with_overrides)

    # idempotency keys

    async def claim_idempotency_key(
        self, *, tenant_id: str, key: str, request_hash: str, now: datetime, stale_before: datetime
    ) -> IdempotencyRecord | None:
        async with self._transaction() as db:
            return await idempotency.claim(
                db,
                self._backend,
                tenant_id=tenant_id,
                key=key,
                request_hash=request_hash,
                now=cv.aware(now, "now"),
                stale_before=cv.aware(stale_before, "stale_before"),
            )

    async def complete_idempotency_key(
        self, *, tenant_id: str, key: str, turn_id: str, response: Mapping[str, Any]
    ) -> None:
        async with self._transaction() as db:
            await idempotency.complete(db, tenant_id=tenant_id, key=key, turn_id=turn_id, response=response)

    async def release_idempotency_key(self, *, tenant_id: str, key: str) -> None:
        async with self._transaction() as db:
            await idempotency.release(db, tenant_id=tenant_id, key=key)

    async def delete_idempotency_keys(self, *, created_before: datetime) -> int:
        async with self._transaction() as db:
            return await idempotency.delete_older_than(db, cv.aware(created_before, "created_before"))

    # gateway instance leases

    async def claim_instance(
        self,
        instance_id: str,
        *,
        run: str,
        host: str,
        pid: int,
        stale_before: datetime,
        holder_dead: Callable[[InstanceLease], bool],
    ) -> InstanceLease | None:
        async with self._transaction() as db:
            return await instances.claim(
                db,
                self._backend,
                instance_id=instance_id,
                run=run,
                host=host,
                pid=pid,
                now=self._clock(),
                stale_before=cv.aware(stale_before, "stale_before"),
                holder_dead=holder_dead,
            )

    async def heartbeat_instance(self, instance_id: str, *, run: str) -> bool:
        async with self._transaction() as db:
            return await instances.heartbeat(db, instance_id=instance_id, run=run, now=self._clock())

    async def release_instance(self, instance_id: str, *, run: str) -> None:
        async with self._transaction() as db:
            await instances.release(db, instance_id=instance_id, run=run)

    # lifecycle

    async def ping(self) -> None:
        async with self._transaction(write=False) as db:
            await db.execute(text("SELECT 1"))

    async def close(self) -> None:
        await self._engine.dispose()
        if self._group_commit is not None:
            self._group_commit.close()
        if self._sqlite_file is not None:
            self._sqlite_file.dispose()


def _implements_protocol(store: SqlSessionStore) -> SessionStore:
    return store  # mypy checks that SqlSessionStore satisfies SessionStore


def _store_error(exc: BaseException) -> BaseException:
    """The store's own error for a database failure (`StoreUnavailable` when it cannot be reached or is busy);
    any other exception as it is."""
    if isinstance(exc, Exception) and not isinstance(exc, StoreError) and is_unavailable(exc):
        translated = StoreUnavailable(f"session store unavailable: {type(exc).__name__}: {exc}")
        translated.__cause__ = exc
        return translated
    return exc

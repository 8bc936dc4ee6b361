"""`StoreTransactions`: the one place the store opens transactions; every aggregate's SQL mixin builds on it.

The gateway holds one store for the life of the process and calls it from many tasks at once: every call opens its
own transaction, commits before returning and returns frozen records, never ORM objects. The calls made for every
chat turn run as one step (`_per_request`: the group commit on an SQLite file, `run_sync` on PostgreSQL; see
`turn_write`), the others the ORM on an `AsyncSession` (`_transaction`) or Core on an `AsyncConnection`
(`_connection`); all translate database failures into `StoreUnavailable` (`store_error`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from sessiongate.sessions import _convert as cv
from sessiongate.sessions.database import sqlite_file_engine
from sessiongate.sessions.errors import StoreError, StoreUnavailable, is_unavailable
from sessiongate.sessions.records import StoreHealth
from sessiongate.sessions.turn_write import GroupCommitter, StoreMemory

__all__ = ["StoreTransactions", "store_error"]

P = ParamSpec("P")
T = TypeVar("T")


class StoreTransactions:
    """The engine, its transactions and what the store keeps between them (`StoreMemory`, the group commit)."""

    def __init__(self, engine: AsyncEngine, *, clock: Callable[[], datetime] = cv.utcnow) -> None:
        self._backend = engine.dialect.name
        if self._backend not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported database {self._backend!r}: use sqlite or postgresql")
        self._engine = engine
        self._sessionmaker = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock
        self._memory = StoreMemory()
        # The calls waiting for the database and those that found it unavailable: `health()`, read by /metrics.
        self._calls = _Calls()
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
                translate=store_error,
                guard_held=lambda: self._write_lock is not None and self._write_lock.locked(),
            )
        )

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    def health(self) -> StoreHealth:
        oldest = next(iter(self._calls.started.values()), None)
        return StoreHealth(
            calls_in_flight=len(self._calls.started),
            oldest_call_s=0.0 if oldest is None else time.monotonic() - oldest,
            unavailable=self._calls.unavailable,
        )

    @asynccontextmanager
    async def _writer_turn(self, write: bool) -> AsyncIterator[None]:
        if not write or self._write_lock is None:
            yield
            return
        async with self._write_lock:
            yield

    @asynccontextmanager
    async def _transaction(self, *, write: bool = True) -> AsyncIterator[AsyncSession]:
        with _Call(self._calls):
            async with self._writer_turn(write), self._sessionmaker() as db, db.begin():
                yield db

    @asynccontextmanager
    async def _connection(self, *, write: bool = True) -> AsyncIterator[AsyncConnection]:
        with _Call(self._calls):
            async with self._writer_turn(write), self._engine.begin() as conn:
                yield conn

    async def _per_request(self, work: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`work(conn, ...)` committed as a whole before this returns, as one step for the event loop. For the
        per-request writes (`turn_write.persist`, advisories, responses).

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
        with _Call(self._calls):  # already translated by the group commit: here for `health()`
            return await self._group_commit.run(lambda conn: work(conn, *args, **kwargs), alone=alone)

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


class _Calls:
    """The store's calls waiting for the database, each with its start time (insertion order: the first is the
    oldest), and how many found it unavailable."""

    def __init__(self) -> None:
        self.started: dict[_Call, float] = {}
        self.unavailable = 0


class _Call:
    """One store call, around its wait for the database: counted in flight while it runs, and a database failure in it
    raised as the store's own error (`store_error`), counted when it says the store is unavailable. A plain class: the
    chat route makes two calls a turn, and as a generator-based context manager this was 5% of the store's
    instructions a turn (docs/benchmarks.md)."""

    __slots__ = ("_calls",)

    def __init__(self, calls: _Calls) -> None:
        self._calls = calls

    def __enter__(self) -> None:
        self._calls.started[self] = time.monotonic()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        del self._calls.started[self]
        if not isinstance(exc, Exception):
            return
        translated = store_error(exc)
        if isinstance(translated, StoreUnavailable):
            self._calls.unavailable += 1
        if translated is not exc:
            raise translated from exc


def store_error(exc: BaseException) -> BaseException:
    """The store's own error for a database failure (`StoreUnavailable` when it cannot be reached or is busy);
    any other exception as it is."""
    if isinstance(exc, Exception) and not isinstance(exc, StoreError) and is_unavailable(exc):
        translated = StoreUnavailable(f"session store unavailable: {type(exc).__name__}: {exc}")
        translated.__cause__ = exc
        return translated
    return exc

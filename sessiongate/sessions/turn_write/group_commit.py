"""Group commit: the per-request transactions waiting for the SQLite file run together, in one transaction.

SQLite admits one writer at a time, so concurrent turns queue for the file anyway. Instead of one transaction
and one commit per turn, `GroupCommitter` takes every job queued by the time the file is free, runs them in one
transaction, commits once, and hands each caller its own result or error. A batch runs on the event loop's thread
when the file's write lock is free at once (the usual case: this process's writers take turns through `guard`),
else on a worker thread that waits for the lock. The per-turn cost then falls as concurrency
rises, and the rule "a turn is committed before a worker sees it" still holds: a caller's call returns only after
the commit that holds its job. A job its caller says is alone (no other write is coming to share its batch: the
store says so when at most one turn is in flight) runs at once in its own transaction, in the caller's step of the
event loop, when nothing is queued or running and the lock is free: the batch's task, its futures and the loop
steps it waits were 13% of the instructions of a non-streamed turn served alone (docs/benchmarks.md).

A job that raises has its own writes undone (the batch runs again, each job in a savepoint of its own) and its
caller gets the error; the others commit. Jobs must therefore not mind running twice: their writes are undone in
between, and what they keep in memory must stay right (a store's `StoreMemory` entry lost or made stale that way
only sends its turn down the general path). A commit that fails fails every job of the batch. A caller cancelled
while its job is queued or running still waits for the job's end (it may have committed), as a caller of a plain
transaction would.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

__all__ = ["GroupCommitter"]

T = TypeVar("T")

# A batch larger than this waits for the next one: it bounds how long the first job of a batch waits for the last.
MAX_BATCH = 64


@dataclass(slots=True)
class _Job(Generic[T]):
    work: Callable[[Connection], T]
    future: asyncio.Future[T]  # the caller's: cancelled with the caller
    outcome: tuple[bool, Any] | None = None  # (ok, result or exception), set on the worker thread
    ended: bool = False  # run (committed or not) or failed
    # Made only when the caller was cancelled before the job ended: done when it has.
    end: asyncio.Future[None] | None = None

    def finish(self) -> None:
        self.ended = True
        if self.end is not None and not self.end.done():
            self.end.set_result(None)


class GroupCommitter:
    """Runs `work(conn)` jobs in shared transactions on `engine`, one batch at a time.

    `guard` is entered around each batch (the store's writer lock, which its other SQLite writers also take), and
    `guard_held` says whether someone holds it now.
    `translate` turns a database exception into the store's own (e.g. `StoreUnavailable`) and returns any other
    exception as it is; it runs on the event loop, for a job's error and for a batch that failed as a whole.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        guard: Callable[[], AbstractAsyncContextManager[None]],
        translate: Callable[[BaseException], BaseException],
        max_batch: int = MAX_BATCH,
        guard_held: Callable[[], bool] = lambda: False,
    ) -> None:
        self._engine = engine
        self._guard = guard
        self._guard_held = guard_held
        self._translate = translate
        self._max_batch = max_batch
        self._queue: deque[_Job[Any]] = deque()
        self._draining: asyncio.Task[None] | None = None
        self._thread = anyio.CapacityLimiter(1)
        self.batches = 0  # committed batches and the jobs in them: the figures of `store_costs`
        self.jobs = 0
        self.waited = 0  # batches that found the write lock taken and waited for it on the worker thread
        self._inline: Connection | None = None

    async def run(self, work: Callable[[Connection], T], *, alone: bool = False) -> T:
        """`work(conn)`'s result once the transaction that ran it has committed (or its error, translated).

        `alone`: no other job is expected to join this one's batch, so it runs at once when it can."""
        draining = self._draining
        if alone and not self._queue and (draining is None or draining.done()) and not self._guard_held():
            outcome = self._run_now(work)
            if outcome is not None:
                ok, value = outcome
                if ok:
                    result: T = value
                    return result
                raise self._translate(value)
        # A job that joins a drain under way takes its loop: `asyncio.get_running_loop` makes a system call (getpid)
        # on Python 3.11, paid once a batch this way instead of once a job.
        loop = draining.get_loop() if draining is not None and not draining.done() else asyncio.get_running_loop()
        job: _Job[T] = _Job(work, loop.create_future())
        self._queue.append(job)
        if draining is None or draining.done():
            self._draining = loop.create_task(self._drain())
        try:
            return await job.future
        except asyncio.CancelledError:
            # The caller was cancelled, and its future with it; the job runs all the same and may commit, so the
            # caller waits for its end (as often as it is cancelled meanwhile), then passes the cancellation on.
            # (Not `asyncio.shield` around every call: its second future and callbacks were paid on every job.)
            if not job.ended:
                job.end = loop.create_future()
                while not job.end.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait([job.end])
            raise

    async def _drain(self) -> None:
        # One turn of the event loop before the first batch: the requests the loop is about to resume (answers
        # just read from workers, bodies just received) queue their jobs too, and the batch shares its BEGIN and
        # COMMIT among more of them. At concurrency 16 that took 10-15% off the gateway's CPU per turn, and the
        # latency it added was less than the commits it saved (docs/benchmarks.md).
        await asyncio.sleep(0)
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
            try:
                async with self._guard():
                    if not self._run_inline(batch):
                        self.waited += 1
                        await anyio.to_thread.run_sync(self._run_batch, batch, limiter=self._thread)
            except BaseException as exc:
                error = self._translate(exc) if isinstance(exc, Exception) else exc
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                    job.finish()
                if not isinstance(exc, Exception):
                    self._fail_queued(error)
                    raise
                continue
            self.batches += 1
            self.jobs += len(batch)
            for job in batch:
                assert job.outcome is not None
                ok, value = job.outcome
                if not job.future.done():
                    if ok:
                        job.future.set_result(value)
                    else:
                        job.future.set_exception(self._translate(value))
                job.finish()

    def _run_now(self, work: Callable[[Connection], Any]) -> tuple[bool, Any] | None:
        """`work` in a transaction of its own on the event loop's connection, committed before this returns, with
        no step of the event loop in between (so no caller can be cancelled half-way); its (ok, result or
        exception), or None if another connection holds the file's write lock (the job is then queued)."""
        began = False
        try:
            conn = self._inline_connection()
            _begin(conn)
            began = True
            outcome = self._run_alone(conn, work)
            _commit(conn)
        except BaseException as exc:
            if not began:
                if isinstance(exc, OperationalError) and _busy(exc):
                    return None
            else:
                _rollback(conn)
            error = self._translate(exc) if isinstance(exc, Exception) else exc
            if error is exc:
                raise
            raise error from exc
        self.batches += 1
        self.jobs += 1
        return outcome

    def _fail_queued(self, error: BaseException) -> None:
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(error)
            job.finish()

    def _run_inline(self, batch: list[_Job[Any]]) -> bool:
        """Run the batch on the event loop's own thread if the file's write lock is free now; False if another
        connection holds it (then the batch waits for it on the worker thread, under the busy timeout).

        With the lock taken at once, a batch is a few dozen microseconds of SQLite per job (WAL, no fsync per
        commit), and while it holds the GIL, its Python (most of its time) stops the event loop on a worker thread
        just the same. On the thread every SQLite call released the GIL and took it back, each time against the
        busy event loop, and the thread hop and the handovers cost more CPU than the batch itself."""
        conn = self._inline_connection()
        try:
            _begin(conn)
        except OperationalError as exc:
            if _busy(exc):
                return False
            raise
        self._run_begun(conn, batch)
        return True

    def _inline_connection(self) -> Connection:
        """The event loop's own connection, kept open between batches (no pool checkout and reset per batch); its
        busy timeout is 0, so that a batch never waits on the event loop for another writer's lock."""
        conn = self._inline
        if conn is None or conn.closed or conn.invalidated:
            conn = self._engine.connect()
            driver = conn.connection.driver_connection
            assert driver is not None
            driver.execute("PRAGMA busy_timeout=0")
            self._inline = conn
        return conn

    def close(self) -> None:
        if self._inline is not None:
            self._inline.close()
            self._inline = None

    def _run_batch(self, batch: list[_Job[Any]]) -> None:
        """On the worker thread: every job in its savepoint, then one commit (which raises for the whole batch)."""
        with self._engine.connect() as conn:
            _begin(conn)
            self._run_begun(conn, batch)

    def _run_begun(self, conn: Connection, batch: list[_Job[Any]]) -> None:
        """In the transaction begun on `conn`: every job, then one commit (which raises for the whole batch).

        The jobs first run one after the other in one savepoint for them all: a job rarely fails, and two
        statements per job (its own SAVEPOINT and RELEASE) were a fifth of the SQLite statements of a turn. When
        one fails, the batch's writes are rolled back to that savepoint and every job runs again in a savepoint of
        its own, so that the failed one's writes alone are undone."""
        try:
            if len(batch) == 1:  # alone: the transaction is its own, no savepoint to pay for
                batch[0].outcome = self._run_alone(conn, batch[0].work)
            elif not self._run_together(conn, batch):
                for job in batch:
                    self._run_in_savepoint(conn, job)
            _commit(conn)
        except BaseException:
            _rollback(conn)
            raise

    @staticmethod
    def _run_alone(conn: Connection, work: Callable[[Connection], Any]) -> tuple[bool, Any]:
        """One job in the transaction begun on `conn`, which it has to itself: its outcome; when it raised, its
        writes are rolled back and an empty transaction is begun for the commit that follows."""
        try:
            return True, work(conn)
        except Exception as exc:
            _rollback(conn)
            _begin(conn)
            return False, exc

    @staticmethod
    def _run_together(conn: Connection, batch: list[_Job[Any]]) -> bool:
        """Every job of `batch` in one savepoint; False, with none of their writes left, if one of them raised."""
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.execute("SAVEPOINT batch")
        for job in batch:
            try:
                job.outcome = (True, job.work(conn))
            except Exception:
                driver.execute("ROLLBACK TO SAVEPOINT batch")
                driver.execute("RELEASE SAVEPOINT batch")
                return False
        driver.execute("RELEASE SAVEPOINT batch")
        return True

    @staticmethod
    def _run_in_savepoint(conn: Connection, job: _Job[Any]) -> None:
        # Plain SQL savepoints straight on the driver's connection: SQLAlchemy's `begin_nested` compiles a new
        # statement for each (no cache key), and even `exec_driver_sql` builds an execution context and a result
        # per statement, two per job, which cost more CPU than the job itself. SQLAlchemy's own transaction (begun
        # by the batch's BEGIN IMMEDIATE) is unaffected: a savepoint released or rolled back leaves it open.
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.execute("SAVEPOINT job")
        try:
            value = job.work(conn)
        except Exception as exc:
            driver.execute("ROLLBACK TO SAVEPOINT job")
            driver.execute("RELEASE SAVEPOINT job")
            job.outcome = (False, exc)
        else:
            driver.execute("RELEASE SAVEPOINT job")
            job.outcome = (True, value)


# A batch's transaction, on the driver's connection. The engine leaves transactions to us
# (sessions.database.sqlite_file_engine): a writer takes the write lock at BEGIN, so it never fails half-way to upgrade
# its lock. Straight on the driver: through SQLAlchemy (`exec_driver_sql`, `Connection.commit`) each cost more than
# the statement. A job's statement that goes through SQLAlchemy's execution begins SQLAlchemy's own bookkeeping of the
# transaction (no SQL on this engine): ending that too keeps the connection's state true.


def _driver(conn: Connection) -> sqlite3.Connection:
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    return driver


def _busy(exc: OperationalError) -> bool:
    """The error of a BEGIN IMMEDIATE that found another connection holding the file's write lock."""
    return isinstance(exc.orig, sqlite3.Error) and exc.orig.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY


def _begin(conn: Connection) -> None:
    try:
        _driver(conn).execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:  # busy or locked: raised as SQLAlchemy would, which the store translates
        raise OperationalError("BEGIN IMMEDIATE", None, exc) from exc


def _commit(conn: Connection) -> None:
    _driver(conn).commit()
    if conn.in_transaction():
        conn.commit()  # the driver's transaction is over: this only ends SQLAlchemy's bookkeeping


def _rollback(conn: Connection) -> None:
    _driver(conn).rollback()
    if conn.in_transaction():
        conn.rollback()

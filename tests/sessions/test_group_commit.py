"""The SQLite group commit: concurrent per-request writes share transactions, each job keeps its own outcome.

On a real SQLite file through the same engine the store uses (`sqlite_file_engine`), and through the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.exc import OperationalError

from sessiongate.sessions import SqlSessionStore, StoreUnavailable, create_engine, upgrade_sync
from sessiongate.sessions.database import sqlite_file_engine
from sessiongate.sessions.turn_write.group_commit import GroupCommitter

pytestmark = pytest.mark.anyio


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    sync = sqlite_file_engine(create_engine(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"))
    assert sync is not None
    with sync.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (k TEXT PRIMARY KEY)")
    yield sync
    sync.dispose()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqlSessionStore]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    upgrade_sync(url)
    store = SqlSessionStore(create_engine(url))
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _no_guard() -> AsyncIterator[None]:
    yield


def _committer(engine: Engine) -> GroupCommitter:
    return GroupCommitter(engine, guard=_no_guard, translate=lambda exc: exc)


def _insert(key: str, fail: bool = False) -> Callable[[Connection], str]:
    def work(conn: Connection) -> str:
        conn.execute(text("INSERT INTO t (k) VALUES (:k)"), {"k": key})
        if fail:
            raise ValueError(f"job {key} failed after its write")
        return key

    return work


def _keys(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return {row[0] for row in conn.execute(text("SELECT k FROM t"))}


async def test_concurrent_jobs_share_transactions_and_each_gets_its_result(engine: Engine) -> None:
    committer = _committer(engine)
    results = await asyncio.gather(*(committer.run(_insert(f"k{i}")) for i in range(40)))
    assert results == [f"k{i}" for i in range(40)]
    assert _keys(engine) == {f"k{i}" for i in range(40)}
    assert committer.jobs == 40
    assert committer.batches < 40  # grouped: the first batch runs alone, the rest queue behind it


async def test_a_failing_job_rolls_back_only_its_own_writes(engine: Engine) -> None:
    committer = _committer(engine)
    outcomes = await asyncio.gather(
        committer.run(_insert("before")),
        committer.run(_insert("bad", fail=True)),
        committer.run(_insert("after")),
        return_exceptions=True,
    )
    assert outcomes[0] == "before"
    assert outcomes[2] == "after"
    assert isinstance(outcomes[1], ValueError)
    assert _keys(engine) == {"before", "after"}  # "bad" was written, then rolled back to its savepoint


async def test_jobs_run_once_unless_one_of_their_batch_fails_then_again_each_alone(engine: Engine) -> None:
    committer = _committer(engine)
    runs: list[str] = []

    def counted(key: str, fail: bool = False) -> Callable[[Connection], str]:
        insert = _insert(key, fail)

        def work(conn: Connection) -> str:
            runs.append(key)
            return insert(conn)

        return work

    await committer.run(counted("first"))  # alone; the next three queue behind it and share a batch
    await asyncio.gather(*(committer.run(counted(key)) for key in ("a", "b", "c")))
    assert sorted(runs) == ["a", "b", "c", "first"]

    runs.clear()
    outcomes = await asyncio.gather(
        committer.run(counted("d")),
        committer.run(counted("bad", fail=True)),
        committer.run(counted("e")),
        return_exceptions=True,
    )
    assert (outcomes[0], outcomes[2]) == ("d", "e")
    assert isinstance(outcomes[1], ValueError)
    assert runs == ["d", "bad", "d", "bad", "e"]  # "e" never ran in the first pass: it stopped at "bad"
    assert _keys(engine) == {"first", "a", "b", "c", "d", "e"}


async def test_a_job_that_breaks_a_constraint_fails_alone(engine: Engine) -> None:
    committer = _committer(engine)
    await committer.run(_insert("taken"))
    outcomes = await asyncio.gather(
        committer.run(_insert("taken")),
        committer.run(_insert("free")),
        return_exceptions=True,
    )
    assert type(outcomes[0]).__name__ == "IntegrityError"
    assert outcomes[1] == "free"
    assert _keys(engine) == {"taken", "free"}


async def test_a_batch_that_cannot_begin_fails_every_job_with_the_translated_error(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    sync = sqlite_file_engine(create_engine(f"sqlite+aiosqlite:///{path}"))
    assert sync is not None
    # Fail at once instead of after the store's busy timeout.
    event.listen(sync, "connect", lambda dbapi, record: dbapi.execute("PRAGMA busy_timeout=0"))
    with sync.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (k TEXT PRIMARY KEY)")

    def translate(exc: BaseException) -> BaseException:
        return StoreUnavailable(str(exc)) if isinstance(exc, OperationalError) else exc

    committer = GroupCommitter(sync, guard=_no_guard, translate=translate)
    holder = sqlite3.connect(path, isolation_level=None)  # another process's writer, holding the write lock
    holder.execute("BEGIN IMMEDIATE")
    try:
        outcomes = await asyncio.gather(
            committer.run(_insert("a")),
            committer.run(_insert("b")),
            return_exceptions=True,
        )
    finally:
        holder.rollback()
        holder.close()
    assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
    assert _keys(sync) == set()
    sync.dispose()


async def test_a_cancelled_caller_waits_for_its_job_which_commits(engine: Engine) -> None:
    committer = _committer(engine)
    task = asyncio.create_task(committer.run(_insert("queued")))
    await asyncio.sleep(0)  # the job is queued, its batch not run yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _keys(engine) == {"queued"}  # the caller's cancel came back only after the commit


async def test_a_caller_cancelled_again_while_it_waits_still_waits_for_the_commit(
    engine: Engine, tmp_path: Path
) -> None:
    committer = _committer(engine)
    await committer.run(_insert("first"))  # the committer's own connection is open
    holder = sqlite3.connect(tmp_path / "g.db", isolation_level=None, check_same_thread=False)  # another writer
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, holder.rollback)
    released.start()
    try:
        started = time.monotonic()
        task = asyncio.create_task(committer.run(_insert("waiting")))
        await asyncio.sleep(0.05)  # its batch waits for the lock on the worker thread
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for its job's end
        task.cancel()  # and once more while it waits
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started >= 0.25  # it came back only after the lock was free and the commit made
    finally:
        released.join()
        holder.close()
    assert _keys(engine) == {"first", "waiting"}


async def test_a_batch_that_finds_the_file_locked_waits_for_it_on_the_worker_thread(
    engine: Engine, tmp_path: Path
) -> None:
    committer = _committer(engine)
    await committer.run(_insert("first"))
    assert committer.waited == 0  # the lock was free: the batch ran at once, on the event loop
    holder = sqlite3.connect(tmp_path / "g.db", isolation_level=None, check_same_thread=False)  # another writer
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, holder.rollback)
    released.start()
    loop_ran = asyncio.Event()

    async def tick() -> None:
        await asyncio.sleep(0.05)
        loop_ran.set()

    try:
        started = time.monotonic()
        _, result = await asyncio.gather(tick(), committer.run(_insert("second")))
        assert result == "second"
        assert time.monotonic() - started >= 0.25  # it waited for the lock...
        assert loop_ran.is_set()  # ...off the event loop, which kept running
        assert committer.waited == 1
    finally:
        released.join()
        holder.close()
    assert _keys(engine) == {"first", "second"}


def _loop_stepped() -> list[int]:
    """A list that gets an item at the event loop's next step."""
    stepped: list[int] = []
    asyncio.get_running_loop().call_soon(stepped.append, 1)
    return stepped


async def test_a_job_alone_commits_at_once_without_a_step_of_the_event_loop(engine: Engine) -> None:
    committer = _committer(engine)
    stepped = _loop_stepped()
    assert await committer.run(_insert("alone"), alone=True) == "alone"
    assert stepped == []  # committed in the caller's own step: no batch task, no wait for others to join
    assert _keys(engine) == {"alone"}
    assert (committer.batches, committer.jobs) == (1, 1)
    stepped = _loop_stepped()
    assert await committer.run(_insert("queued")) == "queued"
    assert stepped == [1]  # a job not alone waits a step for others, in a batch


async def test_a_job_alone_that_raises_leaves_none_of_its_writes(engine: Engine) -> None:
    committer = _committer(engine)
    with pytest.raises(ValueError, match="job x failed"):
        await committer.run(_insert("x", fail=True), alone=True)
    assert await committer.run(_insert("y"), alone=True) == "y"
    assert _keys(engine) == {"y"}


async def test_a_job_alone_joins_a_batch_that_is_waiting(engine: Engine) -> None:
    committer = _committer(engine)
    queued = asyncio.create_task(committer.run(_insert("first")))
    await asyncio.sleep(0)  # queued, its batch waiting a step
    assert await committer.run(_insert("second"), alone=True) == "second"
    assert await queued == "first"
    assert (committer.batches, committer.jobs) == (1, 2)  # one batch: the second did not overtake the first


async def test_a_job_alone_waits_its_turn_while_the_guard_is_held(engine: Engine) -> None:
    committer = GroupCommitter(engine, guard=_no_guard, translate=lambda exc: exc, guard_held=lambda: True)
    stepped = _loop_stepped()
    assert await committer.run(_insert("a"), alone=True) == "a"
    assert stepped == [1]  # queued behind the holder, not run in the caller's step


async def test_a_job_alone_that_finds_the_file_locked_waits_for_it_on_the_worker_thread(
    engine: Engine, tmp_path: Path
) -> None:
    committer = _committer(engine)
    holder = sqlite3.connect(tmp_path / "g.db", isolation_level=None, check_same_thread=False)  # another writer
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(0.3, holder.rollback)
    released.start()
    try:
        started = time.monotonic()
        assert await committer.run(_insert("late"), alone=True) == "late"
        assert time.monotonic() - started >= 0.25
        assert committer.waited == 1
    finally:
        released.join()
        holder.close()
    assert _keys(engine) == {"late"}


async def test_a_job_alone_that_the_database_refuses_gets_the_stores_error(sqlite_store: SqlSessionStore) -> None:
    committer = sqlite_store._group_commit
    assert committer is not None

    def refused(conn: Connection) -> None:
        raise OperationalError("INSERT", None, sqlite3.OperationalError("disk I/O error"))

    with pytest.raises(StoreUnavailable):
        await committer.run(refused, alone=True)


async def test_a_turn_alone_is_committed_at_once_and_concurrent_ones_share_batches(
    sqlite_store: SqlSessionStore,
) -> None:
    store = sqlite_store
    committer = store._group_commit
    assert committer is not None
    now = datetime.now(UTC)

    async def begin(session_id: str) -> str:
        begun = await store.begin_turn(
            session_id,
            tenant_id="t",
            create_session=True,
            messages=[{"role": "user", "content": "hi"}],
            request={},
            received_at=now,
        )
        return begun.id

    stepped = _loop_stepped()
    turn_id = await begin("alone")
    await store.complete_turn(
        turn_id,
        output_message={"role": "assistant", "content": "hello"},
        finish_reason="stop",
        model="m",
        ended_at=now,
    )
    assert stepped == []  # neither the turn's start nor its end waited for company
    assert (committer.batches, committer.jobs) == (2, 2)
    # Two turns already in flight: the next turns' writes queue and share transactions.
    await asyncio.gather(begin("a"), begin("b"))
    batches = committer.batches
    await asyncio.gather(*(begin(f"s{i}") for i in range(8)))
    assert committer.batches - batches < 8


async def test_the_store_groups_concurrent_turns(sqlite_store: SqlSessionStore) -> None:
    store = sqlite_store
    now = datetime.now(UTC)
    turns = await asyncio.gather(
        *(
            store.begin_turn(
                f"s{i}",
                tenant_id="t",
                create_session=True,
                messages=[{"role": "user", "content": f"hi {i}"}],
                request={},
                received_at=now,
            )
            for i in range(24)
        )
    )
    assert {t.session_id for t in turns} == {f"s{i}" for i in range(24)}
    for i in range(24):
        listed = await store.list_turns(f"s{i}", tenant_id="t")
        assert [t.status for t in listed] == ["pending"]
    committer = store._group_commit
    assert committer is not None
    assert committer.jobs == 24
    assert committer.batches < 24


def _temporary_files() -> list[str]:
    """SQLite's temporary files open in this process (created, then unlinked at once: "etilqs_... (deleted)")."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = fd.readlink().name
            if target.startswith("etilqs_"):
                found.append(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the open files")
async def test_a_large_batch_keeps_its_savepoint_journal_in_memory(engine: Engine) -> None:
    # A batch's jobs share a savepoint; the pages it changes are copied into a statement journal, which SQLite
    # spills to a temporary file past 64 KiB (open, unlink, a write per page, close: system calls on every large
    # batch) unless temp_store is MEMORY.
    # Only pages that existed before the savepoint are journaled: the batch rewrites rows already on disk.
    keys = [f"{i:03d}" for i in range(60)]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO t (k) VALUES (:k)"), [{"k": key + "x" * 2000} for key in keys])
    seen: list[str] = []

    def rewrite(key: str) -> Callable[[Connection], str]:
        def work(conn: Connection) -> str:
            conn.execute(
                text("UPDATE t SET k = :new WHERE k = :old"), {"old": key + "x" * 2000, "new": key + "y" * 2000}
            )
            seen.extend(_temporary_files())
            return key

        return work

    committer = _committer(engine)
    assert await asyncio.gather(*(committer.run(rewrite(k)) for k in keys)) == keys
    assert committer.batches == 1
    assert seen == []
    assert len([k for k in _keys(engine) if k.endswith("y")]) == len(keys)
    committer.close()

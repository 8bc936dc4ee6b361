"""Gateway instance leases, on SQLite and PostgreSQL: one run holds an id; a live holder keeps it, a stale or
dead one is taken over, exactly once; a released lease is free at once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from sessiongate.sessions import InstanceLease, SqlSessionStore

from .conftest import CLOCK_START

pytestmark = pytest.mark.anyio

LONG_AGO = CLOCK_START - timedelta(days=1)
FUTURE = CLOCK_START + timedelta(days=1)


def alive(holder: InstanceLease) -> bool:
    return False


def dead(holder: InstanceLease) -> bool:
    return True


async def _claim(
    store: SqlSessionStore,
    run: str,
    *,
    stale_before: datetime = LONG_AGO,
    holder_dead: Callable[[InstanceLease], bool] = alive,
) -> InstanceLease | None:
    return await store.claim_instance(
        "replica-a", run=run, host="h1", pid=100, stale_before=stale_before, holder_dead=holder_dead
    )


async def test_a_live_holder_keeps_its_id(store: SqlSessionStore) -> None:
    assert await _claim(store, "run-1") is None
    assert await _claim(store, "run-1") is None  # the holder itself may claim again
    holder = await _claim(store, "run-2")
    assert holder is not None
    assert (holder.run, holder.host, holder.pid) == ("run-1", "h1", 100)
    assert await store.heartbeat_instance("replica-a", run="run-1")
    assert not await store.heartbeat_instance("replica-a", run="run-2")
    # Another id is independent.
    other = await store.claim_instance(
        "replica-b", run="run-2", host="h1", pid=101, stale_before=LONG_AGO, holder_dead=alive
    )
    assert other is None


async def test_stale_or_dead_holders_are_taken_over(store: SqlSessionStore) -> None:
    assert await _claim(store, "run-1") is None
    assert await _claim(store, "run-2", stale_before=FUTURE) is None  # run-1's heartbeat is older: stale
    assert not await store.heartbeat_instance("replica-a", run="run-1")  # run-1 learns it lost the id
    assert await _claim(store, "run-3", holder_dead=dead) is None
    assert await _claim(store, "run-2") is not None  # run-3 holds it now


async def test_a_released_id_is_free_at_once(store: SqlSessionStore) -> None:
    assert await _claim(store, "run-1") is None
    await store.release_instance("replica-a", run="run-2")  # not the holder: nothing happens
    assert await _claim(store, "run-2") is not None
    await store.release_instance("replica-a", run="run-1")
    assert await _claim(store, "run-2") is None

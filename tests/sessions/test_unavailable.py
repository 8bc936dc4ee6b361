"""A database that cannot be reached is `StoreUnavailable`, on every call, quickly."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sessiongate.sessions import SqlSessionStore, StoreUnavailable, create_engine, upgrade

pytestmark = pytest.mark.anyio

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there once the socket is closed


def unreachable_url(kind: str, tmp_path: Path) -> str:
    if kind == "postgresql":
        return f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port()}/postgres"
    return f"sqlite+aiosqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'sessions.db'}"


CALLS: list[Callable[[SqlSessionStore], Awaitable[object]]] = [
    lambda store: store.ping(),
    lambda store: store.create_session(),
    lambda store: store.get_or_create_session("s", tenant_id="default"),
    lambda store: store.begin_turn("s", tenant_id="default", messages=[], request={}, received_at=NOW),
    lambda store: store.list_workers(),
]


async def _join_aiosqlite_threads(before: set[threading.Thread]) -> None:
    # After a failed connect aiosqlite stops its worker thread without awaiting it; the thread then reports
    # to the event loop, and raises in the thread if the test's loop is already closed. Let it finish first.
    for thread in set(threading.enumerate()) - before:
        if "_connection_worker_thread" in thread.name:
            await asyncio.to_thread(thread.join, 5)


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
async def test_unreachable_database_is_store_unavailable(kind: str, tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = SqlSessionStore(create_engine(unreachable_url(kind, tmp_path)))
    try:
        for call in CALLS:
            with pytest.raises(StoreUnavailable):
                await call(store)
    finally:
        await store.close()
        await _join_aiosqlite_threads(before)


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
async def test_upgrade_of_an_unreachable_database_is_store_unavailable(kind: str, tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await upgrade(unreachable_url(kind, tmp_path))


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
async def test_health_counts_the_calls_that_found_the_database_unavailable(kind: str, tmp_path: Path) -> None:
    before = set(threading.enumerate())
    store = SqlSessionStore(create_engine(unreachable_url(kind, tmp_path)))
    try:
        assert store.health().unavailable == 0
        for call in CALLS:
            with pytest.raises(StoreUnavailable):
                await call(store)
        health = store.health()
        assert health.unavailable == len(CALLS)
        assert (health.calls_in_flight, health.oldest_call_s) == (0, 0.0)  # each failed call left
    finally:
        await store.close()
        await _join_aiosqlite_threads(before)


async def test_health_shows_a_call_waiting_and_for_how_long(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"
    await upgrade(url)
    store = SqlSessionStore(create_engine(url))
    try:
        # A writer waits for this process's SQLite write lock, as it would for a database that does not answer.
        lock = store._write_lock
        assert lock is not None
        async with lock:
            waiting = asyncio.create_task(store.create_session())
            await asyncio.sleep(0.3)
            health = store.health()
            assert health.calls_in_flight == 1
            assert 0.25 <= health.oldest_call_s < 5
        await waiting
        assert store.health().calls_in_flight == 0
        assert store.health().unavailable == 0
    finally:
        await store.close()

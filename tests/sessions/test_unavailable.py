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

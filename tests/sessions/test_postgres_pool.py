"""A PostgreSQL engine keeps a fixed set of connections (`sessions.database.POSTGRES_POOL_SIZE`, no overflow): a load
that sways around the pool's size must not open a new server process for every few calls. With SQLAlchemy's default
pool (5 kept, 10 overflow, each overflow connection closed when returned) 32 sessions at 245 turns/s opened 192
server processes in 20 s for at most 15 at once."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL

from sessiongate.sessions.database import create_engine

pytestmark = pytest.mark.anyio


async def test_bursts_past_the_pool_size_reuse_the_same_server_processes(postgres_database: URL) -> None:
    engine = create_engine(postgres_database, pool_size=3)
    backends: list[int] = []
    most_at_once = 0
    at_once = 0

    async def call() -> None:
        nonlocal at_once, most_at_once
        async with engine.connect() as connection:
            at_once += 1
            most_at_once = max(most_at_once, at_once)
            backends.append(await connection.scalar(text("SELECT pg_backend_pid()")))
            await connection.execute(text("SELECT pg_sleep(0.02)"))
            at_once -= 1

    try:
        for _ in range(5):  # bursts of 8 calls, then the pool at rest
            await asyncio.gather(*(call() for _ in range(8)))
    finally:
        await engine.dispose()
    assert len(backends) == 40
    assert most_at_once == 3, "calls past the pool's size wait for a connection"
    assert len(set(backends)) == 3, f"{len(set(backends))} server processes for a pool of 3"

"""PostgreSQL connections carry TCP timeouts (`sessions.database.UNACKNOWLEDGED_TIMEOUT_S`), so a server cut off by
a network partition fails a statement in seconds (tests/faults/test_cluster_netns.py provokes one). The socket is
reached through asyncpg's private `Connection._transport`: this test fails if an asyncpg upgrade removes it."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy.engine import URL

from sessiongate.sessions.database import UNACKNOWLEDGED_TIMEOUT_S, _connection_socket, create_engine

pytestmark = pytest.mark.anyio


async def test_a_postgres_connection_gives_up_on_unacknowledged_bytes(postgres_database: URL) -> None:
    engine = create_engine(postgres_database)
    try:
        async with engine.connect() as connection:
            raw = await connection.get_raw_connection()
            sock = _connection_socket(raw.dbapi_connection)
            assert sock is not None, "asyncpg's Connection._transport is gone: update sessions.database"
            user_timeout_ms = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
            assert user_timeout_ms == round(UNACKNOWLEDGED_TIMEOUT_S * 1000)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    finally:
        await engine.dispose()

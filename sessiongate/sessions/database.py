"""Engines and schema migrations: `create_engine(url)` with the per-backend settings, `upgrade(url)`.

SQLite (`sqlite+aiosqlite:///path`) gets WAL journaling, foreign keys and a 5 s busy timeout on every new
connection; PostgreSQL (`postgresql+asyncpg://...`) gets a pool of a fixed size (`POSTGRES_POOL_SIZE`), pre-ping, a
5 s connect timeout, a statement timeout, and TCP timeouts on its sockets (`UNACKNOWLEDGED_TIMEOUT_S`): a server that
a network partition cut off (no refusal, no reset: its packets just vanish) fails a statement within seconds, where
the statement timeout (30 s) or the kernel's retransmissions (~15 min) would hold every request that long.
`upgrade` runs Alembic's `upgrade head` with the migrations shipped in this package; the Alembic
configuration is built in code (there is no alembic.ini). A database that cannot be reached raises
`StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .errors import StoreUnavailable, is_unavailable

__all__ = [
    "CONNECT_TIMEOUT_S",
    "POSTGRES_POOL_SIZE",
    "SQLITE_BUSY_TIMEOUT_MS",
    "STATEMENT_TIMEOUT_S",
    "UNACKNOWLEDGED_TIMEOUT_S",
    "alembic_config",
    "create_engine",
    "sqlite_file_engine",
    "upgrade",
    "upgrade_sync",
]

SQLITE_BUSY_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_S = 5.0
STATEMENT_TIMEOUT_S = 30.0
UNACKNOWLEDGED_TIMEOUT_S = 3.0
"""A PostgreSQL connection whose sent bytes the server's host has not acknowledged for this long is dead
(`TCP_USER_TIMEOUT`); an idle one is probed after as long (TCP keepalive). A slow query is not affected: its
server's kernel acknowledges the bytes at once, however long the query takes."""
POSTGRES_POOL_SIZE = 15
"""Connections to PostgreSQL an engine keeps open, and the most it opens: a store call past them waits for one.
Without overflow on purpose: SQLAlchemy closes an overflow connection as soon as it is returned, so a load that
sways around the pool's size opened a new connection (a server process, its authentication and asyncpg's type
introspection) for every few turns: 192 server processes in 20 s for at most 15 at once, at 245 turns/s of 32
sessions, and a server whose memory saw-toothed with them. 15 is the old pool's most (5 kept and 10 overflow)."""

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _set_sqlite_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL is durable across application crashes (only an OS crash or power loss can drop the
        # last commits) and saves an fsync per commit: a store write per turn costs a fraction of FULL's.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # The group commit's savepoint journals the pages a batch changes; past 64 KiB SQLite spills that journal
        # to a temporary file (open, unlink, a write per page, close) unless temporary storage is in memory.
        cursor.execute("PRAGMA temp_store=MEMORY")
    finally:
        cursor.close()


def json_dumps(value: Any) -> str:
    """JSON columns' serializer: orjson (a fifth of the stdlib's CPU per turn), the stdlib for what orjson refuses
    (a lone surrogate, an integer over 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)


def json_loads(text: str | bytes) -> Any:
    """JSON columns' deserializer: orjson, the stdlib for what only it reads (NaN written by an earlier version)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def create_engine(url: str | URL, *, pool_size: int = POSTGRES_POOL_SIZE, **kwargs: Any) -> AsyncEngine:
    """An async engine for `url`, SQLite (aiosqlite) or PostgreSQL (asyncpg); `kwargs` go to SQLAlchemy.
    `pool_size`: PostgreSQL's connections, each kept open once opened (no overflow). SQLite's file is written
    through one connection of the store's own (`sqlite_file_engine`): its async engine's pool is SQLAlchemy's."""
    kwargs.setdefault("json_serializer", json_dumps)
    kwargs.setdefault("json_deserializer", json_loads)
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engine = create_async_engine(parsed, **kwargs)
        event.listen(engine.sync_engine, "connect", _set_sqlite_pragmas)
        return engine
    if backend == "postgresql":
        connect_args: dict[str, Any] = {}
        if parsed.get_driver_name() == "asyncpg":
            connect_args = {"timeout": CONNECT_TIMEOUT_S, "command_timeout": STATEMENT_TIMEOUT_S}
        connect_args.update(kwargs.pop("connect_args", {}))
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("max_overflow", 0)
        engine = create_async_engine(parsed, connect_args=connect_args, pool_size=pool_size, **kwargs)
        event.listen(engine.sync_engine, "connect", _set_tcp_timeouts)
        return engine
    raise ValueError(f"unsupported database URL {parsed.render_as_string()!r}: use sqlite or postgresql")


def _connection_socket(dbapi_connection: Any) -> socket.socket | None:
    """The TCP socket under an asyncpg connection, or None (a Unix socket, another driver). asyncpg has no public
    way to it: its `Connection._transport` (asyncpg 0.32; tests/sessions/test_postgres_tcp_timeouts.py notices if
    an upgrade removes it), then asyncio's public `get_extra_info("socket")`."""
    transport = getattr(getattr(dbapi_connection, "driver_connection", None), "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock  # type: ignore[no-any-return]


def _set_tcp_timeouts(dbapi_connection: Any, connection_record: Any) -> None:
    sock = _connection_socket(dbapi_connection)
    if sock is None:
        return
    seconds = max(1, round(UNACKNOWLEDGED_TIMEOUT_S))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, round(UNACKNOWLEDGED_TIMEOUT_S * 1000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)


def sqlite_file_engine(engine: AsyncEngine) -> Engine | None:
    """A synchronous engine (the standard `sqlite3` driver) on the same SQLite file as `engine`, with the same
    settings; None for an in-memory database, which another engine could not see.

    The store runs each per-request transaction on it in one worker-thread step. Through aiosqlite every
    statement is several hops between the event loop and aiosqlite's thread (cursor, execute, fetch, close), and
    those hops, not SQLite, were most of a turn's store cost.
    """
    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    sync = sa_create_engine(
        url.set(drivername="sqlite+pysqlite"),
        # One transaction at a time runs on it (the store's group commit), from a thread pool's threads.
        connect_args={"check_same_thread": False},
        json_serializer=json_dumps,
        json_deserializer=json_loads,
    )
    event.listen(sync, "connect", _take_transaction_control)
    event.listen(sync, "connect", _set_sqlite_pragmas)
    return sync


def _take_transaction_control(dbapi_connection: Any, connection_record: Any) -> None:
    # The sqlite3 module's own transaction handling issues BEGIN only before some statements and gets in the way of
    # SAVEPOINT, which the group commit gives each job. Its user issues `BEGIN IMMEDIATE` itself instead (not from
    # SQLAlchemy's "begin" event: any connection event makes every statement dispatch events, a third of its cost).
    dbapi_connection.isolation_level = None


def alembic_config(url: str | URL) -> Config:
    """The Alembic configuration for this package's migrations, pointed at `url`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Handed over in attributes rather than as an option: options go through ConfigParser interpolation.
    config.attributes["url"] = make_url(url)
    return config


def upgrade_sync(url: str | URL) -> None:
    """Migrate the database at `url` to the newest schema; a no-op when it is already there.

    Runs its own event loop (the migration environment is async): call it from synchronous code such as
    the CLI, or use `upgrade` from a coroutine.
    """
    try:
        command.upgrade(alembic_config(url), "head")
    except Exception as exc:
        if is_unavailable(exc):
            raise StoreUnavailable(f"cannot migrate the database: {exc}") from exc
        raise


async def upgrade(url: str | URL) -> None:
    """`upgrade_sync` in a worker thread, so the caller's event loop keeps running."""
    await asyncio.to_thread(upgrade_sync, url)

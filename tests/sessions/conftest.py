"""Fixtures for the session store tests: a migrated store on SQLite and on a real PostgreSQL server.

PostgreSQL: `SESSIONGATE_TEST_POSTGRES_URL` (default: the trust-auth server on 127.0.0.1:5432) names an admin
database; one fresh database is created for the test session, migrated once, emptied after every test and
dropped at the end. An unreachable server skips the PostgreSQL tests, or fails them when
`SESSIONGATE_REQUIRE_POSTGRES=1` (CI). SQLite: the schema is migrated once into a template file that every
test copies.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from sessiongate.sessions import SqlSessionStore, create_engine, upgrade_sync

DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
# The store's clock in tests: 1 ms later at every reading, from midnight before the tests' request times.
CLOCK_START = datetime(2025, 1, 1, tzinfo=UTC)

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _admin_url() -> URL:
    return make_url(os.environ.get("SESSIONGATE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))


async def _admin(url: URL, *statements: str) -> None:
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT", connect_args={"timeout": 5})
    try:
        async with engine.connect() as connection:
            for statement in statements:
                await connection.execute(text(statement))
    finally:
        await engine.dispose()


class PostgresServer:
    """Creates and drops uniquely named databases on the test server."""

    def __init__(self, admin_url: URL) -> None:
        self.admin_url = admin_url

    def create_database(self) -> URL:
        name = f"sessiongate_test_{os.getpid()}_{secrets.token_hex(4)}"
        asyncio.run(_admin(self.admin_url, f'CREATE DATABASE "{name}"'))
        return self.admin_url.set(database=name)

    def drop_database(self, url: URL) -> None:
        asyncio.run(_admin(self.admin_url, f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def postgres_server() -> PostgresServer:
    url = _admin_url()
    try:
        asyncio.run(_admin(url, "SELECT 1"))
    except Exception as exc:
        reason = (
            f"PostgreSQL not reachable at {url.render_as_string()}: {type(exc).__name__}: {exc}; "
            "set SESSIONGATE_TEST_POSTGRES_URL"
        )
        if os.environ.get("SESSIONGATE_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return PostgresServer(url)


@pytest.fixture(scope="session")
def postgres_database(postgres_server: PostgresServer) -> Iterator[URL]:
    """One migrated database for the whole test session."""
    url = postgres_server.create_database()
    try:
        upgrade_sync(url)
        yield url
    finally:
        postgres_server.drop_database(url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade_sync(f"sqlite+aiosqlite:///{path}")
    return path


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """A migrated database with nothing in it but the default tenant."""
    if request.param == "sqlite":
        path = tmp_path / "sessions.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield make_url(f"sqlite+aiosqlite:///{path}")
        return
    yield request.getfixturevalue("postgres_database")


@pytest.fixture(params=BACKENDS)
def fresh_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[URL]:
    """An empty database, not migrated."""
    if request.param == "sqlite":
        yield make_url(f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)


@pytest.fixture
async def store(database_url: URL) -> AsyncIterator[SqlSessionStore]:
    ticks = itertools.count()
    store = SqlSessionStore(
        create_engine(database_url), clock=lambda: CLOCK_START + timedelta(milliseconds=next(ticks))
    )
    try:
        yield store
        if store.engine.dialect.name == "postgresql":  # the database is shared by the whole test session
            async with store.engine.begin() as connection:
                tables = (
                    "workers, advisories, idempotency_keys, tool_calls, turns, sessions, api_keys, gateway_instances"
                )
                await connection.execute(text(f"TRUNCATE {tables} CASCADE"))
                await connection.execute(text("DELETE FROM tenants WHERE id <> 'default'"))
    finally:
        await store.close()

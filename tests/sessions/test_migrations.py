"""Migrations: from an empty database to the schema the models describe, idempotent, reversible."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.engine import URL

from sessiongate.sessions import create_engine, upgrade
from sessiongate.sessions.database import alembic_config
from sessiongate.sessions.models import Base

pytestmark = pytest.mark.anyio


def _diff(connection: Connection) -> list[Any]:
    return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def _inspect(url: URL) -> tuple[list[Any], str | None, list[Any]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            diff = await connection.run_sync(_diff)
            revision = await connection.run_sync(_revision)
            tenants = list((await connection.execute(text("SELECT id, name FROM tenants"))).all())
            return diff, revision, tenants
    finally:
        await engine.dispose()


async def test_upgrade_creates_the_models_schema_and_is_idempotent(fresh_database_url: URL) -> None:
    head = ScriptDirectory.from_config(alembic_config(fresh_database_url)).get_current_head()

    await upgrade(fresh_database_url)
    diff, revision, tenants = await _inspect(fresh_database_url)
    assert diff == []
    assert revision == head
    assert tenants == [("default", "default")]

    await upgrade(fresh_database_url)
    assert await _inspect(fresh_database_url) == ([], head, [("default", "default")])


async def test_downgrade_to_base_and_up_again(fresh_database_url: URL) -> None:
    await upgrade(fresh_database_url)
    config = alembic_config(fresh_database_url)
    await asyncio.to_thread(command.downgrade, config, "base")  # env.py runs its own event loop
    engine = create_engine(fresh_database_url)
    try:
        async with engine.connect() as connection:
            tables = await connection.run_sync(lambda c: c.dialect.get_table_names(c))
            assert set(tables) <= {"alembic_version"}
    finally:
        await engine.dispose()
    await upgrade(fresh_database_url)
    diff, _, tenants = await _inspect(fresh_database_url)
    assert diff == []
    assert tenants == [("default", "default")]

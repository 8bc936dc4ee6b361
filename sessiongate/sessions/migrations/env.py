"""Alembic environment for the session store; the URL comes in `config.attributes["url"]` (see database.py).

PostgreSQL migrates through an async engine (`async_engine_from_config` + `run_sync`) under `asyncio.run`
(`sessions.upgrade` calls this from a worker thread); SQLite through the stdlib sqlite3 driver.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import async_engine_from_config

from sessiongate.sessions.models import Base

target_metadata = Base.metadata


def _url() -> str:
    url = context.config.attributes.get("url") or context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no database URL: set config.attributes['url']")
    return make_url(url).render_as_string(hide_password=False)


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    backend = connection.dialect.name if connection is not None else make_url(url or "").get_backend_name()
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        render_as_batch=backend == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )


def run_migrations_offline() -> None:
    _configure(url=_url())
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_sqlite(url: URL) -> None:
    # SQLite migrates through the stdlib driver: aiosqlite's worker thread outlives a failed connect and
    # then reports "Event loop is closed" once asyncio.run() has returned. Same file, same schema.
    engine = create_engine(url.set(drivername="sqlite+pysqlite"), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            _run_sync(connection)
            connection.commit()
    finally:
        engine.dispose()


async def run_migrations_online() -> None:
    engine = async_engine_from_config({"sqlalchemy.url": _url()}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_sync)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
elif make_url(_url()).get_backend_name() == "sqlite":
    run_migrations_sqlite(make_url(_url()))
else:
    asyncio.run(run_migrations_online())

"""Databases made by every committed version of revision 0001 (it was edited in place four times before 0002),
with a conversation in them, upgraded to head: the same schema as a database made at head, no difference from the
models, and the old session goes on as a delta (its context digest was computed by 0002, not left empty).

`old_migrations/0001_at_<commit>.py` are those versions verbatim from git history; 180f161, the first, is
0001 itself again."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.engine import URL, make_url

from sessiongate.sessions import SqlSessionStore, create_engine, history, upgrade
from sessiongate.sessions.database import MIGRATIONS_DIR, alembic_config
from sessiongate.sessions.models import Base

from .conftest import BACKENDS, PostgresServer

pytestmark = pytest.mark.anyio

OLD = Path(__file__).parent / "old_migrations"
VERSIONS = {
    "180f161": MIGRATIONS_DIR / "versions" / "0001_initial.py",
    "8258f54": OLD / "0001_at_8258f54.py",  # + the sessions' context digest
    "d1f04ef": OLD / "0001_at_d1f04ef.py",  # + api keys, tenant limits, idempotency keys
    "9587d80": OLD / "0001_at_9587d80.py",  # + turns' gateway instance, gateway_instances: 0001 until 0002
}
AT = datetime(2025, 6, 1, 12, tzinfo=UTC)
CONTEXT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "how are you?"},
    {"role": "assistant", "content": "fine"},
]


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"old_0001_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=BACKENDS)
def two_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[URL, URL]]:
    """Two empty databases on one backend: the old one to upgrade, and one made at head to compare it with."""
    if request.param == "sqlite":
        yield (
            make_url(f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"),
            make_url(f"sqlite+aiosqlite:///{tmp_path / 'head.db'}"),
        )
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    urls = server.create_database(), server.create_database()
    try:
        yield urls
    finally:
        for url in urls:
            server.drop_database(url)


def _at(connection: Connection, offset_s: int) -> datetime:
    moment = AT + timedelta(seconds=offset_s)
    return moment.replace(tzinfo=None) if connection.dialect.name == "sqlite" else moment  # as 0001 stores it


def _make_old_database(connection: Connection, version: Path) -> None:
    """What that version of 0001 made, stamped 0001 as it was, with a conversation written as the store wrote it."""
    with Operations.context(MigrationContext.configure(connection)):
        _module(version).upgrade()
    connection.execute(
        sa.text(
            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
    )
    connection.execute(sa.text("INSERT INTO alembic_version (version_num) VALUES ('0001')"))

    has = {c["name"] for c in sa.inspect(connection).get_columns("sessions")}
    session: dict[str, Any] = {
        "id": "old-1",
        "tenant_id": "default",
        "state": "active",
        "priority": 0,
        "metadata": {},
        "created_at": _at(connection, 0),
        "last_active_at": _at(connection, 3),
        "turn_count": 3,
    }
    if "context_digest" in has:  # the store kept the digest up to date from 8258f54 on
        session |= {"context_digest": history.context_digest(CONTEXT), "context_length": 4, "context_seq": 2}
    sessions = sa.table("sessions", *(sa.column(name, sa.JSON() if name == "metadata" else None) for name in session))
    connection.execute(sessions.insert().values(session))
    turns = sa.table(
        "turns",
        *(sa.column(n) for n in ("id", "session_id", "seq", "status", "context_reset", "received_at")),
        sa.column("input_messages", sa.JSON()),
        sa.column("request", sa.JSON()),
        sa.column("output_message", sa.JSON(none_as_null=True)),
    )
    rows = [
        ("t1", 1, "ok", CONTEXT[0:1], CONTEXT[1]),
        ("t2", 2, "ok", CONTEXT[2:3], CONTEXT[3]),
        ("t3", 3, "failed", [{"role": "user", "content": "lost?"}], None),  # not part of the context
    ]
    for turn_id, seq, status, messages, answer in rows:
        connection.execute(
            turns.insert().values(
                id=turn_id,
                session_id="old-1",
                seq=seq,
                status=status,
                context_reset=False,
                received_at=_at(connection, seq),
                input_messages=messages,
                request={},
                output_message=answer,
            )
        )


def _schema(connection: Connection) -> dict[str, Any]:
    """Tables, columns (type, nullability), keys, foreign keys, indexes and unique constraints, order-free.
    Server defaults are left out: the columns 0002 adds carry one (existing rows need a value), the same columns
    made by an in-place edit of 0001 do not; the models set these values themselves."""
    inspector = sa.inspect(connection)
    schema: dict[str, Any] = {}
    for table in sorted(inspector.get_table_names()):
        schema[table] = {
            "columns": sorted((c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)),
            "primary key": inspector.get_pk_constraint(table)["constrained_columns"],
            "foreign keys": sorted(
                (
                    fk["name"],
                    tuple(fk["constrained_columns"]),
                    fk["referred_table"],
                    tuple(fk["referred_columns"]),
                    (fk.get("options") or {}).get("ondelete"),
                )
                for fk in inspector.get_foreign_keys(table)
            ),
            "indexes": sorted((i["name"], tuple(i["column_names"]), i["unique"]) for i in inspector.get_indexes(table)),
            "unique": sorted((u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)),
        }
    return schema


def _inspect(connection: Connection) -> tuple[dict[str, Any], list[Any], str | None]:
    context = MigrationContext.configure(connection)
    return _schema(connection), list(compare_metadata(context, Base.metadata)), context.get_current_revision()


@pytest.fixture
async def engines(two_databases: tuple[URL, URL]) -> AsyncIterator[tuple[sa.ext.asyncio.AsyncEngine, ...]]:
    made = tuple(create_engine(url) for url in two_databases)
    try:
        yield made
    finally:
        for engine in made:
            await engine.dispose()


@pytest.mark.parametrize("version", sorted(VERSIONS), ids=str)
async def test_a_database_made_at_any_0001_reaches_head(
    version: str, two_databases: tuple[URL, URL], engines: tuple[sa.ext.asyncio.AsyncEngine, ...]
) -> None:
    old_url, head_url = two_databases
    old, head = engines
    async with old.begin() as connection:
        await connection.run_sync(_make_old_database, VERSIONS[version])

    await upgrade(old_url)
    await upgrade(head_url)
    async with old.connect() as connection:
        upgraded, diff, revision = await connection.run_sync(_inspect)
    async with head.connect() as connection:
        fresh, _, _ = await connection.run_sync(_inspect)
    assert revision == ScriptDirectory.from_config(alembic_config(old_url)).get_current_head()
    assert diff == []  # autogenerate sees nothing to do: the models and the upgraded schema agree
    assert upgraded == fresh

    store = SqlSessionStore(create_engine(old_url))
    try:
        question = {"role": "user", "content": "and now?"}
        turn = await store.begin_turn(
            "old-1", tenant_id="default", messages=[*CONTEXT, question], request={}, received_at=AT + timedelta(1)
        )
        assert (turn.seq, turn.input_messages, turn.context_reset) == (4, [question], False)  # a delta
        answer = {"role": "assistant", "content": "now this"}
        await store.complete_turn(
            turn.id, output_message=answer, finish_reason="stop", model="m", ended_at=AT + timedelta(1, 1)
        )
        assert await store.session_context("old-1", tenant_id="default") == [*CONTEXT, question, answer]
        listed = await store.list_turns("old-1", tenant_id="default")
        assert [(t.seq, t.status) for t in listed] == [(1, "ok"), (2, "ok"), (3, "failed"), (4, "ok")]
    finally:
        await store.close()


async def test_the_models_match_head(fresh_database_url: URL) -> None:
    """A change to the models without a new revision fails here: autogenerate would find something to do."""
    await upgrade(fresh_database_url)
    engine = create_engine(fresh_database_url)
    try:
        async with engine.connect() as connection:
            _, diff, _ = await connection.run_sync(_inspect)
        assert diff == []
    finally:
        await engine.dispose()


def test_every_revision_is_in_one_line_of_history() -> None:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    revisions = [r.revision for r in script.walk_revisions()]
    assert revisions == ["0008", "0007", "0006", "0005", "0004", "0003", "0002", "0001"]
    assert script.get_heads() == ["0008"]

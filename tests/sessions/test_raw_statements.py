"""The raw sqlite3 path of the per-turn statements gives the values SQLAlchemy's path gives, without it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import Connection

from sessiongate.sessions import create_engine, history, upgrade_sync
from sessiongate.sessions._sql import session_values, tenant_values
from sessiongate.sessions.database import sqlite_file_engine
from sessiongate.sessions.models import UTCDateTime
from sessiongate.sessions.turn_write import raw
from sessiongate.sessions.turn_write import statements as sql


def _turn_values(received_at: datetime) -> dict[str, object]:
    return {
        "id": "turn_1",
        "session_id": "s",
        "seq": 1,
        "status": "pending",
        "input_messages": [{"role": "user", "content": "hi é \ud800"}],
        "context_reset": False,
        "request": {"model": "m", "n": 2**70},
        "received_at": received_at,
        "gateway_instance": None,
        "gateway_run": None,
        "session_source": "inferred",
    }


def test_raw_rows_equal_sqlalchemys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'raw.db'}"
    upgrade_sync(url)
    engine = sqlite_file_engine(create_engine(url))
    assert engine is not None
    at = datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=UTC)
    ended = datetime(2026, 11, 24, 12, 0, 1, tzinfo=UTC)
    params = {
        "p_turn": "turn_1",
        "p_output_message": {"role": "assistant", "content": "ok"},
        "p_finish_reason": "stop",
        "p_model": "m",
        "p_first_token_at": None,
        "p_ended_at": ended,
        "p_prompt_tokens": 3,
        "p_completion_tokens": 1,
        "p_cached_tokens": None,
        "p_cached_tokens_details": None,
        "p_cached_device": None,
        "p_cached_host": None,
        "p_cached_storage": None,
        "p_worker": "w1",
        "p_dispatched_at": None,
    }
    rows = {}
    for path in ("raw", "sqlalchemy"):
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            conn.exec_driver_sql(
                "INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', '2026-01-01 00:00:00.000000')"
            )
            conn.exec_driver_sql(
                "INSERT INTO sessions (id, tenant_id, state, priority, metadata, created_at, last_active_at, "
                "turn_count, context_digest, context_length, context_seq) VALUES ('s', 't', 'active', 0, '{}', "
                "'2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', 1, '', 0, 0)"
            )
            if path == "sqlalchemy":
                # Without a plain sqlite3 connection underneath, `execute` takes SQLAlchemy's path.
                monkeypatch.setattr(raw, "sqlite3", _NoSqlite3)
            else:
                monkeypatch.setattr(Connection, "execute", _refuse)
            raw.execute(conn, sql.INSERT_TURN, _turn_values(at))
            (rows[path],) = raw.execute(conn, sql.COMPLETE_TURN, params)
            assert raw.execute(conn, sql.COMPLETE_TURN, params) == []  # no longer pending
            conn.rollback()
            monkeypatch.undo()
    assert tuple(rows["raw"]) == tuple(rows["sqlalchemy"])
    assert rows["raw"].received_at == at  # an aware datetime, as the ORM gives it
    assert rows["raw"].input_messages == [{"role": "user", "content": "hi é \ud800"}]
    assert rows["raw"].request == {"model": "m", "n": 2**70}
    assert rows["raw"].output_message == {"role": "assistant", "content": "ok"}
    assert rows["raw"].worker == "w1"
    assert rows["raw"].status == "ok"
    engine.dispose()


class _NoSqlite3:
    class Connection:  # nothing is an instance of it
        pass


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the raw path went through SQLAlchemy's execute")


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC),  # no microseconds: still written with six digits
        datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=-7, minutes=-30))),
        datetime(999, 1, 1, tzinfo=UTC),
    ],
)
def test_datetimes_are_bound_as_sqlalchemy_binds_them(value: datetime) -> None:
    column = UTCDateTime()
    dialect = raw._DIALECT
    expected = column.dialect_impl(dialect).bind_processor(dialect)(value)  # type: ignore[misc]
    assert raw._utc_text(value) == expected


def test_a_naive_datetime_is_refused_on_the_raw_path() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        raw._utc_text(datetime(2026, 1, 1))


def test_a_session_created_on_the_raw_path_is_the_row_sqlalchemy_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session insert leaves its context columns to their Python defaults, which SQLAlchemy's execution fills
    in; the raw path must write the same row, and count one row for a new session, none for an existing one."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'raw.db'}"
    upgrade_sync(url)
    engine = sqlite_file_engine(create_engine(url))
    assert engine is not None
    at = datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=UTC)
    inserts = sql.INSERTS["sqlite"]
    rows = {}
    for path in ("raw", "sqlalchemy"):
        with engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            if path == "sqlalchemy":
                monkeypatch.setattr(raw, "sqlite3", _NoSqlite3)
            else:
                monkeypatch.setattr(Connection, "execute", _refuse)
            raw.execute(conn, inserts.tenant, tenant_values("t", at))
            values = session_values("s", "t", now=at, priority=2, metadata={"k": "é"}, turn_count=1)
            assert raw.count(conn, inserts.session, values) == 1
            assert raw.count(conn, inserts.session, values) == 0  # it exists: nothing changed
            monkeypatch.undo()
            rows[path] = conn.exec_driver_sql("SELECT * FROM sessions").all()
            conn.rollback()
    assert rows["raw"] == rows["sqlalchemy"]
    ((*_, digest, length, seq, prefix_breaks),) = rows["raw"]
    assert (digest, length, seq, prefix_breaks) == (history.EMPTY_DIGEST, 0, 0, 0)
    engine.dispose()


def test_a_computed_column_default_is_refused_on_the_raw_path() -> None:
    from sqlalchemy import Column, Integer, MetaData, String, Table, insert

    table = Table("t", MetaData(), Column("id", String, primary_key=True), Column("n", Integer, default=lambda: 1))
    with pytest.raises(ValueError, match="constant column defaults only"):
        raw.RawStatement(insert(table), column_keys=("id",))


def test_binds_are_positional_in_the_statements_order_with_defaults_and_processors() -> None:
    from sqlalchemy import JSON, Column, Integer, MetaData, String, Table, bindparam, update

    table = Table(
        "t",
        MetaData(),
        Column("id", String, primary_key=True),
        Column("n", Integer),
        Column("at", UTCDateTime),
        Column("doc", JSON),
    )
    statement = (
        update(table)
        .where(table.c.id == bindparam("p_id"), table.c.n < 5, table.c.at < bindparam("p_at"))
        .values(n=table.c.n + 1, at=bindparam("p_at"), doc=bindparam("p_doc"))
    )
    compiled = raw.RawStatement(statement)
    assert compiled.sql.count("?") == 6
    at = datetime(2026, 11, 27, 3, 4, 5, 6, tzinfo=UTC)
    # SET n, at, doc; WHERE id, n < literal, at < p_at: the literals take their values, the datetime and the JSON
    # their processors', and a parameter given twice is bound twice.
    assert compiled.bind({"p_id": "x", "p_at": at, "p_doc": {"k": [1]}}) == (
        1,
        "2026-11-27 03:04:05.000006",
        '{"k":[1]}',
        "x",
        5,
        "2026-11-27 03:04:05.000006",
    )
    with pytest.raises(KeyError):
        compiled.bind({"p_id": "x", "p_at": at})

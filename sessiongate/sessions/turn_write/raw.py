"""The hottest per-request statements on a plain `sqlite3` connection, compiled once by SQLAlchemy.

On the group commit's SQLite connection SQLAlchemy's execution machinery (execution context, parameter and result
processing, result objects) cost several times what SQLite itself spends on these small statements, and they run
for every turn. `execute(conn, statement, params)` (its rows), `count(...)` (the rows it changed) and
`execute_many(...)` (one statement over many rows) run a statement registered here straight on the driver: the SQL,
the bind processors (JSON) and the result processors are SQLAlchemy's own, taken from one compilation, so rows come
back as the same Python values; datetimes are bound in one step that writes the text SQLAlchemy's two processors
write. Any other connection (PostgreSQL, aiosqlite's in-memory database) or statement takes SQLAlchemy's path. The
tests of `persist` run both paths (SQLite and PostgreSQL) against the same expectations.
"""

from __future__ import annotations

import sqlite3
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Connection
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from sessiongate.sessions.database import json_dumps, json_loads
from sessiongate.sessions.models import UTCDateTime

__all__ = ["RawStatement", "count", "execute", "execute_many", "register"]

# Positional parameters: with named ones, the driver makes a string of each parameter's name and looks it up in the
# mapping, at every execution.
_DIALECT = SQLiteDialect_pysqlite(paramstyle="qmark", json_serializer=json_dumps, json_deserializer=json_loads)


class RawStatement:
    """One statement as SQLite SQL with named parameters, its binds' processors and a row type for its results."""

    def __init__(self, statement: Executable, column_keys: Sequence[str] | None = None) -> None:
        clause = cast(ClauseElement, statement)
        keys = list(column_keys) if column_keys else None
        compiled = cast(SQLCompiler, clause.compile(dialect=_DIALECT, column_keys=keys))
        self.sql = compiled.string
        # Literal values in the statement (e.g. `status = 'ok'`) are binds with their value already set; the others
        # must come with each call.
        self._defaults: dict[str, Any] = {
            name: bind.effective_value for bind, name in compiled.bind_names.items() if not bind.required
        }
        # An INSERT's columns left to their Python defaults: SQLAlchemy's execution computes those, so here they
        # are taken from the column (a constant) or refused.
        for column in getattr(compiled, "insert_prefetch", ()):
            default = column.default
            if default is None or not default.is_scalar:
                raise ValueError(f"the raw path takes constant column defaults only, not {column.key!r}'s")
            self._defaults[column.key] = default.arg
        processors = compiled._bind_processors
        utc_times = {name for bind, name in compiled.bind_names.items() if isinstance(bind.type, UTCDateTime)}
        binds: list[tuple[str, Callable[[Any], Any] | None]] = []
        for name in compiled.positiontup or ():
            process = _utc_text if name in utc_times else processors.get(name)
            if process is not None and not callable(process):  # a tuple bind's processors: not a plain statement
                raise ValueError(f"the raw path takes plain binds only, not {name!r}")
            binds.append((name, process))
        self.bind = _binder(binds, self._defaults)
        columns = compiled._result_columns or []
        self._row = namedtuple("_Row", [entry.keyname for entry in columns]) if columns else None
        self._results: tuple[Callable[[Any], Any] | None, ...] = tuple(
            entry.type._cached_result_processor(_DIALECT, None) for entry in columns
        )

    def count(self, dbapi: sqlite3.Connection, params: Mapping[str, Any]) -> int:
        cursor = dbapi.execute(self.sql, self.bind(params))
        try:
            return cursor.rowcount
        finally:
            cursor.close()

    def run(self, dbapi: sqlite3.Connection, params: Mapping[str, Any]) -> list[Any]:
        cursor = dbapi.execute(self.sql, self.bind(params))
        try:
            if self._row is None:
                return []
            rows = cursor.fetchall()
        finally:
            cursor.close()
        row_type, results = self._row, self._results
        return [row_type(*(v if p is None else p(v) for p, v in zip(results, row, strict=True))) for row in rows]


def _binder(
    binds: Sequence[tuple[str, Callable[[Any], Any] | None]], defaults: Mapping[str, Any]
) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A function from a statement's parameters (a mapping) to its positional values, each through its bind
    processor, a parameter left out taking its default. Generated as one expression, as `collections.namedtuple`
    and `dataclasses` generate their methods: a loop over the binds, with a lookup, a test and maybe a call per
    parameter, cost more than the statement's execution in SQLite."""
    env: dict[str, Any] = {}
    values = []
    for position, (name, process) in enumerate(binds):
        if name in defaults:
            env[f"default_{position}"] = defaults[name]
            value = f"params.get({name!r}, default_{position})"
        else:
            value = f"params[{name!r}]"
        if process is not None:
            env[f"process_{position}"] = process
            value = f"process_{position}({value})"
        values.append(value)
    source = f"def bind(params):\n    return ({', '.join(values)}{',' if values else ''})\n"
    exec(source, env)  # the source holds the bind names as string literals, nothing else from outside
    return cast(Callable[[Mapping[str, Any]], tuple[Any, ...]], env["bind"])


# The last datetime bound and its text: a turn binds the same instant several times running (its arrival in the
# claim and the insert, its end in the turn's and the session's updates, a missed-turn record's three times).
_last_bound: tuple[datetime | None, str | None] = (None, None)


def _utc_text(value: datetime | None) -> str | None:
    """What `UTCDateTime` and SQLite's DATETIME bind processors make of `value` together (the UTC wall time as
    "YYYY-MM-DD HH:MM:SS.ffffff"), in one step: there are several of them in every turn's statements."""
    global _last_bound
    last = _last_bound  # one read of the pair: another thread may replace it meanwhile
    if value is last[0]:
        return last[1]
    if value is None:
        return None
    text = _format_utc(value)
    _last_bound = (value, text)
    return text


def _format_utc(value: datetime) -> str:
    if value.tzinfo is not UTC:  # the usual case is UTC (the store's own datetimes)
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: the store only accepts timezone-aware datetimes")
        value = value.astimezone(UTC)
    # One %-format: `isoformat` less its "+00:00" took half as long again (its offset is formatted by sprintf too).
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 - the fastest of the three ways, by a third
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


_REGISTERED: dict[int, RawStatement] = {}


def register(statement: Executable, column_keys: Sequence[str] | None = None) -> Executable:
    """Compile `statement` for the raw path; returns it, so that a module can register as it defines."""
    _REGISTERED[id(statement)] = RawStatement(statement, column_keys)
    return statement


def execute(conn: Connection, statement: Executable, params: Mapping[str, Any]) -> list[Any]:
    """The statement's rows (none for a statement that returns none), on the raw path where it applies."""
    raw = _REGISTERED.get(id(statement))
    if raw is not None:
        dbapi = conn.connection.dbapi_connection
        if isinstance(dbapi, sqlite3.Connection):
            return raw.run(dbapi, params)
    result = conn.execute(statement, params)
    return list(result.all()) if result.returns_rows else []


def count(conn: Connection, statement: Executable, params: Mapping[str, Any]) -> int:
    """The rows a statement without RETURNING changed, on the raw path where it applies."""
    raw = _REGISTERED.get(id(statement))
    if raw is not None:
        dbapi = conn.connection.dbapi_connection
        if isinstance(dbapi, sqlite3.Connection):
            return raw.count(dbapi, params)
    return conn.execute(statement, params).rowcount


def execute_many(conn: Connection, statement: Executable, rows: Sequence[Mapping[str, Any]]) -> None:
    """A statement without results, once per row, on the raw path where it applies (one `executemany`)."""
    raw = _REGISTERED.get(id(statement))
    if raw is not None:
        dbapi = conn.connection.dbapi_connection
        if isinstance(dbapi, sqlite3.Connection):
            dbapi.executemany(raw.sql, [raw.bind(row) for row in rows])
            return
    conn.execute(statement, list(rows))

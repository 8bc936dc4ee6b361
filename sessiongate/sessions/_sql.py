"""SQL building blocks shared by the store's modules: the backend's `INSERT ... ON CONFLICT` (for inserts that
may race: tenants, sessions, workers, tool calls) and the rows it inserts, max() of two times."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, SQLColumnExpression, case
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

__all__ = ["insert_on_conflict", "later", "session_values", "tenant_values"]


def insert_on_conflict(
    backend: str,
    entity: Any,
    values: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    *,
    conflict: Sequence[str] = ("id",),
    update_keys: Sequence[str] = (),
) -> Insert:
    """INSERT that skips (or, for `update_keys`, updates from) rows that clash on the `conflict` columns.

    `backend` is the dialect name, "sqlite" or "postgresql"; `values` one row, several, or None to pass them
    when the statement is executed.
    """
    insert: sqlite.Insert | postgresql.Insert = (
        sqlite.insert(entity) if backend == "sqlite" else postgresql.insert(entity)
    )
    if values is not None:
        insert = insert.values(dict(values) if isinstance(values, Mapping) else [dict(row) for row in values])
    if update_keys:
        return insert.on_conflict_do_update(
            index_elements=list(conflict), set_={key: insert.excluded[key] for key in update_keys}
        )
    return insert.on_conflict_do_nothing(index_elements=list(conflict))


def later(column: SQLColumnExpression[datetime], bound: SQLColumnExpression[datetime]) -> ColumnElement[datetime]:
    """SQL for max(column, bound), so that an older event never moves a time such as last_active_at back."""
    return case((column < bound, bound), else_=column)


def tenant_values(tenant_id: str, now: datetime) -> dict[str, Any]:
    """A tenant as it is created on first use."""
    return {"id": tenant_id, "name": tenant_id, "created_at": now}


def session_values(
    session_id: str,
    tenant_id: str,
    *,
    now: datetime,
    priority: int = 0,
    metadata: Mapping[str, Any] | None = None,
    turn_count: int = 0,
    last_active_at: datetime | None = None,
) -> dict[str, Any]:
    """A new active session (its context, empty, comes from the columns' defaults)."""
    return {
        "id": session_id,
        "tenant_id": tenant_id,
        "state": "active",
        "priority": priority,
        "metadata": dict(metadata or {}),
        "created_at": now,
        "last_active_at": last_active_at or now,
        "turn_count": turn_count,
    }

"""`SqlSessionStore`: the `SessionStore` on SQLAlchemy's async engine (SQLite or PostgreSQL), one SQL mixin per
aggregate over one transaction module.

- `transactions`: `StoreTransactions`, the engine and its transactions (`_transaction` for the ORM on an
  `AsyncSession`, `_connection` for Core, `_per_request` for the per-turn write path), database failures translated
  into `StoreUnavailable`, and the store's lifecycle (`ping`, `close`);
- `sessions`: `SqlSessions`, `SqlForks`, `SqlPrefixBreaks`, `SqlResponses`;
- `turns`: `SqlTurns`, `SqlToolCalls`, `SqlAdvisories`;
- `tenancy`: `SqlWorkers`, `SqlApiKeys`, `SqlTenants`, `SqlIdempotency`, `SqlInstances`.

Each mixin opens its calls' transactions and delegates to its aggregate's module (`session_rows`, `turn_rows`,
`tool_calls`, `advisories`, `keys`, ...; a turn's own writes to `turn_write`). Inserts that may race (session
get-or-create, tenants, worker upserts) use the backend's `INSERT ... ON CONFLICT`. Each mixin implements the
Protocol of the same name in `sessions.protocol`.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from sessiongate.sessions.database import create_engine
from sessiongate.sessions.protocol import SessionStore

from .sessions import SqlForks, SqlPrefixBreaks, SqlResponses, SqlSessions
from .tenancy import SqlApiKeys, SqlIdempotency, SqlInstances, SqlTenants, SqlWorkers
from .turns import SqlAdvisories, SqlToolCalls, SqlTurns

__all__ = ["SessionStore", "SqlSessionStore"]


class SqlSessionStore(
    SqlSessions,
    SqlForks,
    SqlPrefixBreaks,
    SqlResponses,
    SqlTurns,
    SqlToolCalls,
    SqlAdvisories,
    SqlWorkers,
    SqlApiKeys,
    SqlTenants,
    SqlIdempotency,
    SqlInstances,
):
    """The session store on `engine`, whose schema `sessions.upgrade` has created. `close()` disposes it."""

    @classmethod
    def from_url(cls, url: str | URL) -> SqlSessionStore:
        return cls(create_engine(url))


def _implements_protocol(store: SqlSessionStore) -> SessionStore:
    return store  # mypy checks that SqlSessionStore satisfies SessionStore

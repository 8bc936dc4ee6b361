"""sessions: the gateway's SQL store of API keys, sessions, turns, tool calls, advisories and workers.

`create_engine(url)` + `SqlSessionStore(engine)` give a `SessionStore`; `upgrade(url)` migrates the schema.
SQLite (aiosqlite) is the embedded default, PostgreSQL (asyncpg) serves several gateway replicas.
`SessionStore` is composed of one Protocol per aggregate (`protocol/`), `SqlSessionStore` of one SQL mixin per
aggregate over one transaction module (`store/`); a chat turn's own writes are `turn_write/` (docs/architecture.md,
"The store, by aggregate"). This package imports nothing from `gateway`, `sdk` or `sglang_ext`.
"""

from __future__ import annotations

from ._convert import MAX_SESSION_ID_LENGTH
from .database import create_engine, upgrade, upgrade_sync
from .errors import (
    AdvisoryNotFound,
    ApiKeyNotFound,
    InvalidTransition,
    ResponseNotFound,
    SessionExists,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
    ToolCallNotFound,
    TurnNotFound,
)
from .protocol import SessionStore
from .records import (
    AdvisoryRecord,
    ApiKeyRecord,
    IdempotencyHolder,
    IdempotencyRecord,
    InstanceLease,
    MissedTurn,
    Page,
    ResponseRecord,
    SessionRecord,
    StoreHealth,
    TenantRecord,
    ToolCallRecord,
    TurnAdvisory,
    TurnRecord,
    WorkerRecord,
)
from .store import SqlSessionStore

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "AdvisoryNotFound",
    "AdvisoryRecord",
    "ApiKeyNotFound",
    "ApiKeyRecord",
    "IdempotencyHolder",
    "IdempotencyRecord",
    "InstanceLease",
    "InvalidTransition",
    "MissedTurn",
    "Page",
    "ResponseNotFound",
    "ResponseRecord",
    "SessionExists",
    "SessionNotFound",
    "SessionRecord",
    "SessionStore",
    "SqlSessionStore",
    "StoreError",
    "StoreHealth",
    "StoreUnavailable",
    "TenantRecord",
    "ToolCallNotFound",
    "ToolCallRecord",
    "TurnAdvisory",
    "TurnNotFound",
    "TurnRecord",
    "WorkerRecord",
    "create_engine",
    "upgrade",
    "upgrade_sync",
]

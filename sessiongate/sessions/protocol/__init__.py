"""`SessionStore`: the seam between the gateway and the session store (`SqlSessionStore` implements it).

All methods are coroutines, safe to call concurrently, each its own committed transaction. Every method
that names a session takes the caller's `tenant_id` and raises `SessionNotFound` for another tenant's
session. Datetimes must be timezone-aware (naive ones raise `ValueError`); the store returns UTC.

`SessionStore` is composed of one Protocol per aggregate, each usable alone where a caller needs only that part:
`sessions.py` (`SessionsStore`, `ForksStore`, `PrefixBreaksStore`, `ResponsesStore`), `turns.py` (`TurnsStore`,
`ToolCallsStore`, `AdvisoriesStore`) and `tenancy.py` (`WorkersStore`, `ApiKeysStore`, `TenantsStore`,
`IdempotencyStore`, `InstancesStore`); the store's lifecycle (`ping`, `health`, `close`) is here.
"""

from __future__ import annotations

from typing import Protocol

from sessiongate.sessions.records import StoreHealth

from .sessions import ForksStore, PrefixBreaksStore, ResponsesStore, SessionsStore
from .tenancy import ApiKeysStore, IdempotencyStore, InstancesStore, TenantsStore, WorkersStore
from .turns import AdvisoriesStore, ToolCallsStore, TurnsStore

__all__ = [
    "AdvisoriesStore",
    "ApiKeysStore",
    "ForksStore",
    "IdempotencyStore",
    "InstancesStore",
    "PrefixBreaksStore",
    "ResponsesStore",
    "SessionStore",
    "SessionsStore",
    "TenantsStore",
    "ToolCallsStore",
    "TurnsStore",
    "WorkersStore",
]


class SessionStore(
    SessionsStore,
    ForksStore,
    PrefixBreaksStore,
    ResponsesStore,
    TurnsStore,
    ToolCallsStore,
    AdvisoriesStore,
    WorkersStore,
    ApiKeysStore,
    TenantsStore,
    IdempotencyStore,
    InstancesStore,
    Protocol,
):
    async def ping(self) -> None:
        """A cheap round trip to the database; `StoreUnavailable` if it does not answer."""
        ...

    def health(self) -> StoreHealth:
        """The calls in flight now, the oldest one's wait, and the calls failed as unavailable (no I/O)."""
        ...

    async def close(self) -> None: ...

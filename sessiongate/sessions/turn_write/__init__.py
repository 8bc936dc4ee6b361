"""The per-turn write path: what persisting one chat turn takes, apart from the store's other calls.

- `persist`: `begin_turn`, `mark_dispatched`, `complete_turn`, `fail_turn`, plain functions over a synchronous
  `Connection` whose transaction the caller owns;
- `memory`: `StoreMemory`, what a store knows from its own writes, so that those functions read nothing back;
- `statements`: the statements they run (and the advisor's per-request writes), built once;
- `raw`: those statements straight on the `sqlite3` driver, compiled once by SQLAlchemy;
- `group_commit`: `GroupCommitter`, the per-request transactions waiting for an SQLite file run in one.

The store (`sessions.store.transactions.StoreTransactions._per_request`) runs each call's transaction in one step of
the event loop: in a group commit on an SQLite file, through `run_sync` on PostgreSQL. Nothing here imports the
store; the aggregates' modules import `statements` and `raw` for their own per-request writes.
"""

from __future__ import annotations

from .group_commit import GroupCommitter
from .memory import StoreMemory
from .persist import begin_turn, complete_turn, fail_turn, mark_dispatched

__all__ = ["GroupCommitter", "StoreMemory", "begin_turn", "complete_turn", "fail_turn", "mark_dispatched"]

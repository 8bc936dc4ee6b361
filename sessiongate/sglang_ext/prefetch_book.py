"""The scheduler's record of advisory prefetches: what each one asked for and how far it got.

Held by the scheduler-side extension (`sglang_ext.internals.scheduler_ops`) and changed only on
the scheduler's thread. A record is a frozen `PrefetchRecord`, replaced as the prefetch moves on;
the book keeps every unfinished record and the most recent finished ones (`keep_finished`), so a
status query shortly after the end still answers while a stream of hints cannot grow memory
without bound.

States: `running` (pages on their way from the pool to host, or host to device) -> `done`
(everything that could be had is where it was asked to be: pages found in no tier are counted
`pages_unavailable`, a miss, not an error), `cancelled` (DELETE), or `failed` (the engine raised;
nothing it fetched is trusted beyond what the radix cache itself accepted).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

__all__ = ["FINISHED_STATES", "PrefetchBook", "PrefetchRecord", "PrefetchTargetName"]

PrefetchTargetName = Literal["host", "device"]
RecordState = Literal["queued", "running", "done", "cancelled", "failed", "expired"]
FINISHED_STATES: frozenset[str] = frozenset({"done", "cancelled", "failed", "expired"})


@dataclass(frozen=True)
class PrefetchRecord:
    prefetch_id: str
    session_id: str
    target: PrefetchTargetName
    tokens: int
    priority: int
    ttl_ms: int
    created_at: float
    state: RecordState = "running"
    pages_requested: int = 0
    pages_in_host: int = 0
    pages_on_device: int = 0
    pages_unavailable: int = 0
    bytes_loaded: int = 0
    finished_at: float | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def updated(self, **changes: object) -> PrefetchRecord:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


class PrefetchBook:
    """Prefetch records by id, oldest first; finished ones beyond `keep_finished` are forgotten."""

    def __init__(self, keep_finished: int = 1024) -> None:
        self._records: OrderedDict[str, PrefetchRecord] = OrderedDict()
        self._keep_finished = keep_finished

    def __contains__(self, prefetch_id: object) -> bool:
        return prefetch_id in self._records

    def get(self, prefetch_id: str) -> PrefetchRecord | None:
        return self._records.get(prefetch_id)

    def put(self, record: PrefetchRecord) -> None:
        self._records[record.prefetch_id] = record
        self._forget_old()

    def unfinished(self) -> Iterator[PrefetchRecord]:
        return (record for record in list(self._records.values()) if not record.finished)

    def in_flight(self) -> int:
        return sum(1 for record in self._records.values() if not record.finished)

    def _forget_old(self) -> None:
        finished = [key for key, record in self._records.items() if record.finished]
        for key in finished[: max(len(finished) - self._keep_finished, 0)]:
            del self._records[key]

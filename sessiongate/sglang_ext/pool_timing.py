"""How long the worker's calls to the shared KV pool take: per kind of call, cumulative and over the last few seconds.

The pool (HiCache's L3 backend) may sit behind a slow or lossy link, and nothing else a worker reports shows it:
answers stay the same, only turns whose KV comes from the pool get slower. Sessiongate's verified backends
(`internals/checked_file_store.py`, `internals/guarded_mooncake_store.py`) time each batch call the worker makes,
on HiCache's own threads (the prefetch thread's existence checks, its I/O thread's reads, the backup thread's
writes) and on the extension's pool-probe thread, and add it to a `PoolCallTimer` of its kind (`POOL_CALL_KINDS`):

- `read`: a batch get (pages into host memory), `write`: a batch set (a write-through), `lookup`: a batch
  existence check (how many of a prefix's pages the pool holds).

Each timer keeps cumulative figures since the backend started (calls, pages, seconds: Prometheus' `rate()` of
seconds over calls is the mean call) and the mean milliseconds per call over the last `RECENT_WINDOW_S` seconds
(None when there was no call). The load report carries them (`protocol.LoadReport.pool_calls`), and both the
worker's and the gateway's `/metrics` show them. Recording a call is two `perf_counter()` reads in the backend
and an uncontended lock here, per batch (not per page). Imports nothing of SGLang (the kinds are the wire's,
`protocol.PoolCallKind`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, get_args

from sessiongate.sglang_ext.protocol import PoolCallKind

__all__ = ["POOL_CALL_KINDS", "RECENT_WINDOW_S", "PoolCallFigures", "PoolCallTimer", "PoolTiming"]

POOL_CALL_KINDS: tuple[PoolCallKind, ...] = get_args(PoolCallKind)
RECENT_WINDOW_S = 5.0
"""The recent figure's window: calls that ended in the last 4.5-5 s (`_BUCKETS` slices of it)."""
_BUCKETS = 10
Result = TypeVar("Result")


@dataclass(frozen=True)
class PoolCallFigures:
    """One kind of pool call, as `PoolCallTimer.figures` saw it."""

    calls: int
    pages: int
    seconds: float
    """Since the backend started: calls, the pages they named, and the seconds they took."""
    recent_ms: float | None
    """Mean milliseconds per call over the last `RECENT_WINDOW_S` seconds; None without a call in that time."""


class PoolCallTimer:
    """Cumulative totals and a ring of `_BUCKETS` time slices of one kind of call; safe across threads."""

    def __init__(self, window_s: float = RECENT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._slice_s = window_s / _BUCKETS
        self._lock = threading.Lock()
        self._calls = 0
        self._pages = 0
        self._seconds = 0.0
        # Per slot: which slice of time it holds (its index since the clock's zero), its calls and their seconds.
        self._slot_slice = [-1] * _BUCKETS
        self._slot_calls = [0] * _BUCKETS
        self._slot_seconds = [0.0] * _BUCKETS

    def record(self, seconds: float, pages: int) -> None:
        """One call that took `seconds` and named `pages` pages."""
        current = int(self._clock() / self._slice_s)
        slot = current % _BUCKETS
        with self._lock:
            self._calls += 1
            self._pages += pages
            self._seconds += seconds
            if self._slot_slice[slot] != current:
                self._slot_slice[slot] = current
                self._slot_calls[slot] = 0
                self._slot_seconds[slot] = 0.0
            self._slot_calls[slot] += 1
            self._slot_seconds[slot] += seconds

    def timed(self, pages: int, call: Callable[..., Result], *args: Any) -> Result:
        """`call(*args)`, recorded as one call naming `pages` pages (also when it raises)."""
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.record(time.perf_counter() - started, pages)

    def figures(self) -> PoolCallFigures:
        oldest = int(self._clock() / self._slice_s) - _BUCKETS + 1
        recent_calls, recent_seconds = 0, 0.0
        with self._lock:
            for slot in range(_BUCKETS):
                if self._slot_slice[slot] >= oldest:
                    recent_calls += self._slot_calls[slot]
                    recent_seconds += self._slot_seconds[slot]
            calls, pages, seconds = self._calls, self._pages, self._seconds
        recent_ms = recent_seconds * 1000 / recent_calls if recent_calls else None
        return PoolCallFigures(calls, pages, seconds, recent_ms)


class PoolTiming:
    """A backend's timers, one per kind of call (`read`, `write`, `lookup`)."""

    def __init__(self, window_s: float = RECENT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.read = PoolCallTimer(window_s, clock)
        self.write = PoolCallTimer(window_s, clock)
        self.lookup = PoolCallTimer(window_s, clock)

    def report(self) -> dict[PoolCallKind, dict[str, Any]]:
        """Each kind's figures as plain values (the scheduler's stats travel as JSON), `protocol.PoolCalls`'s fields."""
        return {kind: asdict(getattr(self, kind).figures()) for kind in POOL_CALL_KINDS}

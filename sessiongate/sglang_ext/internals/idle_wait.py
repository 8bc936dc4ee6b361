"""The scheduler's wait when it has nothing to run: blocked on its input, but not while KV is on the move.

SGLang's scheduler loop spins when it has no batch. On a CPU worker that is a core at 100% doing nothing, and on
a small machine it starves whatever does have work: the other worker, the gateway, the client. With
`--sleep-on-idle` SGLang instead blocks on its input sockets for up to a second, but it counts the engine as idle
while HiCache copies and the extension's prefetches are still in flight. Their completions arrive on the cache
controller's queues, not on those sockets, so they would wait for the next request or for the second to pass: a
write-through to the shared pool would reach it late, and a prefetch would take a second longer.

`PendingAwareSleeper` wraps SGLang's sleeper: its wait when nothing is in flight, a poll of a few milliseconds on
the same sockets when something is (a request still wakes it at once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["IN_FLIGHT_POLL_MS", "PendingAwareSleeper", "cache_moves_in_flight"]

IN_FLIGHT_POLL_MS = 2

# UnifiedRadixCache's books of copies started and not yet acknowledged (device -> host write-through, host ->
# device load-back, storage -> host prefetch, host -> storage backup).
_ONGOING = ("ongoing_write_through", "ongoing_load_back", "ongoing_prefetch", "ongoing_backup")


def cache_moves_in_flight(cache: Any) -> bool:
    return any(getattr(cache, name, None) for name in _ONGOING)


class PendingAwareSleeper:
    """Stands in for SGLang's `IdleSleeper` (`maybe_sleep`), whose zmq poller it reuses."""

    def __init__(self, inner: Any, in_flight: Callable[[], bool], *, poll_ms: int = IN_FLIGHT_POLL_MS) -> None:
        self.inner = inner
        self._in_flight = in_flight
        self._poll_ms = poll_ms

    def maybe_sleep(self) -> None:
        if self._in_flight():
            self.inner.poller.poll(self._poll_ms)
        else:
            self.inner.maybe_sleep()


def install(scheduler: Any, in_flight: Callable[[], bool]) -> bool:
    """Wrap the scheduler's idle sleeper, when it has one that waits on a zmq poller; True if wrapped."""
    sleeper = getattr(scheduler, "idle_sleeper", None)
    if sleeper is None or not hasattr(sleeper, "poller"):
        return False
    scheduler.idle_sleeper = PendingAwareSleeper(sleeper, in_flight)
    return True

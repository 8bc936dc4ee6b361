"""When shed turns come back: return times spaced by what the gateway serves (`admission`).

A turn refused at saturation is told when to come back (`Retry-After`), and its session's next turn is not refused
again when it comes back on time (`FairAdmission.enter`). Told only its own predicted wait, every shed turn of a
gateway asked for twice what it serves came back within a few seconds of the others, and since none of those was
refused again they all queued: at 10,000 sessions (docs/benchmarks.md, "The cyclic collector") the accepted turns
waited 11-14 s against a 2 s bound. Refusing the second tries as well kept the wait lower but tripled the refusals
(every session retried every few seconds) and served 14% fewer turns.

So the queue hands out return times from a calendar instead: never before the turn's predicted wait (by then the
turns ahead of it have started), and at most one per `interval`, the time the gateway takes to start a turn at its
recent rate. Returns promised within the bound count as turns already queued when a new turn's wait is predicted,
so other sessions' first tries do not take the room kept for them: past saturation the delay a closed loop must
have goes into the clients' waits, and the queue itself stays near the bound.

A promise not redeemed within `grace_s` of its time (the client gave up, or went to another replica) is forgotten.
"""

from __future__ import annotations

import bisect
import itertools
import math

__all__ = ["Promise", "RetryCalendar"]


class Promise:
    """A shed turn's return time (`due`, on the queue's clock); `seq` tells apart promises due at the same time."""

    __slots__ = ("due", "seq")

    def __init__(self, due: float, seq: int) -> None:
        self.due = due
        self.seq = seq


class RetryCalendar:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._dues: list[tuple[float, int]] = []  # (due, seq) of the promises not yet redeemed or forgotten, sorted
        self._next = -math.inf  # the earliest time the next promise may be given
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._dues)

    def promise(self, earliest: float, interval: float) -> Promise:
        """A return time at or after `earliest`, at least `interval` after the previous promise's."""
        due = max(earliest, self._next)
        self._next = due + max(interval, 0.0)
        promise = Promise(due, next(self._seq))
        self._dues.append((due, promise.seq))  # dues never fall (`_next` does not): the list stays sorted
        return promise

    def redeem(self, promise: Promise) -> None:
        """The promised turn came back (or its session was forgotten): it no longer holds a place."""
        index = bisect.bisect_left(self._dues, (promise.due, promise.seq))
        if index < len(self._dues) and self._dues[index] == (promise.due, promise.seq):
            del self._dues[index]

    def due_before(self, now: float, horizon: float) -> int:
        """Promises due by `horizon` and still expected (forgetting those more than `grace_s` overdue at `now`)."""
        dues = self._dues
        stale = bisect.bisect_left(dues, (now - self.grace_s, -1))
        if stale:
            del dues[:stale]
        return bisect.bisect_right(dues, (horizon, math.inf))

    def horizon_s(self, now: float) -> float:
        """How far from `now` the last promise is due (0 when none is ahead): about what a turn shed now is told."""
        return max(self._dues[-1][0] - now, 0.0) if self._dues else 0.0

    def expected(self, promise: Promise, now: float) -> bool:
        """Whether `promise` still holds a place at `now` (not more than `grace_s` overdue)."""
        return now - promise.due <= self.grace_s

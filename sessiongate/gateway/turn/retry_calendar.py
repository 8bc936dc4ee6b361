"""When shed turns come back: return times spaced by what the gateway serves (`admission`).

A turn refused at saturation is told when to come back (`Retry-After`), and its session's next turn is not refused
again when it comes back on time (`FairAdmission.enter`). Told only its own predicted wait, every shed turn of a
gateway asked for twice what it serves came back within a few seconds of the others, and since none of those was
refused again they all queued: at 10,000 sessions (docs/benchmarks.md, "The cyclic collector") the accepted turns
waited 11-14 s against a 2 s bound. Refusing the second tries as well kept the wait lower but tripled the refusals
(every session retried every few seconds) and served 14% fewer turns.

So the queue books every turn's start on one timeline: `clear` is when everything queued or promised is expected to
have started, each queued turn and each promise moving it one turn start on (`per_start`, the time the gateway takes
to start a turn at its recent rate), never less than the real queue's drain time from now. A shed turn takes the
next start and is told to come back `cushion_s` before it (a little work left ahead of it, so that the workers do
not wait on a late client); a turn back on time is not booked again. Spacing the returns alone at the rate served
was not enough: the returns then filled every start, the turns that still queued (a session light enough to be
predicted a short wait) came on top, and a queue built before the first refusal never drained (measured: 6-10 s of
waiting at 10,000 sessions).

Returns promised within the bound also count as turns of their tenant already queued when a new turn of that tenant
has its wait predicted, so other sessions' first tries do not take the room kept for them (another tenant's returns
queue in that tenant's lane, served by weight). A promise not redeemed within `grace_s` of its time (the client gave
up, or went to another replica) is forgotten.
"""

import bisect
import itertools
import math

__all__ = ["Promise", "RetryCalendar"]


class Promise:
    """A shed turn's return time (`due`, on the queue's clock), for a turn of `tenant_id`; `seq` tells apart promises
    due at the same time."""

    __slots__ = ("due", "seq", "tenant_id")

    def __init__(self, due: float, seq: int, tenant_id: str) -> None:
        self.due = due
        self.seq = seq
        self.tenant_id = tenant_id


class RetryCalendar:
    def __init__(self, grace_s: float, cushion_s: float) -> None:
        self.grace_s = grace_s
        self.cushion_s = cushion_s
        # Per tenant (a return queues in its tenant's lane), the (due, seq) of the promises still expected, sorted.
        self._dues: dict[str, list[tuple[float, int]]] = {}
        self._clear = -math.inf  # when every turn queued or promised is expected to have started
        self._last_due = -math.inf
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(dues) for dues in self._dues.values())

    def _clear_at(self, now: float, backlog_s: float) -> float:
        return max(self._clear, now + backlog_s)

    def book(self, now: float, per_start: float, backlog_s: float) -> None:
        """A turn queued (not one back on time): it takes a start. `backlog_s`: the real queue's drain time."""
        self._clear = self._clear_at(now, backlog_s) + max(per_start, 0.0)

    def promise(self, now: float, per_start: float, backlog_s: float, tenant_id: str) -> Promise:
        """A shed turn's return time: `cushion_s` before its own start, the next after everything booked."""
        start = self._clear_at(now, backlog_s) + max(per_start, 0.0)
        due = max(start - self.cushion_s, now)
        self._clear = start
        self._last_due = due
        promise = Promise(due, next(self._seq), tenant_id)
        # Neither `clear` nor `now` falls: dues do not, and each tenant's list stays sorted.
        self._dues.setdefault(tenant_id, []).append((due, promise.seq))
        return promise

    def redeem(self, promise: Promise) -> None:
        """The promised turn came back (or its session was forgotten): it no longer holds a place."""
        dues = self._dues.get(promise.tenant_id)
        if dues is None:
            return
        index = bisect.bisect_left(dues, (promise.due, promise.seq))
        if index < len(dues) and dues[index] == (promise.due, promise.seq):
            del dues[index]
            if not dues:
                del self._dues[promise.tenant_id]

    def due_before(self, now: float, horizon: float, tenant_id: str) -> int:
        """`tenant_id`'s promises due by `horizon` and still expected (those more than `grace_s` overdue at `now`
        are forgotten)."""
        dues = self._dues.get(tenant_id)
        if dues is None:
            return 0
        self._forget(tenant_id, dues, now)
        return bisect.bisect_right(dues, (horizon, math.inf))

    def expected_count(self, now: float) -> int:
        """Every tenant's promises still expected at `now`."""
        for tenant_id, dues in list(self._dues.items()):
            self._forget(tenant_id, dues, now)
        return len(self)

    def _forget(self, tenant_id: str, dues: list[tuple[float, int]], now: float) -> None:
        stale = bisect.bisect_left(dues, (now - self.grace_s, -1))
        if stale:
            del dues[:stale]
            if not dues:
                del self._dues[tenant_id]

    def horizon_s(self, now: float) -> float:
        """How far from `now` the last promise is due (0 when none is ahead): about what a turn shed now is told."""
        return max(self._last_due - now, 0.0) if self._dues else 0.0

    def expected(self, promise: Promise, now: float) -> bool:
        """Whether `promise` still holds a place at `now` (not more than `grace_s` overdue)."""
        return now - promise.due <= self.grace_s

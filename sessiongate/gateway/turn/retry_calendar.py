"""When shed turns come back: return times spaced by what the gateway serves (`admission`).

A turn refused at saturation is told when to come back (`Retry-After`), and its session's next turn is not refused
again when it comes back on time (`FairAdmission.enter`), unless the queue it finds is far past the bound: then it
is told again (`again`), ahead of the returns promised after its own. Told only its own predicted wait, every shed
turn of a gateway asked for twice what it serves came back within a few seconds of the others, and since none of
those was refused again they all queued: at 10,000 sessions (docs/benchmarks.md, "The cyclic collector") the
accepted turns waited 11-14 s against a 2 s bound. Refusing the second tries as well kept the wait lower but tripled
the refusals (every session retried every few seconds) and served 14% fewer turns.

So a shed turn is told to come back at the first time by which the turns now waiting, the returns promised before
that time, and its own start would have started, less `cushion_s` (a little work left ahead of it, so that the
workers do not wait on a late client): a waiting turn takes one turn start (`per_start`, the time the gateway takes
to start a turn at its recent rate), a return one start at the rate returns may take (`returns_per_s`, a little
below the rate sustained: `FairAdmission.returns_per_s`). Returns then come no faster than that, whatever the queue
did when each was promised; a turn that queued meanwhile (a session light enough to be predicted a short wait) moves
the next returns on, and a gap a short queue left is filled. The time is found stepping through `SLOT_S` slots
ahead, counting the returns due before each slot's end.

Three simpler rules were measured and dropped (10,000 sessions, 2 s bound; a simulation of the queue with a closed
loop of clients): adding up starts, one per refusal, drifted from the real queue (turns queued before the rate was
known were never in it; a 6-10 s queue never drained); a time from the queue and every return outstanding made the
queue swing between 0.2 and 8 s (a long queue sent its refusals far out, a short one brought the next ones in early,
on top of them); slots filled at the rate of the last second or two came due when the gateway served less.

Returns promised within the bound also count as turns of their tenant already queued when a new turn of that tenant
has its wait predicted, so other sessions' first tries do not take the room kept for them (another tenant's returns
queue in that tenant's lane, served by weight). A promise not redeemed within `grace_s` of its time (the client gave
up, or went to another replica) is forgotten.
"""

import bisect
import itertools
import math

__all__ = ["Promise", "RetryCalendar"]


SLOT_S = 0.25


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
        # The (due, seq) of the promises still expected, sorted: all of them, and per tenant (a return queues in its
        # tenant's lane). A tenant's list is cut when it is read or swept (`sweep`).
        self._dues: list[tuple[float, int]] = []
        self._by_tenant: dict[str, list[tuple[float, int]]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._dues)

    def promise(
        self, now: float, per_start: float, waiting: int, tenant_id: str, *, returns_per_s: float | None = None
    ) -> Promise:
        """A shed turn's return time (module docstring): after the `waiting` turns, the returns due before it (one
        per `1 / returns_per_s`, or per `per_start` when no rate is given) and its own start, less `cushion_s`."""
        self.expected_count(now)  # forgets the promises past
        per_start = max(per_start, 0.0)
        per_return = 1.0 / returns_per_s if returns_per_s else per_start
        base = now + (waiting + 1) * per_start - self.cushion_s
        slot = math.floor(max(base, now) / SLOT_S)
        while True:
            # The returns due before the slot ends: those in it may be due before the time found in it.
            ahead = bisect.bisect_left(self._dues, ((slot + 1) * SLOT_S, -1))
            due = max(slot * SLOT_S, base + ahead * per_return, now)
            if due < (slot + 1) * SLOT_S:
                break
            slot += 1
        return self._hold(due, tenant_id)

    def again(self, now: float, wait_s: float, tenant_id: str) -> Promise:
        """A return that came on time to a queue far longer than promised, told again: back when the `wait_s` the
        queue now holds will have passed, less `cushion_s`. No promise made after its own counts ahead of it (those
        find the same queue and are told again behind it), so it keeps its place."""
        self.expected_count(now)
        return self._hold(now + max(wait_s - self.cushion_s, 0.0), tenant_id)

    def _hold(self, due: float, tenant_id: str) -> Promise:
        promise = Promise(due, next(self._seq), tenant_id)
        bisect.insort(self._dues, (due, promise.seq))
        bisect.insort(self._by_tenant.setdefault(tenant_id, []), (due, promise.seq))
        return promise

    def redeem(self, promise: Promise) -> None:
        """The promised turn came back (or its session was forgotten): it no longer holds a place (back, it is one of
        the turns waiting now, no longer a return ahead)."""
        entry = (promise.due, promise.seq)
        _remove(self._dues, entry)
        dues = self._by_tenant.get(promise.tenant_id)
        if dues is not None:
            _remove(dues, entry)
            if not dues:
                del self._by_tenant[promise.tenant_id]

    def expected_count(self, now: float) -> int:
        """The promises still expected at `now` (those more than `grace_s` overdue are forgotten)."""
        _cut(self._dues, now - self.grace_s)
        return len(self._dues)

    def due_before(self, now: float, horizon: float, tenant_id: str) -> int:
        """`tenant_id`'s promises due by `horizon` and still expected at `now`."""
        dues = self._by_tenant.get(tenant_id)
        if dues is None:
            return 0
        if _cut(dues, now - self.grace_s) and not dues:
            del self._by_tenant[tenant_id]
            return 0
        return bisect.bisect_right(dues, (horizon, math.inf))

    def sweep(self, now: float) -> None:
        """Cut every tenant's forgotten promises (a tenant that sheds no more is never read again)."""
        self.expected_count(now)
        for tenant_id in [t for t, dues in self._by_tenant.items() if _cut(dues, now - self.grace_s) and not dues]:
            del self._by_tenant[tenant_id]

    def horizon_s(self, now: float) -> float:
        """How far from `now` the last promise is due (0 when none is ahead): about what a turn shed now is told."""
        return max(self._dues[-1][0] - now, 0.0) if self._dues else 0.0

    def expected(self, promise: Promise, now: float) -> bool:
        """Whether `promise` still holds a place at `now` (not more than `grace_s` overdue)."""
        return now - promise.due <= self.grace_s


def _remove(dues: list[tuple[float, int]], entry: tuple[float, int]) -> None:
    index = bisect.bisect_left(dues, entry)
    if index < len(dues) and dues[index] == entry:
        del dues[index]


def _cut(dues: list[tuple[float, int]], before: float) -> int:
    """Drop the entries due before `before`; how many."""
    stale = bisect.bisect_left(dues, (before, -1))
    if stale:
        del dues[:stale]
    return stale

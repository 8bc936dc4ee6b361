"""Fair admission of chat turns: a bounded active phase, a queue ordered by least attained service, and shedding.

Every chat turn (a `/v1/responses` turn is a chat turn inside) passes `FairAdmission.enter` once its body is read
and its session known, before anything of it is written to the store. At most `max_active` turns are in their
active phase at once (recorded, routed, sent to a worker, answered, recorded again); the others wait, and each
free slot goes, in two steps, to:

1. the tenant whose attained service divided by its weight is least, among the tenants with turns waiting;
2. within it, the waiting turn with the least start tag: its session's attained service, at least the tag of the
   last turn the tenant started (start-time fair queueing, whose virtual time this is) and at most one mean turn
   cost past it (`AdmissionConfig.tag_span_turns`), plus the estimated cost of the session's turns already queued
   or running. So a session that floods turns interleaves with the others instead of going first (each of its turns
   goes one cost further back), one turn in flight counts against its session's next, a session that comes back
   after a pause goes ahead of the heavier ones but not of the turns already due, and a session that used far more
   than the others (a long agent loop) waits behind about one round of theirs, not until they have caught up with it.

Attained service is tokens (prompt + completion, as the worker reports them): a turn counts at its estimate while
queued or running (against its session from its arrival, its tenant from its start) and at the real figure once it
ends, decayed with a half-life: a session or tenant that was quiet comes back with a small figure and goes ahead of
a long-running agent session; a new session starts at 0. Decay costs no pass over the entries: a charge made at
time t is stored multiplied by 2^(t / half_life), so every stored figure decays by the same factor and their order
holds (renormalised once the factor grows large). Idle sessions whose service decayed below a token, or is no more
than their tenant's virtual time (a new session would get the same tag), are forgotten (`_sweep`), so memory
follows the sessions active lately.

A turn predicted to wait past `max_wait_s` is refused at once (`admission_parts.ShedDecision`: 429 or 503) and told
when to come back (`retry_calendar`: return times spaced by what the gateway serves); while returns are due within
the bound, a new turn is predicted behind its tenant's whole queue, not only the turns its tag puts ahead (admitted
ahead of them, it would push every queued turn and every return past the bound). Its session's next turn, back on
time, queues unless its tenant's queue would hold it past 1.5 times the bound (which sessions meet a long queue is
chance, and a shed session waits out its `Retry-After` while the others cycle: shed again and again, one fell to a
quarter of its fair share); past that (the gateway serves less than when the return was promised) it is told again,
ahead of the returns promised after its own; back early, it is told again, keeping its place. A turn already queued
is never dropped, and a turn that was its session's only one when it came and has waited twice the bound starts
ahead of the order (the oldest first): sessions coming back from a pause enter at the virtual time and could
otherwise hold back a turn tagged just past it for as long as they keep coming. A session's further turns (a flood)
get no such start: when they did, the flood's turns came in that way and took 8 times their share.

Advisory prefetches never pass here (the advisor sends them itself): they hold no slot, stand ahead of no turn.
Value types (a turn's `FairSlot` among them) and per-session records: `admission_parts`."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable

from .admission_parts import (
    AdmissionConfig,
    FairSlot,
    SessionRecord,
    ShedDecision,
    TenantRecord,
    Waiter,
    WaitHistogram,
    estimate_cost,
)
from .retry_calendar import RetryCalendar

__all__ = ["AdmissionConfig", "FairAdmission", "FairSlot", "ShedDecision", "estimate_cost"]

# Renormalise the stored figures once the decay factor passes 2**this (far below a float's range).
_RENORMALISE_AFTER_HALF_LIVES = 256.0
# A gateway left idle for longer than this many half-lives has everything decayed to nothing anyway.
_MAX_EXPONENT = 1000.0
# Weight of the newest active time (and turn cost) in the means (exponential moving averages over about 50 turns).
_MEAN_WEIGHT = 0.02
# A shed turn's session back this much before its return time is told again (a client that waits as told is late,
# never early: the time is counted from the refusal, before the answer reaches it).
RETURN_EARLY_S = 0.1
# A return on time is told again (keeping its place) only when its tenant's queue would hold it this many times the
# bound: returns promised up to a minute ahead, at the rate of then, met a gateway serving a third of it and queued
# 6-10 s (10,000 sessions on the 2-core AMD machine); below it a return queues, as it was promised.
RETELL_PAST_BOUND = 1.5
# The share of the sustained start rate that promised returns may take (`returns_per_s`): the rest absorbs the
# rate's swings and the turns that still queue.
RETURNS_SHARE_OF_RATE = 0.9


def _moving(mean: float | None, sample: float, weight: float) -> float:
    """An exponential moving average: `sample` itself when there is none yet."""
    return float(sample) if mean is None else mean + weight * (sample - mean)


class FairAdmission:
    def __init__(
        self,
        config: AdmissionConfig,
        *,
        weight: Callable[[str], float] = lambda tenant_id: 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._weight = weight
        self._clock = clock
        self._epoch = clock()
        self._last_sweep = self._epoch
        self._sessions: dict[str, SessionRecord] = {}
        self._tenants: dict[str, TenantRecord] = {}
        self._heap: list[tuple[float, int, int, str]] = []  # (served / weight, seq, version, tenant): waiting ones
        self._backlogged: set[str] = set()  # tenants with turns waiting
        # Waiters that were their session's only turn when they came, oldest first (finished ones skipped lazily).
        self._arrivals: deque[Waiter] = deque()
        self._seq = itertools.count()
        self.active = 0
        self.waiting = 0
        self._limit = config.max_active  # moved by `loop_lag.LoopLagLimiter` when one runs
        self._present_weight = 0.0  # sum of the weights of tenants with turns active or waiting
        self.mean_active_s: float | None = None
        self.mean_concurrency: float | None = None  # turns active as each ends, recently
        self.mean_cost: float | None = None  # tokens a turn used, recently
        self.shed_counts = {429: 0, 503: 0}
        self.started = 0
        self.waits = WaitHistogram()
        # A promise is forgotten twice the bound after its time, and a second more: a client that reads only
        # `Retry-After`, in whole seconds, comes back up to a second late. A return finds half the bound ahead of it.
        self.calendar = RetryCalendar(grace_s=2 * config.max_wait_s + 1.0, cushion_s=config.max_wait_s / 2)
        self.start_rate: float | None = None  # turns started a second while turns waited, recently
        # The same over half a minute or so: returns are promised that far ahead, at a rate they will still find.
        self.sustained_rate: float | None = None
        self._rate_at = self._epoch
        self._rate_started = 0

    # --- the turn's side -------------------------------------------------------------------------------------

    async def enter(self, tenant_id: str, session_id: str, cost: int) -> FairSlot:
        """Wait for the turn's slot; raise the shed error at once when the predicted wait passes the bound."""
        if not self.config.max_active:
            return FairSlot(None, tenant_id, session_id, cost, 0.0, 0.0)
        now = self._clock()
        self._maintain(now)
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = SessionRecord(tenant_id)
        tenant = self._tenant(tenant_id)
        scale = self._scale(now)
        tag = self._tag(tenant, session, scale)
        free = self.active < self._limit and not self.waiting
        promise = session.promise
        on_time = promise is not None and self.calendar.expected(promise, now)
        if promise is not None and on_time and not free and now < promise.due - RETURN_EARLY_S:
            wait = promise.due - now  # back early to a full gateway: told again when, its place kept
            raise self._shed(ShedDecision(wait, self.config.max_wait_s, self._over_share(tenant_id), wait))
        if promise is not None:
            self.calendar.redeem(promise)
            session.promise = None
            if on_time and not free:
                late = self._retell(tenant_id, session, now)
                if late is not None:
                    raise self._shed(late)
        if free:
            self._charge(tenant, session, cost, scale)
            return self._start(tenant, tenant_id, session, session_id, cost, now)
        waiter = Waiter(tenant_id, session_id, cost, tag, next(self._seq), now)
        decision = None if on_time else self.shed_decision(tenant_id, tag, waiter.seq, now)
        if decision is not None:
            promise = session.promise = self.calendar.promise(
                now, self.per_start_s(), self.waiting, tenant_id, returns_per_s=self.returns_per_s()
            )
            raise self._shed(dataclasses.replace(decision, retry_after_s=promise.due - now))
        self._charge(tenant, session, cost, scale)
        self._enqueue(tenant, session, waiter)
        future = waiter.future = asyncio.get_running_loop().create_future()
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():  # the slot was handed over as the wait was cancelled
                self._release(FairSlot(self._release, tenant_id, session_id, cost, waiter.started_at, now), 0)
            else:
                self._withdraw(waiter)
            raise
        return FairSlot(self._release, tenant_id, session_id, cost, waiter.started_at, now)

    @property
    def limit(self) -> int:
        """Turns allowed in their active phase now: `config.max_active`, or less while the loop lags."""
        return self._limit

    def set_limit(self, limit: int) -> None:
        self._limit = limit
        self._dispatch(self._clock())  # a higher limit starts waiting turns now; a lower one lets active turns end

    def _tag(self, tenant: TenantRecord, session: SessionRecord, scale: float) -> float:
        """A new turn's start tag: its session's service, at least the tenant's virtual time and at most
        `tag_span_turns` mean turns past it, plus the estimates of its turns already queued or running."""
        base = max(session.service, tenant.virtual)
        if self.mean_cost is not None:
            base = min(base, tenant.virtual + self.config.tag_span_turns * self.mean_cost * scale)
        return base + session.pending

    @staticmethod
    def _charge(tenant: TenantRecord, session: SessionRecord, cost: int, scale: float) -> None:
        # A session behind the virtual time is brought up to it (start-time fair queueing); one past the span keeps
        # its service, so it stays behind until that decays.
        session.service = max(session.service, tenant.virtual)
        session.pending += cost * scale

    def shed_decision(self, tenant_id: str, tag: float, seq: int, now: float) -> ShedDecision | None:
        """The decision for a turn of `tenant_id` with start tag `tag` that cannot start at once (None: queue it)."""
        if not self.config.max_wait_s or self.mean_active_s is None:
            return None
        promised = self.calendar.due_before(now, now + self.config.max_wait_s, tenant_id)
        # With returns due within the bound, a turn light enough to go ahead of the queue would still push every
        # turn queued and every return back, past the bound: it is admitted only if the whole queue drains in time.
        predicted = self.predicted_wait_s(tenant_id, math.inf if promised else tag, seq, promised=promised)
        if predicted <= self.config.max_wait_s:
            return None
        return ShedDecision(predicted, self.config.max_wait_s, self._over_share(tenant_id), predicted)

    def _retell(self, tenant_id: str, session: SessionRecord, now: float) -> ShedDecision | None:
        """A return on time that finds its tenant's queue past `RETELL_PAST_BOUND` times the bound (the gateway
        serves less than when the return was promised) is told again when the queue now ahead will have started,
        less the cushion, counting no return promised after its own: it keeps its place among them. None: it queues."""
        bound = self.config.max_wait_s
        if not bound or self.mean_active_s is None:
            return None
        predicted = self.predicted_wait_s(tenant_id, math.inf, 0)  # a tag of math.inf: behind every waiting turn
        if predicted <= RETELL_PAST_BOUND * bound:
            return None
        promise = session.promise = self.calendar.again(now, predicted, tenant_id)
        return ShedDecision(predicted, bound, self._over_share(tenant_id), promise.due - now)

    def per_start_s(self) -> float:
        """Seconds between turn starts at saturation: the mean active time over the turns that can be active (the
        limit, or the mean number active as turns ended when that was more), or the measured rate's interval when
        longer (the mean lags when turns slow down, and a limit lowered under the active turns starts none until
        they are fewer).

        Not over the limit alone: while the event loop lags (`loop_lag`) the limit moves every few ticks, and the
        mean active time is the one the turns had at the concurrency they ran at; over a limit lowered a moment ago
        it predicted starts twice as far apart as they came (4 ms against 2 ms), and shed turns were told to come
        back up to twice as late as they would have started (the 2-core machine of 2026-11-28, night)."""
        can_be_active = max(float(self._limit), self.mean_concurrency or 0.0, 1.0)
        by_mean = (self.mean_active_s or 0.0) / can_be_active
        return max(by_mean, 1.0 / self.start_rate) if self.start_rate else by_mean

    def returns_per_s(self) -> float | None:
        """How many promised returns a second the calendar may place: nine tenths of the start rate, as the queue
        predicts it (`per_start_s`) or over half a minute, whichever is less (None before it is measured). Returns
        placed at the rate of the last second or two, half a minute ahead, came due when the gateway served less."""
        per_start = self.per_start_s()
        if not self.sustained_rate or per_start <= 0:
            return None
        return RETURNS_SHARE_OF_RATE * min(1.0 / per_start, self.sustained_rate)

    def _shed(self, decision: ShedDecision) -> Exception:
        self.shed_counts[429 if decision.over_share else 503] += 1
        return decision.error()

    def predicted_wait_s(self, tenant_id: str, tag: float, seq: int, *, promised: int = 0) -> float:
        """How long a turn with this tag would wait: the turns that would start before it (`promised`: shed turns
        due back meanwhile, counted as queued ahead), at the recent rate."""
        if self.mean_active_s is None:
            return 0.0
        tenant = self._tenants.get(tenant_id)
        own = bisect.bisect_left(tenant.queue, (tag, seq)) if tenant is not None else 0
        weight = tenant.weight if tenant is not None else self._weight(tenant_id)
        rounds = (own + 1) / weight
        others = 0.0  # what the other waiting tenants start meanwhile, by weight
        for other_id in self._backlogged:
            if other_id != tenant_id:
                other = self._tenants[other_id]
                others += min(other.waiting, rounds * other.weight)
        return (own + others + promised + 1) * self.per_start_s()

    def _over_share(self, tenant_id: str) -> bool:
        tenant = self._tenants.get(tenant_id)
        if tenant is None or not self._present_weight:
            return False
        present = tenant.active + tenant.waiting
        if not present:
            return False
        share = present / (self.active + self.waiting)
        return share > tenant.weight / self._present_weight + 1e-9

    # --- bookkeeping -----------------------------------------------------------------------------------------

    def _tenant(self, tenant_id: str) -> TenantRecord:
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            tenant = self._tenants[tenant_id] = TenantRecord(max(self._weight(tenant_id), 1e-6))
        return tenant

    def _scale(self, at: float) -> float:
        """The factor a charge made at `at` is stored with (capped far below a float's range)."""
        return float(2.0 ** min((at - self._epoch) / self.config.half_life_s, _MAX_EXPONENT))

    def _start(
        self, tenant: TenantRecord, tenant_id: str, session: SessionRecord, session_id: str, cost: int, now: float
    ) -> FairSlot:
        self._count_in(tenant)
        tenant.active += 1
        session.active += 1
        self.active += 1
        self.started += 1
        self.waits.observe(0.0)
        tenant.served += cost * self._scale(now)
        return FairSlot(self._release, tenant_id, session_id, cost, now, now)

    def _count_in(self, tenant: TenantRecord) -> None:
        if not tenant.active and not tenant.waiting:
            self._present_weight += tenant.weight

    def _count_out(self, tenant: TenantRecord) -> None:
        if not tenant.active and not tenant.waiting:
            self._present_weight = max(self._present_weight - tenant.weight, 0.0)

    def _enqueue(self, tenant: TenantRecord, session: SessionRecord, waiter: Waiter) -> None:
        if not session.active and not session.waiting:
            self._arrivals.append(waiter)
        self._count_in(tenant)
        bisect.insort(tenant.queue, (waiter.tag, waiter.seq, waiter))
        tenant.waiting += 1
        session.waiting += 1
        self.waiting += 1
        if tenant.waiting == 1:
            self._backlogged.add(waiter.tenant_id)
            self._push(waiter.tenant_id, tenant)

    def _push(self, tenant_id: str, tenant: TenantRecord) -> None:
        """(Re)place a waiting tenant in the heap at its current figure; older entries of it become stale."""
        tenant.version += 1
        heapq.heappush(self._heap, (tenant.served / tenant.weight, next(self._seq), tenant.version, tenant_id))
        if len(self._heap) > 2 * len(self._backlogged) + 64:  # stale entries are dropped as they reach the top;
            self._rebuild_heap()  # this bounds how many wait for that

    def _rebuild_heap(self) -> None:
        self._heap = []
        for tenant_id in self._backlogged:
            tenant = self._tenants[tenant_id]
            tenant.version += 1
            self._heap.append((tenant.served / tenant.weight, next(self._seq), tenant.version, tenant_id))
        heapq.heapify(self._heap)

    def _unqueue(self, waiter: Waiter) -> tuple[TenantRecord, SessionRecord]:
        """Take `waiter` out of its tenant's queue and the counts (it starts, or it left)."""
        tenant = self._tenants[waiter.tenant_id]
        session = self._sessions[waiter.session_id]
        index = bisect.bisect_left(tenant.queue, (waiter.tag, waiter.seq))
        del tenant.queue[index]
        tenant.waiting -= 1
        if not tenant.waiting:
            self._backlogged.discard(waiter.tenant_id)
        session.waiting -= 1
        self.waiting -= 1
        waiter.future = None
        return tenant, session

    def _withdraw(self, waiter: Waiter) -> None:
        """A waiting turn whose client went away: out of the queue, its estimate refunded to its session."""
        if waiter.future is None:
            return
        tenant, session = self._unqueue(waiter)
        self._settle(session, waiter.cost * self._scale(waiter.enqueued_at), 0.0)
        self._count_out(tenant)
        if tenant.waiting:
            self._push(waiter.tenant_id, tenant)

    @staticmethod
    def _settle(session: SessionRecord, estimate: float, used: float) -> None:
        """A turn of `session` left: its estimate out of the pending figure, the tokens it used into its service."""
        session.service += used
        session.pending = max(session.pending - estimate, 0.0) if session.active or session.waiting else 0.0

    def _release(self, slot: FairSlot, tokens: int) -> None:
        now = self._clock()
        tenant_id, started_at = slot.tenant_id, slot.started_at
        tenant = self._tenants[tenant_id]
        session = self._sessions[slot.session_id]
        tenant.active -= 1
        session.active -= 1
        self.active -= 1
        # At the scale of the charges, so that an estimate above the real figure never leaves less than nothing.
        charge_scale = self._scale(slot.charged_at)
        self._settle(session, slot.cost * charge_scale, tokens * charge_scale)
        tenant.served = max(tenant.served + (tokens - slot.cost) * self._scale(started_at), 0.0)
        self._count_out(tenant)
        elapsed = max(now - started_at, 0.0)
        self.mean_active_s = _moving(self.mean_active_s, elapsed, _MEAN_WEIGHT)
        self.mean_concurrency = _moving(self.mean_concurrency, self.active + 1, _MEAN_WEIGHT)  # this turn counted
        self.mean_cost = _moving(self.mean_cost, tokens, _MEAN_WEIGHT)
        if tenant.waiting:
            self._push(tenant_id, tenant)
        self._dispatch(now)

    def _dispatch(self, now: float) -> None:
        """Hand free slots to the next waiting turns."""
        while self.active < self._limit and self.waiting:
            waiter = self._next(now)
            future = waiter.future
            waiter.started_at = now
            tenant, session = self._unqueue(waiter)
            session.active += 1
            tenant.active += 1
            self.active += 1
            self.started += 1
            self.waits.observe(now - waiter.enqueued_at)
            tenant.served += waiter.cost * self._scale(now)
            tenant.virtual = max(tenant.virtual, waiter.tag)
            if tenant.waiting:
                self._push(waiter.tenant_id, tenant)
            if future is not None and not future.done():
                future.set_result(None)

    def _next(self, now: float) -> Waiter:
        arrivals = self._arrivals
        while arrivals and arrivals[0].future is None:
            arrivals.popleft()
        overdue_after = 2 * self.config.max_wait_s
        if arrivals and overdue_after and now - arrivals[0].enqueued_at > overdue_after:
            return arrivals.popleft()
        while True:
            _, _, version, tenant_id = heapq.heappop(self._heap)
            tenant = self._tenants.get(tenant_id)
            if tenant is not None and tenant.version == version and tenant.waiting:
                tenant.version += 1  # its entry is spent; the caller pushes a new one if it still waits
                return tenant.queue[0][2]

    def _maintain(self, now: float) -> None:
        if now - self._rate_at >= 1.0:
            if self.waiting:  # saturated (by the end of the window, at least): the starts are what it serves
                sample = (self.started - self._rate_started) / (now - self._rate_at)
                self.start_rate = _moving(self.start_rate, sample, 0.3)
                self.sustained_rate = _moving(self.sustained_rate, sample, 0.05)
            self._rate_at, self._rate_started = now, self.started
        if now - self._last_sweep >= self.config.half_life_s:
            self._sweep(now)
        if (now - self._epoch) / self.config.half_life_s > _RENORMALISE_AFTER_HALF_LIVES:
            self._renormalise(now)

    def _sweep(self, now: float) -> None:
        """Forget idle sessions whose service decayed below a token or is no more than their tenant's virtual time
        (a new session would get the same tag) and that hold no return time, and idle tenants whose service decayed
        below a token."""
        self._last_sweep = now
        floor = self._scale(now)
        tenants = self._tenants
        calendar = self.calendar
        calendar.sweep(now)
        for sid in [
            s
            for s, e in self._sessions.items()
            if not e.active
            and not e.waiting
            and (e.service < floor or self._at_frontier(e))
            and (e.promise is None or not calendar.expected(e.promise, now))
        ]:
            del self._sessions[sid]
        for tid in [t for t, e in tenants.items() if not e.active and not e.waiting and e.served < floor]:
            del tenants[tid]

    def _at_frontier(self, session: SessionRecord) -> bool:
        tenant = self._tenants.get(session.tenant_id)
        return tenant is not None and session.service <= tenant.virtual

    def _renormalise(self, now: float) -> None:
        """Divide every stored figure by the decay factor now, making now the epoch (the order is unchanged)."""
        factor = self._scale(now)
        for session in self._sessions.values():
            session.service /= factor
            session.pending /= factor
        for tenant in self._tenants.values():
            tenant.served /= factor
            tenant.virtual /= factor
            tenant.queue = [(tag / factor, seq, w) for tag, seq, w in tenant.queue]
            for _, _, waiter in tenant.queue:
                waiter.tag /= factor
        # Times stored on waiters and slots stay absolute: the scale of a past charge is computed from them.
        self._epoch = now
        self._rebuild_heap()

    def returns(self) -> tuple[int, float]:
        """Shed turns told to come back and still expected, and how far ahead the last of them is due."""
        now = self._clock()
        return self.calendar.expected_count(now), self.calendar.horizon_s(now)

    def stats(self) -> dict[str, float | int]:
        promised, horizon = self.returns()
        return {
            "active": self.active,
            "waiting": self.waiting,
            "sessions": len(self._sessions),
            "tenants": len(self._tenants),
            "started": self.started,
            "shed_429": self.shed_counts[429],
            "shed_503": self.shed_counts[503],
            "mean_active_s": self.mean_active_s if self.mean_active_s is not None else math.nan,
            "limit": self._limit,
            "returns_promised": promised,
            "return_horizon_s": horizon,
        }

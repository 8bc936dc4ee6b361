"""The fair queue's logic (gateway/turn/admission.py) on a fake clock: who starts next, decay, and when a turn is
shed."""

from __future__ import annotations

import asyncio

import pytest

from sessiongate.gateway.errors import RateLimited, Saturated
from sessiongate.gateway.turn.admission import AdmissionConfig, FairAdmission, FairSlot
from sessiongate.gateway.turn.retry_calendar import RetryCalendar

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admission(clock: Clock, *, max_active: int = 1, max_wait_s: float = 0.0, **options: object) -> FairAdmission:
    weights = options.pop("weights", {})
    assert isinstance(weights, dict)
    config = AdmissionConfig(max_active=max_active, max_wait_s=max_wait_s, half_life_s=30.0)
    return FairAdmission(config, clock=clock, weight=lambda tenant: float(weights.get(tenant, 1.0)))


class Starts:
    """Turns queued as tasks; `order` lists their labels as they get a slot."""

    def __init__(self, gate: FairAdmission) -> None:
        self.gate = gate
        self.order: list[str] = []
        self.slots: dict[str, FairSlot] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def queue(self, label: str, tenant: str, session: str, cost: int = 100) -> None:
        async def run() -> None:
            self.slots[label] = await self.gate.enter(tenant, session, cost)
            self.order.append(label)

        self.tasks[label] = asyncio.create_task(run())
        await asyncio.sleep(0)  # queued before the next one arrives

    async def release(self, label: str, tokens: int | None = None) -> None:
        self.slots[label].release(tokens)
        await asyncio.sleep(0)
        await asyncio.sleep(0)


async def test_turns_start_at_once_while_slots_are_free_and_queue_after() -> None:
    gate = admission(Clock(), max_active=2)
    starts = Starts(gate)
    await starts.queue("a", "t", "s1")
    await starts.queue("b", "t", "s2")
    await starts.queue("c", "t", "s3")
    assert starts.order == ["a", "b"]
    assert (gate.active, gate.waiting) == (2, 1)
    await starts.release("a")
    assert starts.order == ["a", "b", "c"]
    assert (gate.active, gate.waiting) == (2, 0)


async def test_the_session_with_least_attained_service_goes_first() -> None:
    clock = Clock()
    gate = admission(clock)
    starts = Starts(gate)
    await starts.queue("long-1", "t", "agent", cost=100)
    await starts.release("long-1", tokens=5000)  # the agent session has been served 5,000 tokens
    await starts.queue("hold", "t", "other", cost=10)
    await starts.queue("long-2", "t", "agent", cost=100)  # arrives first
    await starts.queue("chat", "t", "chat", cost=100)  # a new session: no service yet
    await starts.release("hold", tokens=10)
    await starts.release(starts.order[-1])
    assert starts.order == ["long-1", "hold", "chat", "long-2"]


@pytest.mark.parametrize("mean_cost", [None, 100.0])
async def test_a_flooding_session_interleaves_with_another_instead_of_going_first(mean_cost: float | None) -> None:
    gate = admission(Clock())
    gate.mean_cost = mean_cost  # with a mean turn cost known the span caps past service, not the turns in flight
    starts = Starts(gate)
    await starts.queue("hold", "t", "other")
    for k in range(4):
        await starts.queue(f"flood-{k}", "t", "flood")
    await starts.queue("single", "t", "single")
    while len(starts.order) < 6:
        await starts.release(starts.order[-1])
    # The single turn waits for one of the flood's, not all four: the flood's later turns carry the earlier ones'
    # cost in their tags.
    assert starts.order[:3] == ["hold", "flood-0", "single"]
    assert starts.order[3:] == ["flood-1", "flood-2", "flood-3"]


async def test_a_turn_in_flight_counts_against_its_sessions_next_turn() -> None:
    gate = admission(Clock())
    starts = Starts(gate)
    await starts.queue("busy-1", "t", "busy")  # running
    await starts.queue("busy-2", "t", "busy")  # queued first
    await starts.queue("idle-1", "t", "idle")
    await starts.release("busy-1", tokens=100)
    assert starts.order == ["busy-1", "idle-1"]


async def test_a_new_session_goes_ahead_of_heavier_ones_but_not_of_turns_already_due() -> None:
    gate = admission(Clock())
    starts = Starts(gate)
    await starts.queue("h1", "t", "h")  # runs: h has 100
    await starts.queue("h2", "t", "h")  # tag 100
    await starts.queue("x1", "t", "x")  # tag 0
    await starts.release("h1", tokens=100)
    await starts.release("x1", tokens=100)  # x has 100; h2 starts, the tenant's virtual time is now 100
    await starts.queue("h3", "t", "h")  # tag 200
    await starts.queue("x2", "t", "x")  # tag 100
    await starts.queue("new", "t", "new")  # no service, but its tag is the virtual time: 100, after x2
    await starts.release("h2", tokens=100)
    await starts.release("x2", tokens=100)
    await starts.release("new", tokens=100)
    assert starts.order == ["h1", "x1", "h2", "x2", "new", "h3"]


async def test_a_much_heavier_session_waits_about_one_round_not_until_the_others_catch_up() -> None:
    gate = admission(Clock())
    starts = Starts(gate)
    await starts.queue("heavy-1", "t", "heavy")
    await starts.release("heavy-1", tokens=10_000)  # a hundred times a usual turn
    gate.mean_cost = 100.0  # what the usual turns used
    await starts.queue("hold", "t", "hold")
    await starts.queue("heavy-2", "t", "heavy")  # tag: the virtual time (0) plus one mean turn, not 10,000
    for session in ("a", "b"):
        for k in range(1, 4):
            await starts.queue(f"{session}{k}", "t", session)  # tags 0, 100, 200
    while len(starts.order) < 9:
        await starts.release(starts.order[-1], tokens=100)
    assert starts.order[2:] == ["a1", "b1", "heavy-2", "a2", "b2", "a3", "b3"]


async def test_tenants_share_slots_by_weight() -> None:
    gate = admission(Clock(), weights={"gold": 2.0, "basic": 1.0})
    starts = Starts(gate)
    await starts.queue("hold", "other", "hold", cost=1)
    for k in range(12):
        await starts.queue(f"gold-{k}", "gold", f"g{k}")
        await starts.queue(f"basic-{k}", "basic", f"b{k}")
    await starts.release("hold", tokens=0)
    while len(starts.order) < 13:
        await starts.release(starts.order[-1], tokens=100)
    first_twelve = starts.order[1:13]
    assert sum(label.startswith("gold") for label in first_twelve) == 8  # two for one
    assert sum(label.startswith("basic") for label in first_twelve) == 4


async def test_many_sessions_of_one_tenant_do_not_outweigh_another_tenant() -> None:
    gate = admission(Clock())
    starts = Starts(gate)
    await starts.queue("hold", "other", "hold", cost=1)
    for k in range(10):
        await starts.queue(f"many-{k}", "many", f"m{k}")  # ten sessions
    for k in range(5):
        await starts.queue(f"one-{k}", "one", "only")  # one session, five turns
    await starts.release("hold", tokens=0)
    while len(starts.order) < 11:
        await starts.release(starts.order[-1], tokens=100)
    assert sum(label.startswith("one") for label in starts.order[1:11]) == 5


async def test_attained_service_decays_with_the_half_life() -> None:
    clock = Clock()
    gate = admission(clock)
    starts = Starts(gate)
    await starts.queue("old", "t", "old", cost=1000)
    await starts.release("old", tokens=1000)  # 1,000 tokens at t0
    clock.now += 60  # two half-lives: 250 left
    await starts.queue("recent", "t", "recent", cost=300)
    await starts.release("recent", tokens=300)  # 300 tokens now
    await starts.queue("hold", "t", "hold", cost=0)
    await starts.queue("recent-2", "t", "recent")
    await starts.queue("old-2", "t", "old")
    await starts.release("hold", tokens=0)
    assert starts.order[-1] == "old-2"  # 250 < 300: the old session's service has decayed below the recent one's


async def test_a_cancelled_wait_leaves_the_queue_and_its_estimate() -> None:
    gate = admission(Clock())
    starts = Starts(gate)
    await starts.queue("hold", "t", "hold")
    await starts.queue("gone", "t", "gone", cost=10_000)
    await starts.queue("next", "t", "next")
    starts.tasks["gone"].cancel()
    await asyncio.sleep(0)
    assert gate.waiting == 1
    await starts.release("hold")
    assert starts.order == ["hold", "next"]
    await starts.queue("gone-again", "t", "gone")
    await starts.queue("fresh", "t", "fresh")
    await starts.release("next")
    # The cancelled turn's estimate was refunded: its session has no service, and arrived before "fresh".
    assert starts.order == ["hold", "next", "gone-again"]


async def test_predicted_wait_counts_the_turns_ahead_at_the_recent_rate() -> None:
    clock = Clock()
    gate = admission(clock, max_active=2)
    starts = Starts(gate)
    await starts.queue("a", "t", "a")
    clock.now += 4.0
    await starts.release("a")  # a mean active time of 4 s
    await starts.queue("b", "t", "b")
    await starts.queue("c", "t", "c")
    await starts.queue("d", "t", "d")  # waits
    assert gate.mean_active_s == 4.0
    # One turn ahead of a new session's (same tag 0, earlier), the new one itself: 2 x 4 s / 2 slots.
    assert gate.predicted_wait_s("t", 0.0, 10**9) == pytest.approx(4.0)
    # A tag below every waiting turn's: only itself.
    assert gate.predicted_wait_s("t", -1.0, 0) == pytest.approx(2.0)


async def test_a_limit_just_lowered_does_not_stretch_the_interval_between_starts() -> None:
    # Four turns ran side by side for 1 s each: about four starts a second at saturation. The loop-lag limiter then
    # lowers the limit to 2 for a tick; the turns already ran at four, so the interval stays near 1/4 s (divided by
    # the new limit it was 1/2 s, and every shed turn was told to come back twice as late as its start).
    clock = Clock()
    gate = admission(clock, max_active=4)
    starts = Starts(gate)
    for label in "abcd":
        await starts.queue(label, "t", label)
    clock.now += 1.0
    for label in "abcd":
        await starts.release(label)
    gate.set_limit(2)
    assert gate.mean_active_s == pytest.approx(1.0)
    assert gate.per_start_s() == pytest.approx(0.25, rel=0.05)
    # A limit above the concurrency the turns had (fewer turns than slots) counts: it is what saturation would run.
    gate.set_limit(8)
    assert gate.per_start_s() == pytest.approx(1.0 / 8)


async def one_running_one_queued(max_wait_s: float = 1.5) -> tuple[FairAdmission, Starts]:
    """One slot, a mean active time of 1 s, turn b running and c queued: a new turn would wait 2 s, past the
    1.5 s bound."""
    clock = Clock()
    gate = admission(clock, max_active=1, max_wait_s=max_wait_s)
    starts = Starts(gate)
    await starts.queue("a", "t", "a")
    clock.now += 1.0
    await starts.release("a")  # mean active time 1 s
    await starts.queue("b", "t", "b")  # running
    await starts.queue("c", "t", "c")  # predicted 1 s: queued
    return gate, starts


async def test_a_turn_past_the_bound_is_shed_at_once_with_503_when_no_tenant_is_over_its_share() -> None:
    gate, _ = await one_running_one_queued()
    assert gate.waiting == 1
    with pytest.raises(Saturated) as shed:
        await gate.enter("t", "d", 100)  # predicted 2 s > 1.5 s
    assert shed.value.status_code == 503
    assert shed.value.code == "gateway_saturated"
    # Its start comes after c's (1 s from now) and one turn start more; it is told to come back half the bound before.
    assert shed.value.retry_after_s == pytest.approx(1.25)
    assert shed.value.headers() == {"Retry-After": "2", "retry-after-ms": "1250"}
    assert gate.stats()["shed_503"] == 1
    assert (gate.active, gate.waiting) == (1, 1)  # nothing already accepted was dropped


async def test_a_session_back_on_time_is_not_shed_again_while_the_queue_is_near_the_bound() -> None:
    gate, starts = await one_running_one_queued(max_wait_s=1.8)
    with pytest.raises(Saturated) as shed:
        await gate.enter("t", "d", 100)  # predicted 2 s > 1.8 s
    # Back after its Retry-After, the queue as long (2.5 s at the start rate measured since: within 1.5 x the
    # bound): this time it waits its turn instead.
    clock = gate._clock
    assert isinstance(clock, Clock)
    clock.now += shed.value.retry_after_s
    await starts.queue("d-again", "t", "d")
    assert (gate.active, gate.waiting) == (1, 2)
    assert gate.stats()["shed_503"] == 1
    with pytest.raises(Saturated):  # another session's turn is shed as before
        await gate.enter("t", "e", 100)
    await starts.release("b")
    await starts.release("c")
    await starts.release("d-again")  # d's turn was served: its next one may be shed again
    await starts.queue("f", "t", "f")  # running
    await starts.queue("g", "t", "g")  # queued
    with pytest.raises(Saturated):
        await gate.enter("t", "d", 100)


async def test_a_tenant_over_its_fair_share_gets_429_and_another_tenant_503() -> None:
    clock = Clock()
    gate = admission(clock, max_active=2, max_wait_s=1.0)
    starts = Starts(gate)
    await starts.queue("warm", "big", "warm")
    clock.now += 1.0
    await starts.release("warm")  # mean active time 1 s
    await starts.queue("small-1", "small", "s0")  # running
    await starts.queue("big-1", "big", "b1")  # running
    await starts.queue("big-2", "big", "b2")  # waiting: predicted (0 + 1) x 1 s / 2 = 0.5 s
    await starts.queue("big-3", "big", "b3")  # 1.0 s: still within the bound
    assert (gate.active, gate.waiting) == (2, 2)
    with pytest.raises(RateLimited) as over:
        await gate.enter("big", "b4", 100)  # 1.5 s; the big tenant holds 3 of 4 turns, its share is 1/2
    assert over.value.status_code == 429
    assert over.value.code == "fair_share_exceeded"
    # The small tenant's next turn goes ahead of most of big's: (0 own + 1 of big's + 1) x 1 s / 2 = 1 s, admitted.
    await starts.queue("small-2", "small", "s2")
    assert gate.waiting == 3
    # Its third would wait (1 own + 2 of big's + 1) x 1 s / 2 = 2 s; it holds 2 of 5 turns (under its half): the
    # gateway is saturated, the tenant not over its share.
    with pytest.raises(Saturated):
        await gate.enter("small", "s3", 100)


async def test_a_sessions_only_turn_that_waited_twice_the_bound_starts_ahead_of_the_order() -> None:
    clock = Clock()
    gate = admission(clock, max_wait_s=1.0)
    starts = Starts(gate)
    await starts.queue("hold", "t", "hold")  # no mean yet: nothing is shed
    await starts.queue("rich", "t", "rich")
    await starts.release("hold", tokens=10)
    await starts.release("rich", tokens=10_000)  # the rich session has much service
    await starts.queue("hold-2", "t", "hold")
    await starts.queue("rich-2", "t", "rich")
    clock.now += 2.5  # past twice the bound
    await starts.queue("new", "t", "new")  # less service, but arrived later
    await starts.release("hold-2")
    assert starts.order[-1] == "rich-2"


async def test_a_floods_further_turns_do_not_start_ahead_when_overdue() -> None:
    clock = Clock()
    gate = admission(clock, max_wait_s=1.0)
    starts = Starts(gate)
    await starts.queue("hold", "t", "hold")
    await starts.queue("f-1", "t", "flood")  # the session's only turn: may start ahead once overdue
    await starts.queue("f-2", "t", "flood")  # its second: never ahead of the order
    clock.now += 2.5
    await starts.queue("new", "t", "new")
    await starts.release("hold")
    await starts.release("f-1")
    await starts.release("new")
    assert starts.order == ["hold", "f-1", "new", "f-2"]


async def test_idle_sessions_are_forgotten_once_their_service_decayed() -> None:
    clock = Clock()
    gate = admission(clock, max_active=4)
    for k in range(100):
        slot = await gate.enter("t", f"s{k}", 100)
        slot.release(100)
    assert gate.stats()["sessions"] == 100
    clock.now += 30 * 8  # 100 tokens decay below one in 7 half-lives
    slot = await gate.enter("t", "fresh", 10)
    assert gate.stats()["sessions"] == 1
    slot.release(10)


async def test_idle_sessions_no_heavier_than_the_virtual_time_are_forgotten() -> None:
    clock = Clock()
    gate = admission(clock)
    starts = Starts(gate)
    await starts.queue("h1", "t", "h")  # h: 100
    await starts.queue("x1", "t", "x")  # tag 0; x: 100
    await starts.queue("h2", "t", "h")  # tag 100
    await starts.release("h1", tokens=100)
    await starts.release("x1", tokens=100)  # h2 starts: the virtual time is 100, x's service
    clock.now += 30
    await starts.queue("new", "t", "new")  # sweeps: x is idle at the virtual time; h has a turn running
    assert gate.stats()["sessions"] == 2


async def test_renormalising_keeps_the_order() -> None:
    clock = Clock()
    gate = admission(clock)
    starts = Starts(gate)
    await starts.queue("heavy", "t", "heavy")
    await starts.release("heavy", tokens=10_000)
    await starts.queue("light", "t", "light")
    await starts.release("light", tokens=10)
    await starts.queue("hold", "t", "hold")
    await starts.queue("heavy-2", "t", "heavy")
    await starts.queue("light-2", "t", "light")
    clock.now += 30 * 300  # past the renormalisation point, while both wait
    await starts.queue("last", "t", "last-session")  # arrives after the renormalisation
    await starts.release("hold", tokens=0)
    # "last" is new (no service) and goes first; then light beats heavy, as before the renormalisation.
    assert starts.order[-1] == "last"
    await starts.release("last")
    assert starts.order[-1] == "light-2"


async def test_no_limit_means_no_queue() -> None:
    gate = FairAdmission(AdmissionConfig(max_active=0, max_wait_s=2.0, half_life_s=30.0))
    slots = [await gate.enter("t", f"s{k}", 1) for k in range(1000)]
    assert (gate.active, gate.waiting) == (0, 0)
    for slot in slots:
        slot.release(1)


async def test_shed_turns_are_told_to_come_back_one_turn_start_apart() -> None:
    gate, _ = await one_running_one_queued()  # one slot, 1 s a turn: a start a second
    waits = []
    for session in ("d", "e", "f"):
        with pytest.raises(Saturated) as shed:
            await gate.enter("t", session, 100)
        waits.append(shed.value.retry_after_s)
    # d's start after c's, e's after d's, f's after e's, a start apart; each told to come back 0.75 s before it.
    assert waits == pytest.approx([1.25, 2.25, 3.25])
    assert len(gate.calendar) == 3
    assert gate.stats()["shed_503"] == 3


async def test_returns_promised_within_the_bound_count_as_queued_ahead() -> None:
    clock = Clock()
    gate = admission(clock, max_active=1, max_wait_s=3.5)
    starts = Starts(gate)
    await starts.queue("a", "t", "a")
    clock.now += 1.0
    await starts.release("a")  # 1 s a turn
    await starts.queue("b", "t", "b")  # running
    for label in ("c", "d", "e"):  # predicted 1, 2 and 3 s: queued
        await starts.queue(label, "t", label)
    with pytest.raises(Saturated) as shed:
        await gate.enter("t", "f", 100)  # 4 s: shed
    # Its start after e's (3 s from now) and one more, less half the bound: back in 2.25 s, within the bound.
    assert shed.value.retry_after_s == pytest.approx(2.25)
    starts.tasks["d"].cancel()  # d's client went away: two turns wait
    await asyncio.sleep(0)
    assert gate.waiting == 2
    # A new turn would wait for c and e and itself: 3 s, within the bound; with f counted ahead, 4 s: shed.
    assert gate.predicted_wait_s("t", 10**9, 10**9) == pytest.approx(3.0)
    with pytest.raises(Saturated):
        await gate.enter("t", "g", 100)
    assert gate.waiting == 2


async def test_turns_queued_and_returns_promised_take_the_same_starts() -> None:
    """A return is told to come after the real queue and the returns already promised: a queue built before the
    first refusal drains, and a turn that still queues (another tenant's, predicted a short wait) pushes the
    returns on."""
    clock = Clock()
    gate = admission(clock, max_active=1, max_wait_s=2.0)
    starts = Starts(gate)
    for label in ("a", "b", "c", "d", "e", "f"):  # a runs; before any turn ended nothing is shed: 5 queue
        await starts.queue(label, "t", label)
    clock.now += 1.0
    await starts.release("a")  # 1 s a turn; b starts, four wait
    assert gate.waiting == 4
    with pytest.raises(Saturated) as first:
        await gate.enter("t", "g", 100)
    # After the four queued (4 s) and its own start, less half the bound.
    assert first.value.retry_after_s == pytest.approx(4.0)
    await starts.queue("light", "u", "light")  # the other tenant: one of t's turns, then it (2 s): queued
    assert gate.waiting == 5
    with pytest.raises(RateLimited) as second:  # t holds 5 of the 6 turns now, over its half
        await gate.enter("t", "h", 100)
    # One start more for the turn that queued meanwhile, and g's return ahead of it, at the rate returns may take
    # (nine tenths of the start rate measured while turns waited: 1 a second).
    assert gate.returns_per_s() == pytest.approx(0.9)
    assert second.value.retry_after_s == pytest.approx(first.value.retry_after_s + 1.0 + 1 / 0.9)


async def test_a_session_back_early_is_told_again_and_keeps_its_place() -> None:
    gate, starts = await one_running_one_queued(max_wait_s=1.8)
    clock = gate._clock
    assert isinstance(clock, Clock)
    with pytest.raises(Saturated) as first:
        await gate.enter("t", "d", 100)
    with pytest.raises(Saturated) as later:
        await gate.enter("t", "e", 100)
    assert (first.value.retry_after_s, later.value.retry_after_s) == pytest.approx((1.1, 2.1))
    clock.now += 0.5
    with pytest.raises(Saturated) as early:  # d half a second in: the rest of its wait, the same return time
        await gate.enter("t", "d", 100)
    assert early.value.retry_after_s == pytest.approx(0.6)
    assert len(gate.calendar) == 2  # no new promise: e's return is still a second after d's
    clock.now += 0.6
    await starts.queue("d-on-time", "t", "d")  # on time: queued, though the queue is as long as it was
    assert gate.waiting == 2
    assert len(gate.calendar) == 1


async def test_a_return_on_time_to_a_queue_far_past_the_bound_is_told_again_keeping_its_place() -> None:
    gate, starts = await one_running_one_queued()  # bound 1.5 s, a start a second
    clock = gate._clock
    assert isinstance(clock, Clock)
    with pytest.raises(Saturated) as first:
        await gate.enter("t", "d", 100)
    with pytest.raises(Saturated):
        await gate.enter("t", "e", 100)  # promised after d's: a second later
    clock.now += first.value.retry_after_s
    # d is back on time, but the gateway started one turn in 1.25 s since: c and d's own start take 2.5 s, past 1.5
    # times the bound. Told again: when c and its own start will have gone, less the cushion, with e's return (due a
    # second from now, promised after d's) not counted ahead of it; nothing queued.
    with pytest.raises(Saturated) as again:
        await gate.enter("t", "d", 100)
    assert gate.per_start_s() == pytest.approx(1.25)
    assert again.value.retry_after_s == pytest.approx(2.5 - 0.75)
    assert gate.waiting == 1
    assert len(gate.calendar) == 2  # d's new return and e's
    assert gate.stats()["shed_503"] == 3
    # Back on time again, the queue now short (c started): queued.
    await starts.release("b")
    clock.now += again.value.retry_after_s
    await starts.queue("d-at-last", "t", "d")
    assert (gate.active, gate.waiting) == (1, 1)


async def test_a_return_time_is_forgotten_once_twice_the_bound_and_a_second_overdue() -> None:
    gate, _ = await one_running_one_queued()  # bound 1.5 s: grace 4 s
    clock = gate._clock
    assert isinstance(clock, Clock)
    with pytest.raises(Saturated) as shed:
        await gate.enter("t", "d", 100)
    assert gate.calendar.due_before(clock.now, clock.now + 10.0, "t") == 1
    clock.now += shed.value.retry_after_s + 3.9
    assert gate.calendar.due_before(clock.now, clock.now + 10.0, "t") == 1
    clock.now += 0.2
    assert gate.calendar.due_before(clock.now, clock.now + 10.0, "t") == 0
    # d comes back far too late: a first try again, shed as any other would be.
    with pytest.raises(Saturated):
        await gate.enter("t", "d", 100)


def test_the_calendar_spaces_promises_and_forgets_stale_ones() -> None:
    calendar = RetryCalendar(grace_s=1.0, cushion_s=0.5)
    first = calendar.promise(0.0, 1.0, 1, "t")  # after one waiting turn, its start by 2: back half a second before
    second = calendar.promise(0.0, 1.0, 1, "t")  # and the first's return
    third = calendar.promise(0.0, 1.0, 9, "t")  # the queue grew: after it
    assert (first.due, second.due, third.due) == (1.5, 2.5, 11.5)
    assert calendar.due_before(0.0, 2.5, "t") == 2
    calendar.redeem(first)
    calendar.redeem(first)  # twice: no harm
    assert calendar.due_before(0.0, 2.5, "t") == 1
    assert calendar.expected(second, 3.5)
    assert not calendar.expected(second, 3.6)
    assert calendar.due_before(3.6, 30.0, "t") == 1  # second forgotten, third left
    assert calendar.horizon_s(3.6) == pytest.approx(7.9)
    assert calendar.promise(50.0, 1.0, 0, "u").due == 50.5  # long after: third forgotten, from now
    assert calendar.expected_count(50.0) == 1
    calendar.sweep(50.0)
    assert calendar.due_before(50.0, 100.0, "t") == 0
    assert calendar.due_before(50.0, 100.0, "u") == 1
    assert calendar.expected_count(10**7) == 0  # a long idle: everything forgotten, the slots too
    assert calendar.promise(10**7, 1.0, 0, "t").due == 10**7 + 0.5


async def test_admitted_turns_waits_are_counted_in_buckets() -> None:
    clock = Clock()
    gate = admission(clock, max_active=1)
    starts = Starts(gate)
    await starts.queue("a", "t", "a")  # at once: no wait
    await starts.queue("b", "t", "b")
    clock.now += 1.5
    await starts.release("a")  # b starts after 1.5 s
    cumulative = dict(gate.waits.cumulative())
    assert (cumulative["0.005"], cumulative["1.0"], cumulative["2.0"], cumulative["+Inf"]) == (1, 1, 2, 2)
    assert gate.waits.total_s == pytest.approx(1.5)

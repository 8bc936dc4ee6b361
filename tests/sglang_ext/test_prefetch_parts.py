"""The pure parts behind prefetch and the load report: rate meter, device quota, prefetch book, KV fate."""

from __future__ import annotations

import pytest

from sessiongate.sglang_ext.kv_budget import DemandItem, device_prefetch_quota
from sessiongate.sglang_ext.kv_fate import LOWEST_PRIORITY, KVFate
from sessiongate.sglang_ext.prefetch_book import PrefetchBook, PrefetchRecord
from sessiongate.sglang_ext.rate_meter import RateMeter


def test_rate_over_the_window() -> None:
    meter = RateMeter(window_s=2.0)
    for step in range(11):
        meter.observe(100.0 + step * 0.5, step * 50)  # 100 tokens per second
    assert meter.rate(105.0) == pytest.approx(100.0, rel=0.01)


def test_rate_falls_to_zero_after_the_work_stops() -> None:
    meter = RateMeter(window_s=2.0)
    meter.observe(0.0, 0)
    meter.observe(1.0, 100)
    assert meter.rate(1.0) > 0
    for step in range(2, 8):
        meter.observe(float(step), 100)  # no new tokens
    assert meter.rate(7.0) == 0.0
    assert meter.rate(20.0) == 0.0


def test_a_meter_on_a_busy_clock_gives_the_speed_while_working_and_holds_it() -> None:
    # The engine's prefill counters, sampled every 50 ms: 10 ms of prefill at 10,000 tokens/s twice a second.
    meter = RateMeter(window_s=2.0)
    busy_s, total = 0.0, 0
    for sample in range(200):
        if sample % 10 == 0:
            busy_s, total = busy_s + 0.01, total + 100
        meter.observe(busy_s, total)
    assert meter.clock == pytest.approx(0.2)
    assert meter.rate(meter.clock) == pytest.approx(10_000.0)  # on wall time it would read 200
    samples = len(meter._samples)
    for _ in range(100):  # a long idle spell: the rate holds and the meter keeps no new samples
        meter.observe(busy_s, total)
    assert meter.rate(meter.clock) == pytest.approx(10_000.0)
    assert len(meter._samples) == samples


def test_rate_needs_two_samples_and_survives_a_counter_reset() -> None:
    meter = RateMeter()
    assert meter.rate(0.0) == 0.0
    meter.observe(0.0, 1000)
    assert meter.rate(0.0) == 0.0
    meter.observe(1.0, 10)  # the counter was reset
    assert meter.rate(1.0) == 0.0
    meter.observe(2.0, 110)
    assert meter.rate(2.0) == pytest.approx(100.0)


def test_quota_leaves_room_for_running_and_queued_work() -> None:
    demand = [DemandItem(pending_tokens=300), DemandItem(pending_tokens=200)]
    assert device_prefetch_quota(free_tokens=4096, demand=demand, page_size=64) == (4096 - 500) // 64 * 64
    assert device_prefetch_quota(free_tokens=400, demand=demand, page_size=64) == 0
    assert device_prefetch_quota(free_tokens=100, demand=[], page_size=64) == 64
    assert device_prefetch_quota(free_tokens=1000, demand=[DemandItem(-5)], page_size=64) == 960


def record(prefetch_id: str, state: str = "running") -> PrefetchRecord:
    return PrefetchRecord(
        prefetch_id=prefetch_id,
        session_id="s",
        target="device",
        tokens=10,
        priority=0,
        ttl_ms=1000,
        created_at=0.0,
        state=state,  # type: ignore[arg-type]
    )


def test_book_forgets_the_oldest_finished_records_only() -> None:
    book = PrefetchBook(keep_finished=2)
    book.put(record("running-1"))
    for index in range(4):
        book.put(record(f"done-{index}", "done"))
    assert "running-1" in book
    assert "done-0" not in book
    assert "done-1" not in book
    assert "done-2" in book
    assert "done-3" in book
    assert book.in_flight() == 1
    assert [item.prefetch_id for item in book.unfinished()] == ["running-1"]


def test_records_are_replaced_not_changed() -> None:
    book = PrefetchBook()
    first = record("p")
    book.put(first)
    book.put(first.updated(state="done", pages_on_device=3))
    stored = book.get("p")
    assert stored is not None
    assert stored.finished
    assert stored.pages_on_device == 3
    assert first.state == "running"
    assert book.get("missing") is None


class Node:
    """What KVFate reads of a radix-tree node."""

    def __init__(self, priority: int, last_access_time: float) -> None:
        self.priority = priority
        self.last_access_time = last_access_time


def test_fate_ranks_drops_then_priority_then_live_hints_last() -> None:
    fate = KVFate()
    used = Node(priority=1, last_access_time=1.0)
    hint = Node(priority=LOWEST_PRIORITY, last_access_time=2.0)  # a host insert under the root
    low = Node(priority=0, last_access_time=3.0)
    fate.mark_prefetched([hint], priority=1, ttl_s=10.0, now=0.0)
    assert hint.priority == 1  # takes the prefetch's priority as its own
    order = sorted([used, hint, low], key=lambda node: fate.eviction_rank(node, now=1.0))
    assert order == [low, used, hint]  # within one priority, what a live hint expects goes last
    # Past its ttl the unused prefetch goes first of all.
    assert sorted([used, hint, low], key=lambda node: fate.eviction_rank(node, now=10.0)) == [hint, low, used]
    fate.doom([used])
    assert sorted([used, hint, low], key=lambda node: fate.eviction_rank(node, now=1.0))[0] is used
    fate.pardon_all()
    assert fate.eviction_rank(used, now=1.0)[0] == 1


def test_fate_decays_unused_prefetches_and_ends_holds() -> None:
    fate = KVFate()
    hint = Node(priority=0, last_access_time=5.0)
    fate.mark_prefetched([hint], priority=7, ttl_s=2.0, now=0.0)
    assert fate.effective_priority(hint, now=1.0) == 7
    assert fate.effective_priority(hint, now=2.0) == LOWEST_PRIORITY
    fate.sweep(now=3.0)
    assert fate.effective_priority(hint, now=3.0) == LOWEST_PRIORITY  # still unused: stays marked
    hint.last_access_time = 6.0  # a request matched it
    assert not fate.is_unused_prefetch(hint)
    assert fate.effective_priority(hint, now=3.0) == 7  # its own now
    fate.sweep(now=3.0)
    assert fate.counts() == {"prefetched": 0, "held": 0}

    session = Node(priority=1, last_access_time=1.0)
    fate.hold([session], priority=4, ttl_s=1.0, now=0.0)
    assert fate.effective_priority(session, now=0.5) == 4
    assert fate.effective_priority(session, now=1.0) == 1
    fate.sweep(now=1.0)
    assert fate.counts()["held"] == 0


def test_fate_forgets_nodes_the_tree_deleted() -> None:
    fate = KVFate()
    fate.hold([Node(priority=1, last_access_time=0.0)], priority=2, ttl_s=60.0, now=0.0)
    assert fate.counts()["held"] == 0  # held weakly: the node is gone


def test_a_prefetch_may_evict_lower_priorities_and_unhinted_kv_of_its_own_not_live_hints() -> None:
    fate = KVFate()
    lower = Node(priority=0, last_access_time=1.0)
    idle = Node(priority=1, last_access_time=2.0)
    hinted = Node(priority=1, last_access_time=3.0)
    retained = Node(priority=1, last_access_time=4.0)
    higher = Node(priority=2, last_access_time=5.0)
    fate.mark_prefetched([hinted], priority=1, ttl_s=10.0, now=0.0)
    fate.hold([retained], priority=1, ttl_s=5.0, now=0.0)
    may = [node for node in (lower, idle, hinted, retained, higher) if fate.ranks_below(node, priority=1, now=1.0)]
    assert may == [lower, idle]
    assert [fate.rank_class(node, 1.0) for node in (lower, idle, hinted)] == ["unhinted", "unhinted", "hinted"]
    # The prefetch expects its request at once, the retain by its deadline: the retain goes first. An ended hint
    # is no hint.
    assert sorted([hinted, retained], key=lambda node: fate.eviction_rank(node, now=1.0)) == [retained, hinted]
    assert fate.ranks_below(retained, priority=1, now=6.0)
    assert fate.ranks_below(hinted, priority=1, now=11.0)
    assert fate.rank_class(hinted, 11.0) == "expired_hint"


def test_among_live_hints_the_one_expected_last_goes_first() -> None:
    # Belady's rule on what the hints say: many typing hints and little memory must keep the session whose user
    # started first (its turn is the next to come), not the newest hint's.
    fate = KVFate()
    oldest, newer, newest = (Node(priority=1, last_access_time=t) for t in (1.0, 2.0, 3.0))
    fate.mark_prefetched([oldest], priority=1, ttl_s=30.0, now=0.0)
    fate.mark_prefetched([newer], priority=1, ttl_s=30.0, now=1.0)
    fate.mark_prefetched([newest], priority=1, ttl_s=30.0, now=2.0)
    order = sorted([oldest, newer, newest], key=lambda node: fate.eviction_rank(node, now=5.0))
    assert order == [newest, newer, oldest]
    # A hint whose request is overdue is still the nearest: it keeps its pages until its ttl.
    assert sorted([oldest, newest], key=lambda node: fate.eviction_rank(node, now=29.0)) == [newest, oldest]
    assert sorted([oldest, newest], key=lambda node: fate.eviction_rank(node, now=30.5)) == [oldest, newest]

    # The gateway's own estimate (a tool's predicted return) places a hint later than one made after it.
    tool = Node(priority=1, last_access_time=4.0)
    fate.mark_prefetched([tool], priority=1, ttl_s=60.0, now=3.0, expected_at=40.0)
    assert sorted([tool, newest], key=lambda node: fate.eviction_rank(node, now=5.0)) == [tool, newest]
    # A prefetch may displace a live hint of its priority expected after its own request, never one before it.
    assert fate.ranks_below(tool, priority=1, now=5.0, expected_at=5.0)
    assert not fate.ranks_below(oldest, priority=1, now=5.0, expected_at=5.0)
    assert not fate.ranks_below(tool, priority=1, now=5.0)  # no time given: live hints are spared


def test_an_ended_hint_decays_at_once_and_leaves_another_prefetchs_marks() -> None:
    fate = KVFate()
    brought = Node(priority=LOWEST_PRIORITY, last_access_time=1.0)
    there = Node(priority=1, last_access_time=2.0)
    shared = Node(priority=1, last_access_time=3.0)
    marks = fate.mark_prefetched([brought, shared], priority=2, ttl_s=30.0, now=0.0)
    marks += fate.mark_prefetched([there], priority=2, ttl_s=30.0, now=0.0, brought=False)
    fate.mark_prefetched([shared], priority=2, ttl_s=30.0, now=1.0)  # another session's hint shares this page
    fate.end_hint(marks, now=2.0)
    assert fate.effective_priority(brought, now=2.0) == LOWEST_PRIORITY  # a wrong hint's page
    assert fate.rank_class(brought, now=2.0) == "expired_hint"
    assert fate.eviction_rank(there, now=2.0)[1:3] == (2, 0)  # its own priority (raised by the insert), unhinted
    assert fate.eviction_rank(shared, now=2.0)[1:3] == (2, 1)  # still the other hint's


def test_the_quota_counts_evictable_kv_below_the_prefetch_beyond_the_reserve() -> None:
    demand = [DemandItem(300), DemandItem(200)]
    assert device_prefetch_quota(free_tokens=400, demand=demand, page_size=64) == 0
    assert device_prefetch_quota(free_tokens=400, demand=demand, page_size=64, evictable_tokens=1000) == 896
    assert device_prefetch_quota(free_tokens=0, demand=[], page_size=64, evictable_tokens=100) == 64


def test_evictable_kv_is_classed_in_eviction_order() -> None:
    from sessiongate.sglang_ext.internals.kv_ops import Evictable

    evictable = Evictable(tokens=448, by_class=[("expired_hint", 64), ("unhinted", 128), ("unhinted", 256)])
    assert evictable.classes_of_first(128) == {"expired_hint": 64, "unhinted": 64}
    assert evictable.classes_of_first(0) == {}
    assert evictable.classes_of_first(10_000) == {"expired_hint": 64, "unhinted": 384}

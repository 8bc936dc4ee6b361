"""What keeps long contexts' work off SGLang's scheduler thread (issue 28, part 5), without a server.

The token ids and page hashes a call carries in compact forms (`call_payload`); pool deletions on the janitor's
thread, their outcome asked for without waiting (`pool_janitor`); the race guard's compare decided once per
request (`load_guard._agree`); the eviction key's fast path for unmarked nodes (`kv_ops._FateOrder`), which must
rank exactly as the full look-up. The drop's whole path on SGLang's real cache classes: test_kv_ops.py; through a
real worker's HTTP endpoints: test_prefetch_engine.py.
"""

from __future__ import annotations

import threading
import time
from array import array
from types import SimpleNamespace

import pytest

from sessiongate.sglang_ext.call_payload import pack_hashes, pack_tokens, unpack_hashes, unpack_tokens
from sessiongate.sglang_ext.kv_fate import LOWEST_PRIORITY, KVFate
from sessiongate.sglang_ext.pool_janitor import KEPT_OUTCOMES, PoolJanitor


def test_a_context_travels_as_bytes_and_one_string() -> None:
    tokens = [0, 1, 49_151, 2**40, 7] * 1000
    assert unpack_tokens(pack_tokens(tokens)) == array("q", tokens)
    assert unpack_tokens(pack_tokens(array("q", tokens))) == array("q", tokens)
    assert unpack_tokens(b"") == array("q")
    hashes = ["ab" * 32, "cd" * 32]
    assert unpack_hashes(pack_hashes(hashes)) == hashes
    assert unpack_hashes(pack_hashes([])) == []


def test_deletions_run_in_order_off_the_callers_thread_and_are_never_waited_for() -> None:
    janitor = PoolJanitor()
    release = threading.Event()
    ran: list[str] = []

    def slow() -> set[str]:
        release.wait(10)
        ran.append("slow")
        return {"a", "b"}

    def fast() -> set[str]:
        ran.append("fast")
        return {"c"}

    started = time.monotonic()
    first, second = janitor.submit(slow), janitor.submit(fast)
    assert time.monotonic() - started < 0.5  # submitting does not wait for the file system
    assert janitor.outcome(first) is None  # still running: answered at once
    assert janitor.outcome(second) is None  # queued behind it, never dropped
    release.set()
    deadline = time.monotonic() + 10
    while (outcome := janitor.outcome(second)) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert outcome == {"c"}
    assert ran == ["slow", "fast"]
    assert janitor.outcome(first) == {"a", "b"}
    assert janitor.outcome(first) == set()  # asked once: forgotten


def test_a_failed_deletion_and_forgotten_tickets_answer_nothing_deleted() -> None:
    janitor = PoolJanitor()

    def broken() -> set[str]:
        raise OSError("the pool's disk is gone")

    ticket = janitor.submit(broken)
    deadline = time.monotonic() + 10
    while (outcome := janitor.outcome(ticket)) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert outcome == set()
    tickets = [janitor.submit(set) for _ in range(KEPT_OUTCOMES + 5)]
    assert janitor.outcome(tickets[0]) == set()  # forgotten: nobody asked for it in time
    janitor.close()


def test_the_race_guard_compares_the_first_loaded_page_then_the_prefix(cpu_compat: bool) -> None:
    from sessiongate.sglang_ext.internals.load_guard import _agree

    page = 64
    context = array("q", range(10, 10 + 8 * page))
    request = [*context, 1, 2, 3]
    assert _agree(request, context, 7 * page, 8 * page)
    other_page = [*request]
    other_page[7 * page + 3] = 99_999
    assert not _agree(other_page, context, 7 * page, 8 * page)
    other_prefix = [*request]
    other_prefix[5] = 99_999  # the same loaded page after another beginning: another path in the tree
    assert not _agree(other_prefix, context, 7 * page, 8 * page)


class _Node:
    """What the fate reads of a tree node (weakly referenced, as SGLang's nodes are)."""

    def __init__(self, priority: int, last_access_time: float = 0.0) -> None:
        self.priority = priority
        self.last_access_time = last_access_time


def _node(priority: int, last_access_time: float = 0.0) -> _Node:
    return _Node(priority, last_access_time)


def test_the_eviction_keys_fast_path_ranks_as_the_full_look_up() -> None:
    from sessiongate.sglang_ext.internals.kv_ops import _FateOrder

    base = SimpleNamespace(get_priority=lambda node: (node.priority, node.last_access_time))
    fate = KVFate()
    now = 100.0
    order = _FateOrder(base, fate, lambda: now)
    plain, prefetched, held, doomed, expired = (_node(p) for p in (1, 1, 1, 2, 3))
    fate.mark_prefetched([prefetched], priority=2, ttl_s=10, now=now)
    fate.hold([held], priority=5, ttl_s=10, now=now)
    fate.doom([doomed])
    fate.mark_prefetched([expired], priority=2, ttl_s=10, now=now - 20)
    nodes = [plain, prefetched, held, doomed, expired]
    assert not fate.might_be_marked(plain)
    assert all(fate.might_be_marked(node) for node in nodes[1:])

    def full(node: _Node) -> tuple[object, ...]:
        return (*fate.eviction_rank(node, now), base.get_priority(node))

    assert [order.get_priority(node) for node in nodes] == [full(node) for node in nodes]
    assert order.get_priority(expired)[1] == LOWEST_PRIORITY
    assert order.get_priority(doomed)[0] == 0
    fate.pardon_all()
    now += 20  # the hold and the prefetch's ttl pass; the sweep forgets what no longer ranks
    fate.sweep(now)
    assert [order.get_priority(node) for node in nodes] == [full(node) for node in nodes]
    assert not fate.might_be_marked(held)
    assert not fate.might_be_marked(doomed)
    assert fate.might_be_marked(prefetched)  # unused past its ttl: its mark keeps it at the lowest priority


@pytest.mark.parametrize("marked", [False, True])
def test_ranking_many_unmarked_leaves_skips_the_fates_tables(marked: bool) -> None:
    from sessiongate.sglang_ext.internals.kv_ops import _FateOrder

    calls = 0

    def clock() -> float:
        nonlocal calls
        calls += 1
        return 0.0

    fate = KVFate()
    order = _FateOrder(SimpleNamespace(get_priority=lambda node: 0), fate, clock)
    nodes = [_node(1) for _ in range(1000)]
    if marked:
        fate.hold(nodes[:10], priority=2, ttl_s=10, now=0.0)
    for node in nodes:
        order.get_priority(node)
    assert calls == (10 if marked else 0)  # only marked nodes read the clock and the tables

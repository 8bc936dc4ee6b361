"""A prefetch asked for the instant a session's turn ended on another worker waits for that turn's pages to reach
the pool (issue 27: a hint right after a turn finds that turn's KV)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sessiongate.gateway.advisor.prefetch import AWAIT_POOL_MS, RECENT_TURN_S, Prefetcher
from sessiongate.gateway.routing import KVBelief


def _prefetcher(belief: KVBelief, now: list[float]) -> Prefetcher:
    unused: Any = None
    return Prefetcher(
        store=unused,
        extension=unused,
        router=SimpleNamespace(belief=belief),  # type: ignore[arg-type]
        stats=unused,
        replicas=unused,
        tools=unused,
        cache_salt_for=None,
        poll_interval_s=0.1,
        clock=lambda: now[0],
        unix=lambda: now[0],
    )


def test_only_a_prefetch_elsewhere_right_after_a_turn_waits_for_the_pool() -> None:
    belief = KVBelief()
    now = [100.0]
    prefetcher = _prefetcher(belief, now)
    assert prefetcher._await_pool_ms("s", "b") == 0  # no turn yet: nothing on its way
    belief.after_turn("s", "a", prompt_tokens=900, completion_tokens=20, details=None, now=100.0, writes_to_pool=True)
    assert prefetcher._await_pool_ms("s", "b") == AWAIT_POOL_MS  # the same event-loop step as the turn's end
    assert prefetcher._await_pool_ms("s", "a") == 0  # the worker that ran the turn holds it in its own tiers
    now[0] = 100.0 + RECENT_TURN_S + 0.1
    assert prefetcher._await_pool_ms("s", "b") == 0  # long written by now

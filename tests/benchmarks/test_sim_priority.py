"""The simulator's priority-based KV memory (issue 27): a live advisory's prefetch ranks above unhinted KV and may
evict it, never what requests hold or need; ranks decay with their advisory; and the oracle's hints."""

from __future__ import annotations

import dataclasses

import pytest

from sessiongate.benchmarks.metrics import TurnRecord
from sessiongate.benchmarks.sim import simulate
from sessiongate.benchmarks.sim.cluster import oracle_hints, oracle_lead_s
from sessiongate.benchmarks.sim.engine import EventLoop, Request, SharedPool, SimWorker, _Tier
from sessiongate.benchmarks.workloads import HintModel, SessionTrace, Turn

from .test_sim import SIMPLE
from .test_sim_toolkv import _prefetch_times


def _worker(device: int, host: int = 10_000) -> tuple[SimWorker, SharedPool, list[Request]]:
    cal = dataclasses.replace(SIMPLE, device_kv_tokens=device, host_kv_tokens=host)
    pool = SharedPool(100_000)
    done: list[Request] = []
    worker = SimWorker(
        "w00",
        cal,
        EventLoop(),
        host_tier=True,
        pool=pool,
        on_done=done.append,
        bytes_moved={"pool->host": 0, "host->device": 0},
    )
    return worker, pool, done


def test_a_ranked_prefetch_evicts_an_idle_unhinted_session_and_an_unranked_one_does_not() -> None:
    worker, pool, _ = _worker(device=300)
    worker.cached.put("idle", 250)  # an idle session's KV fills the device: nothing is free
    pool.put("hinted", 200)
    free_only = worker.prefetch("hinted", "device")
    assert (free_only.on_device, free_only.in_host) == (0, 200)  # the old rule: host only, nothing evicted
    assert list(worker.cached.entries) == ["idle"]

    ranked = worker.prefetch("hinted", "device", rank_until=30.0)
    assert (ranked.on_device, ranked.in_host) == (200, 0)
    assert list(worker.cached.entries) == ["hinted"]
    assert worker.prefetch_evictions["device"] == 250
    assert worker.cached.ranked("hinted", now=29.0)
    assert not worker.cached.ranked("hinted", now=30.0)


def test_a_ranked_prefetch_never_takes_what_running_and_queued_requests_hold_or_need() -> None:
    worker, pool, _ = _worker(device=1000)
    running = Request("busy", 0, prompt=500, output=100, sent_s=0.0)
    worker.submit(running)  # admitted at once: 600 tokens reserved
    queued = Request("queued", 0, prompt=250, output=50, sent_s=0.0)
    worker.waiting.append(queued)  # 300 tokens the queue will need
    worker.cached.put("idle", 50)
    pool.put("hinted", 200)
    # Free 350, less the queue's 300, plus the idle 50 that may go: 100 tokens of room, not enough for 200.
    result = worker.prefetch("hinted", "device", rank_until=30.0)
    assert (result.on_device, result.in_host) == (0, 200)
    assert worker.reserved == 600
    assert list(worker.cached.entries) == ["idle"]
    assert worker.prefetch_evictions["device"] == 0
    pool.put("small", 100)
    assert worker.prefetch("small", "device", rank_until=30.0).on_device == 100  # 100 fits, the idle 50 goes
    assert worker.reserved == 600
    assert worker.prefetch_evictions["device"] == 50


def test_a_ranked_prefetch_does_not_evict_another_live_ranked_one() -> None:
    worker, pool, _ = _worker(device=300)
    pool.put("first", 200)
    pool.put("second", 200)
    assert worker.prefetch("first", "device", rank_until=30.0).on_device == 200
    assert worker.prefetch("second", "device", rank_until=30.0).on_device == 0  # only ranked KV could go
    assert list(worker.cached.entries) == ["first"]
    worker.loop.now = 31.0  # the first advisory expired: its rank is gone, its KV is plain LRU
    assert worker.prefetch("second", "device", rank_until=60.0).on_device == 200
    assert list(worker.cached.entries) == ["second"]


def test_the_rank_ending_last_goes_first_and_an_unranked_entry_before_any() -> None:
    # Belady's order on the hints, as the worker's: a rank ends its ttl after the request it expects, so the one
    # ending last expects its request last.
    tier = _Tier(capacity=300)
    for sid in ("a", "b", "c"):
        tier.put(sid, 100)
    tier.retained.update(a=50.0, b=20.0)
    assert tier.victim(now=10.0) == "c"  # unranked first, though the most recently used
    tier.pop("c")
    assert tier.victim(now=10.0) == "a"  # then the rank that ends last
    assert tier.victim(now=25.0) == "b"  # b's rank has ended: it is unranked now
    tier.retained["b"] = 60.0
    assert tier.victim(now=25.0) == "b"
    assert tier.unranked_tokens(now=55.0) == 100  # a's rank ended at 50


def test_a_hint_ranks_a_session_already_on_the_device() -> None:
    worker, pool, _ = _worker(device=300)
    pool.put("here", 100)
    worker.prefetch("here", "device")  # no rank: as an earlier turn would leave it
    assert not worker.cached.ranked("here", 1.0)
    worker.prefetch("here", "device", rank_until=30.0)
    assert worker.cached.ranked("here", 1.0)


def test_a_withdrawn_advisory_unranks_its_prefetch() -> None:
    worker, pool, _ = _worker(device=300)
    pool.put("hinted", 200)
    worker.prefetch("hinted", "device", rank_until=30.0)
    assert worker.host is not None
    assert worker.cached.ranked("hinted", 1.0)
    assert worker.host.ranked("hinted", 1.0)
    worker.unrank("hinted")
    assert not worker.cached.ranked("hinted", 1.0)
    assert not worker.host.ranked("hinted", 1.0)


def _session(sid: str, start: float, *turns: tuple[int, int, float]) -> SessionTrace:
    built = tuple(Turn(a, o, g, "first" if k == 0 else "user") for k, (a, o, g) in enumerate(turns))
    return SessionTrace(sid, "synthetic", start, built)


def test_the_oracles_hints_come_one_per_later_turn_at_the_previous_answers_end() -> None:
    session = _session("S", 0.0, (400, 10, 0.0), (50, 10, 20.0), (50, 10, 0.2))
    hints = oracle_hints(session)
    assert [(h.turn, h.after_prev_end_s) for h in hints] == [(1, 0.0), (2, 0.0)]
    assert all(h.kind == "typing" for h in hints)
    # The ideal lead of a 410-token context: 0.41 s from the pool and 0.41 s over PCIe at 1,000 tokens/s each.
    assert oracle_lead_s(410, SIMPLE) == pytest.approx(1.5 * 0.82 + 0.05)


def test_the_oracle_keeps_a_sessions_kv_until_its_turn_and_prefetches_it_just_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fired = _prefetch_times(monkeypatch)
    # X's second turn comes 20 s after its first answer; Z (100 tokens) arrives meanwhile and needs room: the
    # device (550 tokens) holds X's 401 and Z only if something goes: the expected X stays, the idle W goes.
    sessions = [
        _session("X", 0.0, (400, 1, 0.0), (20, 1, 20.0)),
        _session("W", 1.0, (120, 1, 0.0)),  # more recently used than X
        _session("Z", 5.0, (100, 1, 0.0)),
    ]
    cal = dataclasses.replace(SIMPLE, device_kv_tokens=550, host_kv_tokens=10_000)
    oracle = simulate("kv_aware+oracle", sessions, cal, workers=1)
    second = _second_turn([r for r in oracle.records if r.session_id == "X"])
    assert second.cached_device == 401
    # One prefetch, fired `oracle_lead_s` before the turn (nothing to move: it found the KV on the device).
    assert len(fired) == 1
    assert fired[0] == pytest.approx(second.sent_s - oracle_lead_s(401, cal))
    plain = _second_turn([r for r in simulate("kv_aware", sessions, cal, workers=1).records if r.session_id == "X"])
    assert plain.cached_device < 401  # LRU let Z's admission take the older X


def test_hints_told_their_turns_time_prefetch_just_before_it_and_timed_ones_learn_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`+advisories-exact`: the client's typing hint (11.3 s before X's turn) is told when the turn comes, so its
    prefetch fires the oracle's lead before it, not at once; `+advisories-timed` learns the gap (here, one session
    is too few samples: it fires at once, as the default does)."""
    fired = _prefetch_times(monkeypatch)
    sessions = [_session("X", 0.0, (400, 1, 0.0), (20, 1, 20.0))]
    for system in ("dynamo_cost+advisories", "dynamo_cost+advisories-timed", "dynamo_cost+advisories-exact"):
        fired.clear()
        second = _second_turn(simulate(system, sessions, SIMPLE, workers=1).records)
        assert len(fired) == 1, system
        expected = second.sent_s - (oracle_lead_s(401, SIMPLE) if system.endswith("exact") else 11.3)
        assert fired[0] == pytest.approx(expected, abs=1e-6), system


def _second_turn(records: list[TurnRecord]) -> TurnRecord:
    return next(r for r in records if r.turn == 1)


@pytest.mark.parametrize("router", ["kv_aware", "dynamo_cost"])
def test_the_oracle_turns_a_pool_read_into_a_device_hit_and_ignores_false_and_missed_hints(router: str) -> None:
    """On either router: the hints ride on the policy's choices, so the oracle's ceiling is measured on top of the
    strongest baseline's router too (dynamo_cost), not only on ours."""
    sessions = [_session("X", 0.0, (400, 1, 0.0), (20, 1, 20.0))]
    cal = dataclasses.replace(SIMPLE, device_kv_tokens=450, host_kv_tokens=450)
    # Y's 420 tokens push X out of the device and host tiers while X's user thinks: X lives in the pool.
    sessions.append(_session("Y", 5.0, (420, 1, 0.0)))
    plain = _second_turn(simulate(router, sessions, cal, workers=1).records)
    assert plain.cached_pool == 401  # read from the pool on the critical path
    noisy = HintModel(missed_rate=1.0)  # the clients' hints would all be missed: the oracle has its own
    oracle = simulate(f"{router}+oracle", sessions, cal, workers=1, hints=noisy)
    second = _second_turn(oracle.records)
    assert (second.cached_device, second.cached_pool) == (401, 0)
    assert oracle.advisories["used"] == 1
    assert oracle.advisories["missed"] == 0
    assert second.ttft_s is not None
    assert plain.ttft_s is not None
    assert second.ttft_s < plain.ttft_s - 0.3

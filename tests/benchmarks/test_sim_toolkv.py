"""The simulator's side of issue 15: retained device entries, the advisor's tool-call KV lifecycle driven through
the simulated cluster, the long-context agent workload and the `toolkv` experiment's report."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sessiongate.benchmarks.sim import SYSTEMS, h100_llama8b, simulate
from sessiongate.benchmarks.sim.agent_long import closed_loop_users, long_agent_sessions
from sessiongate.benchmarks.sim.engine import PrefetchResult, SimWorker, _Tier
from sessiongate.benchmarks.sim.toolkv_experiment import toolkv_experiment
from sessiongate.benchmarks.workloads import SessionTrace, Turn, agent_sessions

from .test_sim import SIMPLE


def test_a_retained_entry_goes_after_unretained_ones_until_its_retain_ends_and_is_never_pinned() -> None:
    tier = _Tier(capacity=300)
    tier.put("old", 100)
    tier.put("new", 100)
    tier.retained["old"] = 10.0
    tier.put("third", 150, now=5.0)  # needs 50 more: "new" goes although "old" is older
    assert list(tier.entries) == ["old", "third"]
    tier.put("fourth", 150, now=11.0)  # the retain has ended: plain LRU again
    assert list(tier.entries) == ["third", "fourth"]
    tier.retained.update(third=100.0, fourth=100.0)
    tier.put("fifth", 100, now=12.0)  # only retained entries left: the least recently used of them still goes
    assert list(tier.entries) == ["fourth", "fifth"]
    assert tier.used == 250


def _tool_session(sid: str, start: float, tool_s: float, rounds: int) -> SessionTrace:
    turns = [Turn(400, 4, 0.0, "first")] + [Turn(50, 4, tool_s, "tool") for _ in range(rounds)]
    return SessionTrace(sid, "agent", start, tuple(turns))


def test_short_tools_are_kept_and_long_ones_offloaded_with_a_prefetch_that_lands_before_the_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    short = simulate("kv_aware+toolkv", [_tool_session("S", 0.0, 0.3, 6)], SIMPLE, workers=2)
    assert (short.advisories["keep"], short.advisories["offload"]) == (6, 0)
    assert short.advisories["used"] == 6

    # 30 s tools: the first three are predicted at the default (2 s: kept), then p75 of the recorded 30 s.
    fired = _prefetch_times(monkeypatch)
    long = simulate("kv_aware+toolkv", [_tool_session("L", 0.0, 30.0, 6)], SIMPLE, workers=2)
    assert (long.advisories["keep"], long.advisories["offload"]) == (3, 3)
    assert (long.advisories["used"], long.advisories["late"], long.advisories["wasted"]) == (6, 0, 0)
    # Each offloaded turn's prefetch fires at predicted - load - 0.5 s: just before its request, not seconds early
    # (the context is about 600 tokens, 1.2 s to load at this calibration's pool rate).
    sent = sorted(r.sent_s for r in long.records if r.turn >= 4)
    assert len(fired) == 3
    for at, request in zip(sorted(fired), sent, strict=True):
        assert 0.5 < request - at < 2.5


def _bimodal_session(sid: str, rounds: int) -> SessionTrace:
    """A tool that either fails at once (0 s) or runs for 30 s, in turn."""
    turns = [Turn(400, 4, 0.0, "first")] + [Turn(50, 4, 30.0 if k % 2 else 0.0, "tool") for k in range(rounds)]
    return SessionTrace(sid, "agent", 0.0, tuple(turns))


def _prefetch_times(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    fired: list[float] = []
    original = SimWorker.prefetch

    def prefetch(worker: SimWorker, session_id: str, target: str) -> PrefetchResult:
        fired.append(worker.loop.now)
        return original(worker, session_id, target)

    monkeypatch.setattr(SimWorker, "prefetch", prefetch)
    return fired


def test_a_bimodal_tool_is_retained_for_its_short_kind_then_prefetched_for_its_long_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fired = _prefetch_times(monkeypatch)
    result = simulate("kv_aware+toolkv", [_bimodal_session("B", 10)], SIMPLE, workers=2)
    counts = result.advisories
    # Turns 1-3 are planned on the default (too few samples: keep); from turn 4 on the samples are half 0 s, half
    # 30 s: keep_then_offload, its retain 1 s (p90 of the short kind, 0 s, x1.5 + 1 s).
    assert (counts["keep"], counts["offload"], counts["keep_then_offload"]) == (3, 0, 7)
    # The 30 s tools of turns 4, 6, 8 and 10 outlive the retain: each lapses into one prefetch, fired just before
    # its return (30 s - load - 0.5 s); the 0 s tools come back inside the retain and load nothing.
    assert counts["retain_lapsed"] == 4
    assert counts["retain_fallback"] == counts["early_skipped"] == 0
    long_requests = sorted(r.sent_s for r in result.records if r.turn in (4, 6, 8, 10))
    assert len(fired) == 4
    for at, request in zip(sorted(fired), long_requests, strict=True):
        assert 0.5 < request - at < 2.5
    assert (counts["used"], counts["late"], counts["wasted"]) == (10, 0, 0)


def test_a_retain_that_finds_nothing_falls_back_to_a_prefetch_and_still_lapses_into_the_long_kinds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fired = _prefetch_times(monkeypatch)
    monkeypatch.setattr(SimWorker, "retain", lambda worker, session_id, until: (0, 0))
    result = simulate("kv_aware+toolkv", [_bimodal_session("F", 10)], SIMPLE, workers=2)
    counts = result.advisories
    # Every retain (3 keep, 7 keep_then_offload) became a prefetch at once; the four long tools' a second one.
    assert counts["retain_fallback"] == 10
    assert counts["retain_lapsed"] == 4
    assert len(fired) == 14


def test_toolkv_systems_run_the_gateways_kv_aware_with_the_lifecycle() -> None:
    assert SYSTEMS["kv_aware+toolkv"].policy == "kv_aware"
    assert SYSTEMS["kv_aware+toolkv"].tool_kv
    assert not SYSTEMS["kv_aware+advisories"].tool_kv


def test_long_agents_reach_32k_to_128k_tokens_and_keep_the_recorded_tool_times() -> None:
    sessions = long_agent_sessions(count=20, seed=0)
    recorded = {s.id: s for s in agent_sessions(count=20, seed=0)}
    for session in sessions:
        final = session.prompt_tokens(len(session.turns) - 1) + session.turns[-1].output_tokens
        assert 20_000 <= final <= 131_072
        original = recorded[session.id].turns[: len(session.turns)]
        assert [t.gap_s for t in session.turns] == [t.gap_s for t in original]
        assert [t.output_tokens for t in session.turns] == [t.output_tokens for t in original]
    finals = [s.prompt_tokens(len(s.turns) - 1) for s in sessions]
    assert max(finals) > 64_000
    stretched = long_agent_sessions(count=2, seed=0, tool_scale=20.0)
    assert max(t.gap_s for s in stretched for t in s.turns) > 8.0
    users, follow_ups = closed_loop_users(sessions, 5, seed=0, think_time_s=20.0)
    assert len(users) == len(sessions)
    assert len(follow_ups) == len(sessions) - 5


def test_the_experiment_reports_every_target() -> None:
    cal = dataclasses.replace(h100_llama8b())
    text = toolkv_experiment(
        cal,
        workers=[2],
        loads=[2],
        systems=("recompute", "cache_aware", "kv_aware+toolkv"),
        sessions_per_user=1,
        log=lambda _: None,
    )
    assert "| 2 | kv_aware+toolkv |" in text
    for target in ("target >= 1.5x", "target >= 3x", "target >= 2x", "target <= 2%"):
        assert target in text
    assert text.count("NOT met") + text.count(": met") == 4


@pytest.mark.parametrize("system", ["dynamo_cost", "kv_aware+toolkv"])
def test_new_systems_are_deterministic(system: str) -> None:
    sessions = [_tool_session(f"S{i}", 0.2 * i, 5.0, 3) for i in range(4)]
    first = simulate(system, sessions, SIMPLE, workers=2)
    again = simulate(system, sessions, SIMPLE, workers=2)
    assert first.records == again.records


def test_the_report_splits_the_turns_after_a_long_tool_from_those_after_a_short_one() -> None:
    kwargs: dict[str, Any] = {"workers": [2], "loads": [2], "sessions_per_user": 1, "false_rate": 0.0}
    systems = ("kv_aware", "kv_aware+toolkv")
    recorded = toolkv_experiment(h100_llama8b(), systems=systems, log=lambda _: None, **kwargs)
    assert "after a long tool" not in recorded  # as recorded, no tool runs over 2 s
    stretched = toolkv_experiment(h100_llama8b(), systems=systems, tool_scales=[20.0], log=lambda _: None, **kwargs)
    rows = [line for line in stretched.splitlines() if line.startswith("| 2 | kv_aware") and line.count("%") == 6]
    assert [row.split(" | ")[1] for row in rows] == ["kv_aware", "kv_aware+toolkv"]
    for row in rows:
        long_turns, short_turns = (int(cell.split(" / ")[0]) for cell in row.split(" | ")[2:4])
        assert long_turns > 0
        assert short_turns > 0

"""The simulator's side of issue 15: retained device entries, the advisor's tool-call KV lifecycle driven through
the simulated cluster, the long-context agent workload and the `toolkv` experiment's report."""

from __future__ import annotations

import dataclasses

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
    fired: list[float] = []
    original = SimWorker.prefetch

    def prefetch(worker: SimWorker, session_id: str, target: str) -> PrefetchResult:
        fired.append(worker.loop.now)
        return original(worker, session_id, target)

    monkeypatch.setattr(SimWorker, "prefetch", prefetch)
    long = simulate("kv_aware+toolkv", [_tool_session("L", 0.0, 30.0, 6)], SIMPLE, workers=2)
    assert (long.advisories["keep"], long.advisories["offload"]) == (3, 3)
    assert (long.advisories["used"], long.advisories["late"], long.advisories["wasted"]) == (6, 0, 0)
    # Each offloaded turn's prefetch fires at predicted - load - 0.5 s: just before its request, not seconds early
    # (the context is about 600 tokens, 1.2 s to load at this calibration's pool rate).
    sent = sorted(r.sent_s for r in long.records if r.turn >= 4)
    assert len(fired) == 3
    for at, request in zip(sorted(fired), sent, strict=True):
        assert 0.5 < request - at < 2.5


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

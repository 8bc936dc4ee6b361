"""The trace loaders on the real shared traces (their README's figures) and the hint plan's rates."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from sessiongate.benchmarks.metrics import percentile
from sessiongate.benchmarks.workloads import (
    HintModel,
    SessionTrace,
    TracesMissingError,
    Turn,
    agent_sessions,
    mooncake_sessions,
    plan_hints,
    scale_tokens,
    sharegpt_sessions,
    traces_dir,
)

try:
    traces_dir()
except TracesMissingError:
    pytest.skip("the shared traces are not here (set SESSIONGATE_TRACES)", allow_module_level=True)


def _extends_exactly(session: SessionTrace) -> bool:
    for k in range(1, len(session.turns)):
        previous = session.turns[k - 1]
        expected = session.prompt_tokens(k - 1) + previous.output_tokens + session.turns[k].append_tokens
        if session.prompt_tokens(k) != expected or session.turns[k].append_tokens < 1:
            return False
    return True


def test_mooncake_matches_the_readme() -> None:
    sessions = mooncake_sessions()
    turns = sum(len(s.turns) for s in sessions)
    assert turns == 12_031
    # README: 29.6% of requests continue a conversation (22 branches start sessions of their own here).
    continuations = (turns - len(sessions)) / turns
    assert continuations == pytest.approx(0.296, abs=0.005)
    gaps = [t.gap_s for s in sessions for t in s.turns[1:]]
    # README: gap between such turns p10 42 s, p50 126 s, p90 486 s.
    assert percentile(gaps, 10) == pytest.approx(42, rel=0.1)
    assert percentile(gaps, 50) == pytest.approx(126, rel=0.1)
    assert percentile(gaps, 90) == pytest.approx(486, rel=0.1)
    assert all(_extends_exactly(s) for s in sessions)
    starts = [s.start_s for s in sessions]
    assert starts == sorted(starts)
    assert max(t.at_s or 0.0 for s in sessions for t in s.turns) == pytest.approx(3537, abs=1)


def test_mooncake_duration_and_time_scale() -> None:
    half = mooncake_sessions(duration_s=600, time_scale=0.5)
    assert all((t.at_s or 0.0) <= 300 for s in half for t in s.turns)
    assert 1000 < sum(len(s.turns) for s in half) < 12_031 / 3


def test_sharegpt_matches_the_readme() -> None:
    sessions = sharegpt_sessions(count=11_135, seed=3)
    assert len({s.id.rsplit("-", 1)[1] for s in sessions}) == 11_135  # every conversation once
    # README: turns per conversation mean 3.37; user tokens p50 18; assistant tokens mean 262.
    assert statistics.mean(len(s.turns) for s in sessions) == pytest.approx(3.37, abs=0.02)
    assert percentile([t.append_tokens for s in sessions for t in s.turns], 50) == pytest.approx(18, abs=2)
    assert statistics.mean(t.output_tokens for s in sessions for t in s.turns) == pytest.approx(262, rel=0.03)
    assert all(_extends_exactly(s) for s in sessions)
    assert all(t.kind == "user" and t.gap_s > 0 for s in sessions for t in s.turns[1:])


def test_sharegpt_is_deterministic_and_arrives_at_the_rate() -> None:
    first = sharegpt_sessions(count=400, seed=9, arrival_rate_per_s=2.0)
    assert first == sharegpt_sessions(count=400, seed=9, arrival_rate_per_s=2.0)
    assert first != sharegpt_sessions(count=400, seed=10, arrival_rate_per_s=2.0)
    assert first[-1].start_s / (len(first) - 1) == pytest.approx(0.5, rel=0.15)
    capped = sharegpt_sessions(count=200, seed=9, max_context_tokens=500)
    assert len(capped) == 200
    assert all(s.prompt_tokens(len(s.turns) - 1) + s.turns[-1].output_tokens <= 500 for s in capped)


def test_agent_trajectories() -> None:
    sessions = agent_sessions(count=40, seed=1)
    assert len({s.id.split("-", 2)[2] for s in sessions}) == 5
    # README: 21-32 tool-calling rounds each; prompts grow to 9k-39k tokens; tools run 0-0.6 s.
    assert all(21 <= len(s.turns) <= 32 for s in sessions)
    finals = [s.prompt_tokens(len(s.turns) - 1) for s in sessions]
    assert min(finals) >= 8_500
    assert max(finals) <= 39_000
    assert all(t.kind == "tool" and 0 <= t.gap_s <= 0.61 for s in sessions for t in s.turns[1:])
    assert all(_extends_exactly(s) for s in sessions)
    # No trajectory trims its history, so every prompt is exactly the recorded one.
    recorded = json.loads((traces_dir() / "agent" / "swesmith_rounds_llama3tok.json").read_text())
    prompts = {item["traj_id"][:24]: [r["prompt_tokens"] for r in item["rounds"]] for item in recorded}
    for session in sessions:
        expected = prompts[session.id.split("-", 2)[2]]
        assert [session.prompt_tokens(k) for k in range(len(session.turns))] == expected


def test_scale_tokens_keeps_the_prefix_structure() -> None:
    sessions = agent_sessions(count=3, seed=2)
    small = scale_tokens(sessions, 0.1)
    assert [len(s.turns) for s in small] == [len(s.turns) for s in sessions]
    assert all(_extends_exactly(s) for s in small)
    assert small[0].turns[0].append_tokens == round(sessions[0].turns[0].append_tokens * 0.1)


def test_missing_traces_say_where(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SESSIONGATE_TRACES", str(tmp_path / "nowhere"))
    with pytest.raises(TracesMissingError, match="SESSIONGATE_TRACES"):
        sharegpt_sessions(count=1, seed=0)


def test_plan_hints_rates() -> None:
    sessions = sharegpt_sessions(count=3000, seed=5)
    model = HintModel(lead_s=11.3, false_rate=0.4, missed_rate=0.1)
    rng = random.Random(1)
    hints = [h for s in sessions for h in plan_hints(s, model, rng)]
    follow_ups = sum(len(s.turns) - 1 for s in sessions)
    true_hints = [h for h in hints if h.turn is not None]
    false_hints = [h for h in hints if h.turn is None]
    assert 1 - len(true_hints) / follow_ups == pytest.approx(0.1, abs=0.015)
    assert len(false_hints) / len(hints) == pytest.approx(0.4, abs=0.02)
    by_id = {s.id: s for s in sessions}
    for hint in true_hints:
        assert hint.turn is not None
        gap = by_id[hint.session_id].turns[hint.turn].gap_s
        assert hint.after_prev_end_s == pytest.approx(max(gap - 11.3, 0.0))
        assert hint.kind == "typing"
    for hint in false_hints:
        session = by_id[hint.session_id]
        anchor = hint.after_turn
        assert anchor is not None
        # Nothing follows within the ttl: the session's last turn, or a gap longer than the hint's delay + ttl.
        assert anchor == len(session.turns) - 1 or session.turns[anchor + 1].gap_s > hint.after_prev_end_s + 30


def test_a_lead_spread_draws_each_hints_lead_around_the_mean() -> None:
    """With `lead_sigma` each typing lead is drawn log-normal around `lead_s` (its mean), so a gateway cannot know
    a turn's time from its hint; with 0 every lead is `lead_s`."""
    turns = (Turn(100, 10, 0.0, "first"), *(Turn(20, 10, 100.0, "user") for _ in range(2000)))
    session = SessionTrace("S", "synthetic", 0.0, turns)  # gaps of 100 s: no lead is cut at the answer's end
    spread = [100.0 - h.after_prev_end_s for h in plan_hints(session, HintModel(lead_sigma=0.5), random.Random(1))]
    assert sum(spread) / len(spread) == pytest.approx(11.3, rel=0.05)
    assert min(spread) < 5.0
    assert max(spread) > 25.0
    fixed = [100.0 - h.after_prev_end_s for h in plan_hints(session, HintModel(), random.Random(1))]
    assert fixed == [pytest.approx(11.3)] * len(turns[1:])
    with pytest.raises(ValueError, match="invalid hint model"):
        plan_hints(session, HintModel(lead_sigma=-1.0), random.Random(0))


def test_plan_hints_for_tools_and_open_loop() -> None:
    agent = agent_sessions(count=1, seed=0)[0]
    hints = plan_hints(agent, HintModel(lead_s=5.8), random.Random(0))
    assert len(hints) == len(agent.turns) - 1
    assert all(h.kind == "tool" and h.after_prev_end_s == 0.0 for h in hints)
    conversation = next(s for s in mooncake_sessions(duration_s=900) if len(s.turns) > 1)
    hint = plan_hints(conversation, HintModel(lead_s=10.0), random.Random(0))[0]
    assert hint.at_s == pytest.approx((conversation.turns[1].at_s or 0.0) - 10.0)

"""The replay driver against the real gateway app in front of two fake SGLang workers (on localhost sockets)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour
from sessiongate.benchmarks.replay.driver import ReplayOptions, replay
from sessiongate.benchmarks.replay.text import SyntheticText
from sessiongate.benchmarks.workloads import HintModel, SessionTrace, Turn
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.gateway.workers.pool import worker_id_for
from tests.conftest import fake_workers

pytestmark = pytest.mark.anyio

ADMIN_KEY = "replay-admin"


@pytest.fixture
async def stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    """What a test serves (its fake workers), ended after its gateway."""
    async with contextlib.AsyncExitStack() as stack:
        yield stack


def _sessions() -> list[SessionTrace]:
    def session(n: int, second_kind: str) -> SessionTrace:
        turns = (
            Turn(40 + n, 6, 0.0, "first"),
            Turn(12, 5, 0.2, second_kind),
            Turn(9 + n, 4, 0.1, "user"),
        )
        return SessionTrace(f"s{n}", "synthetic", 0.0, turns)

    return [session(0, "user"), session(1, "tool"), session(2, "user")]


async def test_replay_through_the_gateway_extends_each_prompt(
    tmp_path: Path, open_gateway: Callable[..., Any], stack: contextlib.AsyncExitStack
) -> None:
    pool: list[tuple[str, ...]] = []
    # The prompts are a few dozen tokens: the workers load any pool hit, as `WorkerConfig(prefetch_threshold=1)` would
    # (SGLang's default, 256 tokens, hides every storage hit: a turn routed to the other worker then found nothing).
    workers = {name: FakeWorkerBehaviour(pool=pool, prefetch_threshold=1) for name in ("worker-a", "worker-b")}
    urls = await stack.enter_async_context(fake_workers(workers))
    settings = GatewaySettings(
        workers=tuple(urls.values()),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        allow_unauthenticated=True,
        admin_key=ADMIN_KEY,
        health_interval_s=0.05,
    )
    sessions = _sessions()
    # The fake worker counts whitespace words, plus one token per message for its role.
    options = ReplayOptions(
        system="kv_aware+advisories",
        concurrency=2,
        time_scale=0.5,
        hints=HintModel(lead_s=0.1),
        text=SyntheticText(message_overhead_tokens=1),
        progress=False,
    )
    async with open_gateway(create_app(settings)) as client:
        result = await replay(client, sessions, options)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        stats = (await client.get("/v1/admin/advisories/stats", headers=admin)).json()

    records = {(r.session_id, r.turn): r for r in result.records}
    assert len(result.records) == len(records) == 9
    for session in sessions:
        for k, turn in enumerate(session.turns):
            r = records[(session.id, k)]
            assert r.error is None
            assert r.first_token_s is not None
            assert r.done_s is not None
            assert r.sent_s <= r.first_token_s <= r.done_s
            assert r.worker in {worker_id_for(url) for url in urls.values()}
            # Token counts follow the trace (plus the assistant role token of each earlier turn).
            assert r.prompt_tokens == session.prompt_tokens(k) + k
            assert r.output_tokens == turn.output_tokens
            if k:
                assert r.cached_device + r.cached_host + r.cached_pool >= session.prompt_tokens(k - 1)
                previous_done = records[(session.id, k - 1)].done_s
                assert previous_done is not None
                assert r.sent_s - previous_done >= turn.gap_s * options.time_scale - 0.01

    # What the workers received: each turn's messages are the previous turn's, its real answer, and the new ones.
    received = [request["messages"] for w in workers.values() for request in w.requests]
    by_session: dict[str, list[list[dict[str, Any]]]] = {}
    for messages in received:
        by_session.setdefault(messages[0]["content"], []).append(messages)
    assert len(by_session) == 3
    for turns in by_session.values():
        turns.sort(key=len)
        assert [len(m) for m in turns] == [1, 3, 5]
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier
            assert later[len(earlier)]["role"] == "assistant"
            assert later[len(earlier)]["content"].startswith("echo:")

    # One hint per turn after the first: typing for user turns, a tool advisory for the tool turn.
    assert result.hints_sent == {"typing": 5, "tool": 1}
    assert not result.hint_errors
    assert stats["requests"] == 6


async def test_the_oracle_advises_every_later_turn_at_its_ideal_lead(
    tmp_path: Path, open_gateway: Callable[..., Any], stack: contextlib.AsyncExitStack
) -> None:
    worker = FakeWorkerBehaviour()
    urls = await stack.enter_async_context(fake_workers({"worker-a": worker}))
    settings = GatewaySettings(
        workers=(urls["worker-a"],),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        allow_unauthenticated=True,
        admin_key=ADMIN_KEY,
        health_interval_s=0.05,
    )
    sessions = _sessions()
    leads: list[int] = []

    def lead(tokens: int) -> float:
        leads.append(tokens)
        return 0.05

    options = ReplayOptions(
        system="kv_aware+oracle",
        concurrency=3,
        time_scale=0.5,
        hints=HintModel(missed_rate=1.0),  # ignored: the oracle's hints replace the planned ones
        oracle_lead_s=lead,
        text=SyntheticText(message_overhead_tokens=1),
        progress=False,
    )
    async with open_gateway(create_app(settings)) as client:
        result = await replay(client, sessions, options)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        stats = (await client.get("/v1/admin/advisories/stats", headers=admin)).json()
    later = sum(len(s.turns) - 1 for s in sessions)
    assert result.hints_sent == {"explicit": later}
    assert not result.hint_errors
    # Each asked for the context the turn extends: every earlier append and answer.
    expected = sorted(s.prompt_tokens(k) - s.turns[k].append_tokens for s in sessions for k in range(1, len(s.turns)))
    assert sorted(leads) == expected
    assert (
        stats["kinds"]["explicit"]["outcomes"].get("used", 0) + stats["kinds"]["explicit"]["outcomes"].get("late", 0)
        == later
    )


async def test_no_turn_or_hint_is_sent_after_the_window(
    tmp_path: Path, open_gateway: Callable[..., Any], stack: contextlib.AsyncExitStack
) -> None:
    worker = FakeWorkerBehaviour()
    urls = await stack.enter_async_context(fake_workers({"worker-a": worker}))
    settings = GatewaySettings(
        workers=(urls["worker-a"],),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        allow_unauthenticated=True,
        health_interval_s=0.05,
    )
    # Times x10: each session's second turn is due 2 s after its first, its hint 1 s before that, both after the
    # 0.5 s window, in which the three first turns all start even on a loaded machine (at 0.05 s, one did not).
    options = ReplayOptions(
        system="kv_aware+advisories",
        concurrency=3,
        time_scale=10.0,
        hints=HintModel(lead_s=0.1),
        max_duration_s=0.5,
        text=SyntheticText(message_overhead_tokens=1),
        progress=False,
    )
    async with open_gateway(create_app(settings)) as client:
        result = await replay(client, _sessions(), options)
    assert sorted((r.session_id, r.turn) for r in result.records) == [("s0", 0), ("s1", 0), ("s2", 0)]
    assert not result.hints_sent
    assert len(worker.requests) == 3


def test_the_replay_configures_the_gateways_cost_model_as_the_simulators() -> None:
    from sessiongate.benchmarks.replay.systems import cost_model_env
    from sessiongate.benchmarks.sim.calibration import PROFILES_DIR, cpu_profile
    from sessiongate.gateway.routing import KVAware
    from sessiongate.gateway.wiring import build_policy

    cost = cpu_profile(PROFILES_DIR / "cpu_tiny.json").cost_model()
    settings = GatewaySettings.from_env({**cost_model_env(cost), "SESSIONGATE_ROUTING_POLICY": "kv_aware"})
    policy = build_policy(settings)
    assert isinstance(policy, KVAware)
    assert policy.cost == cost


def test_only_the_turns_sent_in_the_window_count(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from sessiongate.benchmarks.metrics import TurnRecord
    from sessiongate.benchmarks.replay.driver import ReplayResult
    from sessiongate.benchmarks.replay.runner import in_window

    def sent_at(t: float) -> TurnRecord:
        return TurnRecord("s", "a", 0, t, t + 0.1, t + 0.2, 10, 2, 0, 0, 0, "w", None)

    sessions = _sessions()
    records = [sent_at(t) for t in (0.0, 5.0, 9.9, 10.0, 12.0)]
    window = argparse.Namespace(duration_s=10.0)
    kept = ReplayResult(records=records, sessions_started=1, wall_s=12.5)
    assert [r.sent_s for r in in_window(kept, sessions, window)] == [0.0, 5.0, 9.9]
    assert "warning" not in capsys.readouterr().out
    # Every drawn session started and the run ended inside the window: the load fell before its end.
    drained = ReplayResult(records=records[:3], sessions_started=len(sessions), wall_s=9.95)
    assert len(in_window(drained, sessions, window)) == 3
    assert "raise --sessions-per-slot" in capsys.readouterr().out

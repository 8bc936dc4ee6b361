"""The replay's tool-call turns, through the real gateway app in front of two fake SGLang workers (on real sockets):
forced tool calls, the next turn's call and result messages, and the tool results posted to the gateway, which
learns their durations and runs its tool-call KV lifecycle on them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour
from sessiongate.benchmarks.processes import FakeWorkerProcess, SmgProcess, smg_installed
from sessiongate.benchmarks.replay.common import model_name
from sessiongate.benchmarks.replay.driver import RUN_TOOL, TOOL_CALL_MAX_TOKENS, ReplayOptions, replay
from sessiongate.benchmarks.replay.text import SyntheticText
from sessiongate.benchmarks.workloads import SessionTrace, Turn
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from tests.conftest import fake_workers

from .test_replay import ADMIN_KEY

pytestmark = pytest.mark.anyio

# Trace times x10, but tool times x1: a tool of 0.3 s in the trace takes 0.3 s, not 3 s. (At x0.5 a loaded CI
# machine once brought a tool's result before the lifecycle's retain of 0.1 s earlier had finished: "late".)
TIME_SCALE, TOOL_TIME_SCALE = 10.0, 1.0


def _agent_sessions() -> list[SessionTrace]:
    def session(n: int) -> SessionTrace:
        turns = (Turn(40 + n, 6, 0.0, "first"), Turn(12, 5, 0.3, "tool"), Turn(9 + n, 4, 0.2, "tool"))
        return SessionTrace(f"a{n}", "agent", 0.0, turns)

    return [session(0), session(1)]


async def _run(tmp_path: Path, open_gateway: Callable[..., Any], *, post: bool) -> tuple[Any, ...]:
    pool: list[tuple[str, ...]] = []
    workers = {"worker-a": FakeWorkerBehaviour(pool=pool), "worker-b": FakeWorkerBehaviour(pool=pool)}
    async with fake_workers(workers) as urls:
        return await _run_on(tmp_path, open_gateway, workers, tuple(urls.values()), post=post)


async def _run_on(
    tmp_path: Path,
    open_gateway: Callable[..., Any],
    workers: dict[str, FakeWorkerBehaviour],
    urls: tuple[str, ...],
    *,
    post: bool,
) -> tuple[Any, ...]:
    database = tmp_path / "g.db"
    settings = GatewaySettings(
        workers=urls,
        database_url=f"sqlite+aiosqlite:///{database}",
        allow_unauthenticated=True,
        admin_key=ADMIN_KEY,
        health_interval_s=0.05,
        routing_policy="kv_aware",
    )
    options = ReplayOptions(
        system="kv_aware+toolkv" if post else "kv_aware",
        concurrency=2,
        time_scale=TIME_SCALE,
        tool_time_scale=TOOL_TIME_SCALE,
        text=SyntheticText(message_overhead_tokens=1),
        progress=False,
        tool_calls=True,
        post_tool_results=post,
    )
    async with open_gateway(create_app(settings)) as client:
        result = await replay(client, _agent_sessions(), options)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        stats = (await client.get("/v1/admin/advisories/stats", headers=admin)).json()
    with sqlite3.connect(database) as db:
        calls = db.execute("SELECT call_id, name, result_source, duration_ms FROM tool_calls").fetchall()
        advisories = db.execute("SELECT kind, outcome, detail FROM advisories").fetchall()
    requests = [r for w in workers.values() for r in w.requests if r["messages"][0]["content"] != "warm up"]
    return result, stats, calls, advisories, requests


async def test_tool_turns_end_in_real_calls_and_the_posted_results_drive_the_lifecycle(
    tmp_path: Path, open_gateway: Callable[..., Any]
) -> None:
    result, stats, calls, advisories, requests = await _run(tmp_path, open_gateway, post=True)

    assert len(result.records) == 6
    assert all(r.error is None for r in result.records)
    # Turns 0 and 1 of each session are followed by a tool: forced calls, each answered and its result posted.
    assert result.tools == {"calls": 4, "posted": 4}
    assert not result.hint_errors
    records = {(r.session_id, r.turn): r for r in result.records}
    for session in _agent_sessions():
        for k in (1, 2):
            done = records[(session.id, k - 1)].done_s
            assert done is not None
            waited = records[(session.id, k)].sent_s - done
            # The tool's time at the tool scale, not at the (much longer) think-time scale.
            assert session.turns[k].gap_s * TOOL_TIME_SCALE - 0.01 <= waited < session.turns[k].gap_s * TIME_SCALE

    # What the workers received: the same tool on every turn; forced turns name it, without ignore_eos.
    assert len(requests) == 6
    forced = [r for r in requests if "tool_choice" in r]
    assert len(forced) == 4
    for request in requests:
        assert request["tools"] == [RUN_TOOL]
    for request in forced:
        assert request["tool_choice"] == {"type": "function", "function": {"name": "run_tool"}}
        assert "ignore_eos" not in request
        assert request["max_tokens"] >= TOOL_CALL_MAX_TOKENS
    for request in requests:
        if "tool_choice" not in request:
            assert request["ignore_eos"] is True  # the last turn: a plain answer of the trace's length
    # A turn after a tool: the previous answer with its call, then the call's result.
    follow_ups = [r["messages"] for r in requests if len(r["messages"]) > 1]
    assert len(follow_ups) == 4
    for messages in follow_ups:
        assistant, tool = messages[-2], messages[-1]
        (call,) = assistant["tool_calls"]
        assert (assistant["role"], tool["role"], call["function"]["name"]) == ("assistant", "tool", "run_tool")
        assert tool["tool_call_id"] == call["id"]

    # The gateway recorded each call, its result from the API and its duration (the tool's time).
    assert len(calls) == 4
    assert len({c[0] for c in calls}) == 4
    for _, name, source, duration_ms in calls:
        assert (name, source) == ("run_tool", "api")
        assert duration_ms >= 0.2 * TOOL_TIME_SCALE * 1000 - 10
    # Every tool call got the lifecycle's decision (short tools: keep the KV on the device), settled by the turn
    # that brought its result.
    tool_call = [(outcome, json.loads(detail)) for kind, outcome, detail in advisories if kind == "tool_call"]
    assert len(tool_call) == 4
    assert {d["tool_kv"]["action"] for _, d in tool_call} == {"keep"}
    # The fake workers hold what they served: each retain finds the KV and each next turn claims it there.
    assert [outcome for outcome, _ in tool_call] == ["used"] * 4
    assert stats["tool_kv"].get("keep") == 4
    assert sum(stats["kinds"]["tool_call"]["outcomes"].values()) == 4


async def test_without_posting_the_same_bodies_go_out_and_the_results_come_with_the_next_turn(
    tmp_path: Path, open_gateway: Callable[..., Any]
) -> None:
    result, _, calls, _, requests = await _run(tmp_path, open_gateway, post=False)
    assert result.tools == {"calls": 4}
    assert len([r for r in requests if "tool_choice" in r]) == 4
    assert all(r["tools"] == [RUN_TOOL] for r in requests)
    # The store still learns each result, from the role=tool message of the next request.
    assert sorted((name, source) for _, name, source, _ in calls) == [("run_tool", "message")] * 4


@pytest.mark.skipif(not smg_installed(), reason="smg is not installed (the `bench` extra: smg==1.13.0)")
async def test_through_smg_cache_aware_the_calls_and_the_per_tier_report_come_back(tmp_path: Path) -> None:
    """The `smg` system's front, a real `smg` 1.13 process (cache_aware, no session header), in front of two fake
    worker processes: the forced calls come back, the worker's `sglext` chunk still gives the tiers."""
    workers = [FakeWorkerProcess(tmp_path) for _ in range(2)]
    router: SmgProcess | None = None
    try:
        for worker in workers:
            worker.wait_ready()
        router = SmgProcess(tmp_path, workers=[w.url for w in workers], policy="cache_aware")
        router.wait_ready()
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as client:
            options = ReplayOptions(
                system="smg",
                concurrency=2,
                time_scale=TIME_SCALE,
                tool_time_scale=TOOL_TIME_SCALE,
                model=await model_name(client),
                text=SyntheticText(message_overhead_tokens=1),
                progress=False,
                tool_calls=True,
            )
            result = await replay(client, _agent_sessions(), options)
    finally:
        if router is not None:
            router.stop()
        for worker in workers:
            worker.stop()
    assert [r.error for r in result.records] == [None] * 6
    assert result.tools == {"calls": 4}
    by_turn = {(r.session_id, r.turn): r for r in result.records}
    addresses = {w.url.removeprefix("http://") for w in workers}
    for (session, k), record in by_turn.items():
        assert record.worker is not None
        assert record.worker.removeprefix("http://") in addresses
        if k:
            # cache_aware keeps a session where its prefix is: the previous turn's prompt is found on the device.
            assert record.cached_device >= by_turn[(session, k - 1)].prompt_tokens - 1


def test_only_the_systems_with_hints_run_the_tool_call_lifecycle(tmp_path: Path) -> None:
    from sessiongate.benchmarks.replay.systems import SYSTEMS, ClusterConfig, gateway_env

    cluster = ClusterConfig(state_dir=tmp_path)
    on = {
        name
        for name, spec in SYSTEMS.items()
        if spec.front == "sessiongate"
        and GatewaySettings.from_env(gateway_env(spec, cluster, tmp_path / "g.db")).advisory_tool_kv
    }
    assert on == {"kv_aware+advisories", "kv_aware+toolkv"}
    assert SYSTEMS["smg"].front == "smg"
    assert SYSTEMS["smg"].policy == "cache_aware"

"""The tool-call-aware KV lifecycle: the pure decision, then through the real app against fake workers that speak
the extension (retain, prefetch), with the advisor on a fake clock so a 30 s tool takes no time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sessiongate.gateway.advisor.toolkv import ResultGaps, ToolDurations, ToolKVPolicy, quantile

from .conftest import Gateway
from .test_signals import FAST, USER, _advisories, _settled, eventually

RUN_TESTS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


# --- the decision, pure ----------------------------------------------------------------------------------------


def test_quantile_interpolates_between_order_statistics() -> None:
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.75) == pytest.approx(3.25)
    assert quantile([7.0], 0.75) == 7.0


def test_prediction_is_per_tenant_then_per_tool_then_the_default() -> None:
    durations = ToolDurations(min_samples=3)
    policy = ToolKVPolicy(quantile=0.75, default_tool_s=2.0)
    for seconds in (10.0, 20.0, 30.0, 40.0):
        durations.record("acme", "run_tests", seconds)
    durations.record("other", "run_tests", 100.0)
    # acme's own four samples: p75 of 10, 20, 30, 40.
    assert policy.predict(durations, "acme", ["run_tests"]) == (pytest.approx(32.5), "tenant")
    # "other" has one sample of its own, too few: every tenant's five samples of the tool.
    assert policy.predict(durations, "other", ["run_tests"]) == (pytest.approx(40.0), "tool")
    assert policy.predict(durations, "acme", ["grep"]) == (2.0, "default")
    # Calls of one turn run side by side: the slowest tool's prediction counts.
    for seconds in (1.0, 1.0, 1.0):
        durations.record("acme", "grep", seconds)
    assert policy.predict(durations, "acme", ["grep", "run_tests"])[0] == pytest.approx(32.5)


def test_short_tools_keep_the_kv_long_ones_offload_and_prefetch_before_the_return() -> None:
    # 100k tokens of 128 KiB at 20 GB/s: 0.66 s to load back.
    policy = ToolKVPolicy(kv_bytes_per_token=131_072, load_bytes_per_s=20e9, keep_below_s=2.0, landing_margin_s=0.5)
    short = policy.decide(0.5, 100_000, source="tool", tools=["grep"])
    assert (short.action, short.fire_in_s) == ("keep", 0.0)
    assert short.retain_s == pytest.approx(0.5 * 1.5 + 1.0)  # protected only while the prediction holds
    long = policy.decide(30.0, 100_000)
    assert long.action == "offload"
    assert long.load_s == pytest.approx(100_000 * 131_072 / 20e9)
    assert long.fire_in_s == pytest.approx(30.0 - long.load_s - 0.5)
    assert long.detail()["action"] == "offload"
    # A tool longer than keep_below_s but shorter than twice the load: a prefetch could not hide the load.
    slow_link = ToolKVPolicy(kv_bytes_per_token=131_072, load_bytes_per_s=2e9)  # 6.6 s to load 100k tokens
    assert slow_link.decide(10.0, 100_000).action == "keep"
    assert slow_link.decide(20.0, 100_000).action == "offload"


# Two kinds of call, as in the replay's agent-long workload: 55% return at once, 45% after 9-12 s.
BIMODAL = [0.01, 0.012, 0.008, 0.01, 0.015, 0.011, 9.0, 10.0, 11.0, 12.0, 0.009]


def test_a_bimodal_tool_is_kept_for_its_short_kind_then_prefetched_for_its_long_kind() -> None:
    policy = ToolKVPolicy(kv_bytes_per_token=131_072, load_bytes_per_s=20e9)
    load_s = policy.load_s(10_000)
    # One p75 of the whole (about 10 s) would offload every call, the 0.01 s ones too.
    assert policy.decide(quantile(BIMODAL, 0.75), 10_000).action == "offload"
    plan = policy.decide_samples(BIMODAL, 10_000, source="tenant", tools=["bash"])
    assert plan.action == "keep_then_offload"
    short = sorted(BIMODAL)[:7]
    assert plan.short_share == pytest.approx(7 / 11)
    assert plan.short_s == pytest.approx(quantile(short, 0.9))
    assert plan.retain_s == pytest.approx(quantile(short, 0.9) * 1.5 + 1.0)  # the short kind's retain, decaying
    assert plan.predicted_s == pytest.approx(quantile([9.0, 10.0, 11.0, 12.0], 0.25))  # 9.75: the long kind
    assert plan.fire_in_s == pytest.approx(9.75 - load_s - 0.5)
    detail = plan.detail()
    assert detail["action"] == "keep_then_offload"
    assert detail["plan"] == {
        "short_s": round(plan.short_s, 3),
        "short_share": 0.636,
        "long_s": 9.75,
        "retain_s": round(plan.retain_s, 3),
        "prefetch_in_s": round(9.75 - load_s - 0.5, 3),
    }
    # The prefetch never fires before the retain lapses (a long kind barely above the threshold).
    near = policy.decide_samples([1.0, 1.0, 1.0, 2.1], 10_000)
    assert near.action == "keep_then_offload"
    assert near.fire_in_s == pytest.approx(near.retain_s)


def test_one_kind_of_call_keeps_the_plain_keep_and_offload() -> None:
    policy = ToolKVPolicy(kv_bytes_per_token=131_072, load_bytes_per_s=20e9)
    short = policy.decide_samples([0.01, 0.02, 0.5, 1.0], 10_000)
    assert (short.action, short.predicted_s, short.short_share) == ("keep", pytest.approx(0.625), None)
    assert "plan" not in short.detail()
    long = policy.decide_samples([9.0, 10.0, 11.0, 12.0], 10_000)
    assert (long.action, long.predicted_s) == ("offload", pytest.approx(11.25))
    # A few short calls among long ones (under `keep_share`): the long kind decides.
    mostly_long = policy.decide_samples([0.01, 9.0, 10.0, 11.0, 12.0], 10_000)
    assert mostly_long.action == "offload"
    # A rare long call (under `min_mode_share`): the short kind decides.
    rare_long = policy.decide_samples([0.01] * 19 + [30.0], 10_000)
    assert rare_long.action == "keep"


def test_too_few_samples_plan_on_the_default() -> None:
    policy = ToolKVPolicy(default_tool_s=2.0)
    durations = ToolDurations(min_samples=3)
    for seconds in (0.01, 10.0):  # two samples of a bimodal tool: too few to read two kinds from
        durations.record("acme", "bash", seconds)
    plan = policy.plan(durations, "acme", ["bash"], 1_000)
    assert (plan.action, plan.source, plan.predicted_s) == ("keep", "default", 2.0)
    durations.record("acme", "bash", 0.01)
    plan = policy.plan(durations, "acme", ["bash"], 1_000)
    assert (plan.action, plan.source) == ("keep_then_offload", "tenant")
    assert plan.predicted_s == 10.0


def test_result_gaps_are_a_bounded_median_per_tenant() -> None:
    gaps = ResultGaps(max_samples=3, min_samples=2, max_keys=2)
    gaps.record("acme", 0.004)
    assert gaps.median("acme") is None  # too few
    gaps.record("acme", 0.006)
    assert gaps.median("acme") == pytest.approx(0.005)
    for seconds in (5.0, 5.0, 5.0):  # only the newest three count
        gaps.record("acme", seconds)
    assert gaps.median("acme") == 5.0
    gaps.record("b", 1.0)
    gaps.record("c", 1.0)  # a third tenant: the least recently recorded one goes
    assert gaps.median("acme") is None
    policy = ToolKVPolicy(kv_bytes_per_token=131_072, load_bytes_per_s=20e9, early_margin_s=0.05)
    load_s = policy.load_s(10_000)  # 0.066 s
    assert policy.early_fire_lands(None, 10_000)  # unknown: fire as before
    assert not policy.early_fire_lands(0.005, 10_000)  # results posted right before the turn
    assert policy.early_fire_lands(load_s + 0.06, 10_000)


# --- through the app -------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def _fake_clock(gw: Gateway) -> FakeClock:
    clock = FakeClock()
    gw.state.advisor.clock = clock
    return clock


async def _tool_turn(gw: Gateway, session: str) -> tuple[dict[str, Any], str]:
    response = await gw.client.post(
        "/v1/chat/completions",
        json={"messages": [USER], "tools": RUN_TESTS, "tool_choice": "required"},
        headers={"X-Session-Id": session},
    )
    assert response.status_code == 200, response.text
    return response.json(), gw.name_of(response.headers["x-sessiongate-worker"])


async def _tool_call_advisory(gw: Gateway, session: str) -> Any:
    async def made() -> bool:
        return any(a.kind == "tool_call" for a in await _advisories(gw, session))

    await eventually(made)
    (advisory,) = [a for a in await _advisories(gw, session) if a.kind == "tool_call"]
    return advisory


async def _next_turn(gw: Gateway, session: str, first: dict[str, Any]) -> dict[str, Any]:
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    tool = {"role": "tool", "tool_call_id": call["id"], "content": "3 passed"}
    response = await gw.client.post(
        "/v1/chat/completions",
        json={"messages": [USER, message, tool], "tools": RUN_TESTS},
        headers={"X-Session-Id": session},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    body["worker"] = gw.name_of(response.headers["x-sessiongate-worker"])
    return body


def _prefetches(gw: Gateway) -> dict[str, int]:
    return {name: len(w.prefetches) for name, w in gw.workers.items()}


@pytest.mark.anyio
async def test_a_long_tool_lets_the_kv_go_and_prefetches_it_to_the_routers_pick_before_the_return(
    make_gateway: Any,
) -> None:
    async with make_gateway(**{**FAST, "advisory_ttl_s": 5.0}) as gw:
        clock = _fake_clock(gw)
        for seconds in (28.0, 30.0, 30.0, 32.0):
            gw.state.advisor.tool_durations.record("default", "run_tests", seconds)
        first, home = await _tool_turn(gw, "long-1")
        other = "worker-b" if home == "worker-a" else "worker-a"
        advisory = await _tool_call_advisory(gw, "long-1")
        decision = advisory.detail["tool_kv"]
        assert (decision["action"], decision["source"], decision["predicted_s"]) == ("offload", "tenant", 30.5)
        assert decision["fire_in_s"] == pytest.approx(30.5 - decision["load_s"] - 0.5, abs=1e-3)
        assert not any(w.kv_requests for w in gw.workers.values())  # nothing holds the KV through the tool

        gw.workers[home].queued = 40  # while the tool runs, the session's worker gets busy
        clock.now += decision["fire_in_s"] - 1.0
        await eventually(lambda: _reports_seen(gw, home))
        assert _prefetches(gw) == {"worker-a": 0, "worker-b": 0}  # not yet: a second before the planned time
        clock.now += 1.01
        await eventually(lambda: _prefetched_on(gw, other))  # fired on time, at the router's pick then
        assert gw.workers[home].prefetches == {}
        # The worker learns when the turn is expected (the predicted return), which ranks the prefetch's pages
        # among other live hints': the one expected first keeps its pages.
        (sent,) = (entry["request"] for entry in gw.workers[other].prefetches.values())
        assert sent.expected_in_ms == pytest.approx((decision["load_s"] + 0.5 - 0.01) * 1000, abs=2)

        second = await _next_turn(gw, "long-1", first)
        assert second["worker"] == other
        (settled,) = await _settled(gw, "long-1")
        # The store keeps the worker planned at the tool call (a retarget is logged, not written back).
        assert (settled.kind, settled.outcome, gw.name_of(settled.target_worker)) == ("tool_call", "used", home)


async def _reports_seen(gw: Gateway, worker: str) -> bool:
    return any(w.id == gw.ids[worker] and w.queued == 40 for w in gw.state.router.candidates())


async def _prefetched_on(gw: Gateway, worker: str) -> bool:
    return bool(gw.workers[worker].prefetches)


@pytest.mark.anyio
async def test_a_tool_result_before_the_predicted_return_fires_the_prefetch_at_once(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        clock = _fake_clock(gw)
        for _ in range(3):
            gw.state.advisor.tool_durations.record("default", "run_tests", 60.0)
        first, _ = await _tool_turn(gw, "early-1")
        advisory = await _tool_call_advisory(gw, "early-1")
        assert advisory.detail["tool_kv"]["action"] == "offload"
        clock.now += 2.0  # the tool was predicted to take a minute; it returns after two seconds
        call = first["choices"][0]["message"]["tool_calls"][0]
        result = await gw.client.post(
            "/v1/sessions/early-1/tool_results", json={"tool_call_id": call["id"], "content": "3 passed"}
        )
        assert result.status_code == 202, result.text
        answer = result.json()["advisory"]
        assert (answer["state"], answer["kind"], answer["id"]) == ("fired", "tool_call", advisory.id)
        await eventually(lambda: _any_done(gw))
        assert gw.state.advisor.stats.report()["tool_kv"] == {"offload": 1, "early": 1}  # admin advisories/stats
        second = await _next_turn(gw, "early-1", first)
        (settled,) = await _settled(gw, "early-1")
        assert settled.outcome == "used"
        assert settled.turn_id == second["sessiongate"]["turn_id"]
        # The store's duration of the call was learned for the tenant and the tool.
        assert gw.state.advisor.tool_durations.predict("default", ["run_tests"], 0.0) is not None


async def _any_done(gw: Gateway) -> bool:
    return any(p["state"] == "done" for w in gw.workers.values() for p in w.prefetches.values())


@pytest.mark.anyio
async def test_a_short_tool_keeps_the_kv_on_its_device_with_a_retain_that_decays(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        _fake_clock(gw)
        for seconds in (0.4, 0.5, 0.6):
            gw.state.advisor.tool_durations.record("default", "run_tests", seconds)
        first, home = await _tool_turn(gw, "short-1")
        advisory = await _tool_call_advisory(gw, "short-1")
        decision = advisory.detail["tool_kv"]
        assert (decision["action"], decision["predicted_s"]) == ("keep", 0.55)

        async def retained() -> bool:
            return bool(gw.workers[home].kv_requests)

        await eventually(retained)
        (request,) = gw.workers[home].kv_requests
        assert gw.workers[home].kv_ops == [("retain", "short-1")]
        assert request.ttl_ms == round((0.55 * 1.5 + 1.0) * 1000)  # a soft priority for the predicted time only
        assert request.priority == 1  # the session's priority (0 by default) raised by one while it holds
        assert _prefetches(gw) == {"worker-a": 0, "worker-b": 0}
        second = await _next_turn(gw, "short-1", first)
        assert second["worker"] == home
        (settled,) = await _settled(gw, "short-1")
        assert settled.outcome == "used"


@pytest.mark.anyio
async def test_a_keep_whose_worker_holds_none_of_the_kv_falls_back_to_a_prefetch_there(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        _fake_clock(gw)
        for worker in gw.workers.values():
            worker.prefix_cache = False  # the workers remember nothing: a retain finds no page of the session
        _, home = await _tool_turn(gw, "gone-1")
        advisory = await _tool_call_advisory(gw, "gone-1")
        assert advisory.detail["tool_kv"]["action"] == "keep"
        await eventually(lambda: _prefetched_on(gw, home))
        assert gw.workers[home].kv_ops == [("retain", "gone-1")]


@pytest.mark.anyio
async def test_a_hint_left_live_during_the_turn_gives_way_to_the_tool_calls_decision(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        _fake_clock(gw)
        for worker in gw.workers.values():
            worker.token_delay_s = 0.05  # a slow answer: the client's typing hint lands while it runs
        await gw.client.post("/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "stale-1"})
        turn = asyncio.create_task(_tool_turn(gw, "stale-1"))
        await asyncio.sleep(0.02)
        typing = await gw.client.post("/v1/sessions/stale-1/typing", json={"state": "started"})
        assert typing.json()["state"] == "fired"
        await turn
        advisory = await _tool_call_advisory(gw, "stale-1")
        assert advisory.detail["tool_kv"]["action"] == "keep"
        (stale,) = [a for a in await _advisories(gw, "stale-1") if a.kind == "typing"]

        async def cancelled() -> bool:
            (now,) = [a for a in await _advisories(gw, "stale-1") if a.id == stale.id]
            return bool(now.outcome == "cancelled")

        await eventually(cancelled)


@pytest.mark.anyio
async def test_with_the_lifecycle_off_a_tool_call_leaves_the_kv_to_the_workers(make_gateway: Any) -> None:
    """`advisory_tool_kv=False` (a baseline gateway in the replay): no advisory, no retain, no prefetch."""
    async with make_gateway(**FAST, advisory_tool_kv=False) as gw:
        for seconds in (0.4, 0.5, 0.6):  # a short tool: the lifecycle, were it on, would retain at once
            gw.state.advisor.tool_durations.record("default", "run_tests", seconds)
        first, _ = await _tool_turn(gw, "off-1")
        assert first["choices"][0]["message"]["tool_calls"]
        await asyncio.sleep(0.2)  # what on_turn_end would have started, in the background
        assert await _advisories(gw, "off-1") == []
        assert gw.state.advisor.stats.report()["tool_kv"] == {}
        assert not any(w.kv_requests or w.prefetches for w in gw.workers.values())
        # The store still records the call, and its result from the next request.
        (pending,) = await gw.state.store.pending_tool_calls("off-1", tenant_id="default")
        assert pending.name == "run_tests"
        await _next_turn(gw, "off-1", first)
        assert await gw.state.store.pending_tool_calls("off-1", tenant_id="default") == []
        assert await _advisories(gw, "off-1") == []


@pytest.mark.anyio
async def test_a_bimodal_tool_retains_then_lets_go_and_prefetches_for_the_long_return(make_gateway: Any) -> None:
    async with make_gateway(**{**FAST, "advisory_ttl_s": 5.0}) as gw:
        clock = _fake_clock(gw)
        for seconds in BIMODAL:
            gw.state.advisor.tool_durations.record("default", "run_tests", seconds)
        first, home = await _tool_turn(gw, "both-1")
        other = "worker-b" if home == "worker-a" else "worker-a"
        advisory = await _tool_call_advisory(gw, "both-1")
        decision = advisory.detail["tool_kv"]
        assert (decision["action"], decision["predicted_s"]) == ("keep_then_offload", 9.75)
        assert decision["plan"]["prefetch_in_s"] == decision["fire_in_s"]

        async def retained() -> bool:
            return bool(gw.workers[home].kv_ops)

        await eventually(retained)  # the short kind: retained where it is, at once
        assert gw.workers[home].kv_ops == [("retain", "both-1")]
        assert gw.state.advisor.reservation("both-1") is None  # resident there: the router's score sees it

        clock.now += decision["retain_s"] + 0.01  # the session did not come back within the short kind

        async def lapsed() -> bool:
            return gw.state.advisor.stats.report()["tool_kv"].get("retain_lapsed") == 1

        await eventually(lapsed)
        assert gw.state.advisor.reservation("both-1") is None  # unprotected, the router free
        assert _prefetches(gw) == {"worker-a": 0, "worker-b": 0}

        gw.workers[home].queued = 40  # the session's worker gets busy meanwhile
        await eventually(lambda: _reports_seen(gw, home))
        clock.now += decision["fire_in_s"] - decision["retain_s"]
        await eventually(lambda: _prefetched_on(gw, other))  # the long kind's prefetch, at the router's pick then
        await eventually(lambda: _any_done(gw))
        second = await _next_turn(gw, "both-1", first)
        assert second["worker"] == other
        (settled,) = await _settled(gw, "both-1")
        assert (settled.kind, settled.outcome) == ("tool_call", "used")
        report = gw.state.advisor.stats.report()
        assert report["tool_kv"] == {"keep_then_offload": 1, "retain_lapsed": 1}


@pytest.mark.anyio
async def test_a_tool_result_during_the_retain_drops_the_long_kinds_prefetch(make_gateway: Any) -> None:
    """The short kind returned, but the turn comes a while after its result: the retain must not lapse into the
    prefetch planned for the long kind's return, after the tool has returned; the turn uses the retained KV."""
    async with make_gateway(**{**FAST, "advisory_ttl_s": 5.0}) as gw:
        clock = _fake_clock(gw)
        for seconds in BIMODAL:
            gw.state.advisor.tool_durations.record("default", "run_tests", seconds)
        first, home = await _tool_turn(gw, "ret-1")
        advisory = await _tool_call_advisory(gw, "ret-1")
        decision = advisory.detail["tool_kv"]
        assert decision["action"] == "keep_then_offload"

        async def retained() -> bool:
            return bool(gw.workers[home].kv_ops)

        await eventually(retained)
        call = first["choices"][0]["message"]["tool_calls"][0]
        posted = await gw.client.post(
            "/v1/sessions/ret-1/tool_results", json={"tool_call_id": call["id"], "content": "3 passed"}
        )
        assert posted.status_code == 202, posted.text
        assert (posted.json()["advisory"]["state"], posted.json()["advisory"]["id"]) == ("refreshed", advisory.id)

        clock.now += decision["fire_in_s"] + 0.01  # past the retain and past the long kind's planned prefetch
        await asyncio.sleep(0.3)  # the advisor's ticks run
        assert _prefetches(gw) == {"worker-a": 0, "worker-b": 0}
        second = await _next_turn(gw, "ret-1", first)
        assert second["worker"] == home
        (settled,) = await _settled(gw, "ret-1")
        assert (settled.kind, settled.outcome) == ("tool_call", "used")
        assert gw.state.advisor.stats.report()["tool_kv"] == {"keep_then_offload": 1, "returned_in_retain": 1}


@pytest.mark.anyio
async def test_a_tool_result_too_close_to_its_turn_does_not_fire_the_prefetch(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        clock = _fake_clock(gw)
        advisor = gw.state.advisor
        advisor.result_gaps = ResultGaps(min_samples=1)
        for _ in range(3):
            advisor.tool_durations.record("default", "run_tests", 60.0)

        async def result_then_turn(session: str) -> tuple[dict[str, Any], Any]:
            first, _ = await _tool_turn(gw, session)
            advisory = await _tool_call_advisory(gw, session)
            assert advisory.detail["tool_kv"]["action"] == "offload"
            clock.now += 2.0
            call = first["choices"][0]["message"]["tool_calls"][0]
            posted = await gw.client.post(
                f"/v1/sessions/{session}/tool_results", json={"tool_call_id": call["id"], "content": "3 passed"}
            )
            assert posted.status_code == 202, posted.text
            answer = posted.json()["advisory"]
            await _next_turn(gw, session, first)  # the SDK's flow: the result, then at once the next turn
            return answer, advisory

        # Nothing known of this tenant's gaps yet: the result fires the prefetch, and the turn teaches the gap (0 s).
        answer, _ = await result_then_turn("close-1")
        assert answer["state"] == "fired"
        assert advisor.result_gaps.median("default") == 0.0
        missed = advisor.stats.missed

        answer, advisory = await result_then_turn("close-2")
        assert (answer["state"], answer["reason"], answer["id"]) == ("skipped", "cannot_land", advisory.id)
        (settled,) = await _settled(gw, "close-2")
        assert settled.outcome == "cancelled"  # withdrawn unfired: no outcome the adaptive rule judges
        assert advisor.stats.missed == missed  # the turn was foreseen, not missed

        # close-1's fired prefetch is a task of its own, which a loaded machine may not have run to its send yet.
        async def sent() -> bool:
            return _prefetches(gw)["worker-a"] + _prefetches(gw)["worker-b"] >= 1

        await eventually(sent)
        assert _prefetches(gw)["worker-a"] + _prefetches(gw)["worker-b"] == 1  # close-1's only
        clock.now += 120.0  # the planned fire time passes: nothing is left to fire
        await asyncio.sleep(0.2)
        assert _prefetches(gw)["worker-a"] + _prefetches(gw)["worker-b"] == 1
        assert advisor.stats.report()["tool_kv"] == {"offload": 2, "early": 1, "early_skipped": 1}


@pytest.mark.anyio
async def test_a_tool_result_that_cannot_land_starts_no_prefetch_of_its_own(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        clock = _fake_clock(gw)
        advisor = gw.state.advisor
        advisor.result_gaps = ResultGaps(min_samples=1)
        advisor.result_gaps.record("default", 0.0)  # this tenant sends each turn as soon as it posted the result
        for _ in range(3):
            advisor.tool_durations.record("default", "run_tests", 60.0)
        first, _ = await _tool_turn(gw, "none-1")
        advisory = await _tool_call_advisory(gw, "none-1")
        clock.now += 60.0 + 5.0 + 1.0  # the tool outlived the advisory's expiry: settled wasted, none live
        (expired,) = await _settled(gw, "none-1")
        assert (expired.id, expired.outcome) == (advisory.id, "wasted")

        async def fired_before_expiry() -> bool:  # the same tick fired its prefetch, then expired it
            return sum(_prefetches(gw).values()) == 1

        await eventually(fired_before_expiry)
        prefetched = _prefetches(gw)
        call = first["choices"][0]["message"]["tool_calls"][0]
        posted = await gw.client.post(
            "/v1/sessions/none-1/tool_results", json={"tool_call_id": call["id"], "content": "3 passed"}
        )
        assert posted.json()["advisory"] == {"object": "advisory", "state": "skipped", "reason": "cannot_land"}
        await _next_turn(gw, "none-1", first)
        assert _prefetches(gw) == prefetched  # the expired one's only
        assert [a.id for a in await _advisories(gw, "none-1") if a.kind == "tool_result"] == []
        assert advisor.stats.report()["tool_kv"]["early_skipped"] == 1

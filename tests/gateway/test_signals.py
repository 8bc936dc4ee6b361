"""Signals become advisory prefetches: through the real app, against fake workers speaking the extension."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from sessiongate.gateway.advisor import sign

from .conftest import Gateway

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "plan a trip to Lisbon for three days"}
FAST = {"load_poll_interval_s": 0.02, "advisory_ttl_s": 5.0}


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _turn(gw: Gateway, session: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    response = await gw.client.post(
        "/v1/chat/completions", json={"messages": messages}, headers={"X-Session-Id": session}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    body["worker"] = response.headers["x-sessiongate-worker"]
    return body


async def _advisories(gw: Gateway, session: str) -> list[Any]:
    return list(await gw.state.store.list_advisories(session, tenant_id="default"))


async def _settled(gw: Gateway, session: str, count: int = 1) -> list[Any]:
    async def done() -> bool:
        return sum(a.outcome != "pending" for a in await _advisories(gw, session)) >= count

    await eventually(done)
    return await _advisories(gw, session)


async def test_typing_prefetches_on_the_least_loaded_worker_and_the_turn_uses_it(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        first = await _turn(gw, "typing-1", [USER])
        home = gw.name_of(first["worker"])
        other = "worker-b" if home == "worker-a" else "worker-a"
        gw.workers[home].queued = 40  # the session's worker gets busy (its load report says so)
        await asyncio.sleep(0.1)

        answer = await gw.client.post("/v1/sessions/typing-1/typing", json={"state": "started"})
        assert answer.status_code == 202
        advisory = answer.json()
        assert advisory["state"] == "fired"
        assert advisory["worker"] == gw.ids[other]
        assert advisory["target"] == "device"

        async def prefetched() -> bool:
            return any(p["state"] == "done" for p in gw.workers[other].prefetches.values())

        await eventually(prefetched)

        async def believed_resident() -> bool:
            kv = gw.state.router.belief.residency("typing-1", gw.state.router.clock())
            return kv.device.get(gw.ids[other], 0) > 0

        await eventually(believed_resident)  # the prefetch outcome updated where the KV is believed to be
        sent = next(iter(gw.workers[other].prefetches.values()))["request"]
        assert sent.session_id == "typing-1"
        assert [m["role"] for m in sent.messages] == ["user", "assistant"]  # the session's context

        second = await _turn(gw, "typing-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "go"}])
        assert second["worker"] == gw.ids[other]
        details = second["usage"]["prompt_tokens_details"]["cached_tokens_details"]
        assert details["device"] > 0  # the prefetch brought it from the pool to the device
        (settled,) = await _settled(gw, "typing-1")
        assert settled.kind == "typing"
        assert settled.outcome == "used"
        assert settled.turn_id == second["sessiongate"]["turn_id"]


async def test_request_before_the_prefetch_finished_is_late(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        first = await _turn(gw, "late-1", [USER])
        for worker in gw.workers.values():
            worker.prefetch_delay_s = 30
        advisory = (await gw.client.post("/v1/sessions/late-1/typing", json={"state": "started"})).json()
        second = await _turn(gw, "late-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "go"}])
        assert second["worker"] == advisory["worker"]  # the reservation held
        (settled,) = await _settled(gw, "late-1")
        assert settled.outcome == "late"


async def test_typing_is_debounced_and_expires_as_wasted(make_gateway: Any) -> None:
    # The hint lives 2 s: long enough that the second signal finds it alive on a loaded machine (at 0.3 s a CI run
    # once fired a new one), short enough to expire within the wait below.
    async with make_gateway(**{**FAST, "advisory_ttl_s": 2.0}) as gw:
        await _turn(gw, "waste-1", [USER])
        first = (await gw.client.post("/v1/sessions/waste-1/typing", json={"state": "started"})).json()
        again = (await gw.client.post("/v1/sessions/waste-1/typing", json={"state": "started"})).json()
        assert again["state"] == "refreshed"
        assert again["id"] == first["id"]
        await eventually(lambda: _any_prefetch(gw))
        assert sum(len(w.prefetches) for w in gw.workers.values()) == 1
        (settled,) = await _settled(gw, "waste-1")
        assert settled.outcome == "wasted"
        # Its finished prefetch is cancelled on its worker: the pages no longer rank as a live hint's there.
        (prefetch,) = (p for w in gw.workers.values() for p in w.prefetches.values())
        await eventually(lambda: _true("cancelled_at" in prefetch))
        assert prefetch["state"] == "done"


async def _true(value: bool) -> bool:
    return value


async def test_a_turn_that_went_elsewhere_ends_its_hint_on_the_prefetchs_worker(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        first = await _turn(gw, "elsewhere-1", [USER])
        typing = (await gw.client.post("/v1/sessions/elsewhere-1/typing", json={"state": "started"})).json()
        hinted = gw.name_of(typing["worker"])
        other = "worker-b" if hinted == "worker-a" else "worker-a"

        async def done() -> bool:
            return any(p["state"] == "done" for p in gw.workers[hinted].prefetches.values())

        await eventually(done)
        gw.workers[hinted].queued = 40  # the hinted worker got busy: the turn goes to the other one
        await eventually(
            lambda: _true(gw.state.router.candidates()[0].queued + gw.state.router.candidates()[1].queued == 40)
        )
        answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
        second = await _turn(gw, "elsewhere-1", [USER, answer, {"role": "user", "content": "and then?"}])
        assert gw.name_of(second["worker"]) == other
        (prefetch,) = gw.workers[hinted].prefetches.values()
        await eventually(lambda: _true("cancelled_at" in prefetch))
        (settled,) = await _settled(gw, "elsewhere-1")
        assert settled.outcome == "wasted"


async def test_typing_stopped_cancels_after_the_grace(make_gateway: Any) -> None:
    async with make_gateway(**FAST, advisory_stop_grace_s=0.1) as gw:
        await _turn(gw, "stop-1", [USER])
        await gw.client.post("/v1/sessions/stop-1/typing", json={"state": "started"})
        stopped = (await gw.client.post("/v1/sessions/stop-1/typing", json={"state": "stopped"})).json()
        assert stopped["state"] == "stopping"
        (settled,) = await _settled(gw, "stop-1")
        assert settled.outcome == "cancelled"


async def test_unforeseen_follow_up_is_recorded_as_missed(gateway: Gateway) -> None:
    first = await _turn(gateway, "miss-1", [USER])
    await _turn(gateway, "miss-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "more"}])
    (missed,) = await _settled(gateway, "miss-1")
    assert (missed.kind, missed.outcome, missed.target_worker) == ("none", "missed", None)


async def test_missed_records_of_many_turns_are_one_store_write(gateway: Gateway, monkeypatch: Any) -> None:
    advisor = gateway.state.advisor
    advisor.missed_flush_s = 60.0  # flushed by hand below: the batch is exactly the turns sent meanwhile
    store = gateway.state.store
    batches: list[int] = []

    async def counting(missed: Any) -> int:
        batches.append(len(missed))
        return int(await type(store).record_missed_turns(store, missed))

    monkeypatch.setattr(store, "record_missed_turns", counting)

    async def two_turns(session: str) -> None:
        first = await _turn(gateway, session, [USER])
        await _turn(gateway, session, [USER, first["choices"][0]["message"], {"role": "user", "content": "more"}])

    await asyncio.gather(*(two_turns(f"batch-{i}") for i in range(3)))
    assert batches == []  # nothing written per turn
    await advisor.flush_missed()
    assert batches == [3]
    for i in range(3):
        (missed,) = await _advisories(gateway, f"batch-{i}")
        assert (missed.kind, missed.outcome) == ("none", "missed")


async def test_tool_calls_advise_and_tool_results_are_recorded(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
        first = await gw.client.post(
            "/v1/chat/completions",
            json={"messages": [USER], "tools": tools, "tool_choice": "required"},
            headers={"X-Session-Id": "tools-1"},
        )
        call = first.json()["choices"][0]["message"]["tool_calls"][0]

        async def tool_call_advisory() -> bool:
            return any(a.kind == "tool_call" for a in await _advisories(gw, "tools-1"))

        await eventually(tool_call_advisory)
        # No duration recorded yet: the default prediction is a short tool, so the KV is kept on the device where
        # it is (a retain, no prefetch); the retain carries the last turn's tools, so the worker renders the same
        # prompt.
        await eventually(lambda: _any_retain(gw))
        (sent,) = [r for w in gw.workers.values() for r in w.kv_requests]
        assert sent.tools == tools
        assert not any(w.prefetches for w in gw.workers.values())
        (advisory,) = await _advisories(gw, "tools-1")
        assert advisory.detail["tool_kv"]["action"] == "keep"

        result = await gw.client.post(
            "/v1/sessions/tools-1/tool_results", json={"tool_call_id": call["id"], "content": "found it"}
        )
        assert result.status_code == 202
        body = result.json()
        assert body["name"] == "search"
        assert body["duration_ms"] >= 0
        assert body["advisory"]["state"] == "refreshed"  # the tool-call advisory is still live
        turns = (await gw.client.get("/v1/sessions/tools-1/turns")).json()["data"]
        assert turns[0]["tool_calls"][0]["result"] == "found it"
        unknown = await gw.client.post(
            "/v1/sessions/tools-1/tool_results", json={"tool_call_id": "nope", "content": ""}
        )
        assert unknown.status_code == 404


async def _any_prefetch(gw: Gateway) -> bool:
    return any(w.prefetches for w in gw.workers.values())


async def _any_retain(gw: Gateway) -> bool:
    return any(w.kv_requests for w in gw.workers.values())


async def test_an_outcome_settled_as_the_gateway_stops_is_written_before_it_stops(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_gateway(**FAST) as gw:
        first = await _turn(gw, "stopping", [USER])
        assert (await gw.client.post("/v1/sessions/stopping/advise", json={})).status_code == 202
        store = gw.state.store
        resolve = store.resolve_advisory

        async def slow_resolve(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.3)  # a store slow to take the outcome, as the gateway is told to stop
            return await resolve(*args, **kwargs)

        monkeypatch.setattr(store, "resolve_advisory", slow_resolve)
        follow_up = [USER, first["choices"][0]["message"], {"role": "user", "content": "and the museums"}]
        await _turn(gw, "stopping", follow_up)  # claims the advisory and settles it: its outcome is being written
        database_url = gw.database_url
    # The gateway has stopped (the advisor closed, the store disposed): the store holds the outcome.
    with sqlite3.connect(database_url.removeprefix("sqlite+aiosqlite:///")) as db:
        outcomes = [row[0] for row in db.execute("SELECT outcome FROM advisories WHERE kind = 'explicit'")]
    assert len(outcomes) == 1
    assert outcomes[0] in ("used", "late")


async def test_explicit_hint_with_expected_time_is_scheduled(make_gateway: Any) -> None:
    async with make_gateway(**FAST, advisory_lead_s=0.1) as gw:
        await _turn(gw, "hint-1", [USER])
        answer = await gw.client.post("/v1/sessions/hint-1/advise", json={"expected_in_ms": 300})
        assert answer.status_code == 202
        assert answer.json()["state"] == "scheduled"
        assert not await _any_prefetch(gw)
        await eventually(lambda: _any_prefetch(gw))
        (advisory,) = await _advisories(gw, "hint-1")
        assert advisory.kind == "explicit"
        assert advisory.detail == {"target": "device", "expected_in_ms": 300}
        bad = await gw.client.post("/v1/sessions/hint-1/advise", json={"kind": "weather"})
        assert bad.status_code == 400
        missing = await gw.client.post("/v1/sessions/nobody/advise", json={})
        assert missing.status_code == 404


async def test_a_worker_without_the_extension_never_fails_the_turn(make_gateway: Any) -> None:
    async with make_gateway(**FAST) as gw:
        for worker in gw.workers.values():
            worker.extension = False
        first = await _turn(gw, "noext-1", [USER])
        assert (await gw.client.post("/v1/sessions/noext-1/typing", json={"state": "started"})).status_code == 202

        async def prefetch_refused() -> bool:  # the worker answered 404: the reservation is dropped
            return gw.state.advisor.reservation("noext-1") is None

        await eventually(prefetch_refused)
        await _turn(gw, "noext-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "still?"}])
        (settled,) = await _settled(gw, "noext-1")
        assert settled.outcome == "wasted"  # the prefetch could not be made: the reservation was dropped


def _signed(secret: str, body: dict[str, Any], *, ts: float | None = None) -> tuple[bytes, dict[str, str]]:
    raw = orjson.dumps(body)
    stamp = str(int(ts if ts is not None else time.time()))
    return raw, {
        "x-sessiongate-timestamp": stamp,
        "x-sessiongate-signature": sign(secret, stamp, raw),
        "content-type": "application/json",
    }


async def test_typing_webhook_signature_window_and_replay(make_gateway: Any) -> None:
    async with make_gateway(**FAST, webhook_secret="hush") as gw:
        await _turn(gw, "hook-1", [USER])
        event = {"session_id": "hook-1", "state": "started", "ts": time.time()}
        raw, headers = _signed("hush", event)
        accepted = await gw.client.post("/v1/webhooks/typing", content=raw, headers=headers)
        assert accepted.status_code == 202
        assert accepted.json()["state"] == "fired"
        replayed = await gw.client.post("/v1/webhooks/typing", content=raw, headers=headers)
        assert replayed.status_code == 401
        assert "replayed" in replayed.json()["error"]["message"]

        raw, headers = _signed("wrong", event)
        assert (await gw.client.post("/v1/webhooks/typing", content=raw, headers=headers)).status_code == 401
        raw, headers = _signed("hush", event, ts=time.time() - 301)
        assert (await gw.client.post("/v1/webhooks/typing", content=raw, headers=headers)).status_code == 401
        missing = await gw.client.post("/v1/webhooks/typing", content=raw, headers={"content-type": "application/json"})
        assert missing.status_code == 401
        raw, headers = _signed("hush", {**event, "state": "stopped"})
        assert (await gw.client.post("/v1/webhooks/typing", content=raw, headers=headers)).json()["state"] == "stopping"


async def test_typing_webhook_is_off_without_a_secret(gateway: Gateway) -> None:
    raw, headers = _signed("x", {"session_id": "s", "state": "started"})
    assert (await gateway.client.post("/v1/webhooks/typing", content=raw, headers=headers)).status_code == 404


async def test_typing_for_unknown_session_and_bad_state(gateway: Gateway) -> None:
    assert (await gateway.client.post("/v1/sessions/ghost/typing", json={"state": "started"})).status_code == 404
    await _turn(gateway, "known", [USER])
    bad = await gateway.client.post("/v1/sessions/known/typing", json={"state": "maybe"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "state"


async def test_concurrent_signals_of_one_session_make_one_advisory(make_gateway: Any) -> None:
    """Two signals at once: the second finds the first's advisory live and refreshes it, so there is one
    advisory, one prefetch, and it settles (before, each made its own, both prefetched, and the one overwritten
    in the advisor's book stayed pending forever). The store is slowed down, so the signals overlap. The hint lives
    2 s, so that on a loaded machine the last signal still finds the first's advisory alive."""
    async with make_gateway(**{**FAST, "advisory_ttl_s": 2.0}) as gw:
        await _turn(gw, "both", [USER])
        store = gw.state.store
        create = store.create_advisory

        async def slow_create(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.05)  # a store farther away (PostgreSQL): the others arrive meanwhile
            return await create(*args, **kwargs)

        store.create_advisory = slow_create
        answers = await asyncio.gather(
            *(gw.client.post("/v1/sessions/both/typing", json={"state": "started"}) for _ in range(4))
        )
        assert all(a.status_code == 202 for a in answers)
        assert sorted(a.json()["state"] for a in answers) == ["fired", "refreshed", "refreshed", "refreshed"]
        (advisory,) = await _settled(gw, "both")  # unused, it expires: wasted, not pending
        assert advisory.outcome == "wasted"
        assert sum(len(w.prefetches) for w in gw.workers.values()) == 1

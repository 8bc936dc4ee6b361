"""Two replicas, one client alternating between them: with Redis they behave as one gateway; each on its own
(LocalShared) they show the single-process behaviour the docs describe (docs/architecture.md, "Replicas").
Every test runs both ways and asserts what the client and the store observe in each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest

from sessiongate.gateway.advisor import sign

from .conftest import WEBHOOK_SECRET, Replica

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "plan a trip to Lisbon for three days"}


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _turn(replica: Replica, session: str, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    response = await replica.client.post(
        "/v1/chat/completions", json={"messages": messages, **body}, headers={"X-Session-Id": session}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    answer["worker"] = response.headers["x-sessiongate-worker"]
    return answer


async def _outcomes(replica: Replica, session: str, count: int) -> list[str]:
    async def settled() -> bool:
        records = await replica.state.store.list_advisories(session, tenant_id="default")
        return sum(r.outcome != "pending" for r in records) >= count

    await eventually(settled)
    return sorted(r.outcome for r in await replica.state.store.list_advisories(session, tenant_id="default"))


async def test_typing_hint_on_one_replica_is_used_by_the_turn_on_the_other(make_replicas: Any) -> None:
    async with make_replicas(advisory_ttl_s=1.0, admin_key="admin-key") as replicas:
        a, b = replicas.a, replicas.b
        first = await _turn(a, "hint-1", [USER])
        advisory = (await a.client.post("/v1/sessions/hint-1/typing", json={"state": "started"})).json()
        assert advisory["state"] == "fired"
        target = replicas.name_of(advisory["worker"])

        async def prefetched() -> bool:
            return any(p["state"] == "done" for p in replicas.workers[target].prefetches.values())

        await eventually(prefetched)
        await asyncio.sleep(0.1)  # the owner writes "ready" to the shared state once it has read the status

        second = await _turn(b, "hint-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "go"}])
        if replicas.distributed:
            # B claimed A's advisory: one advisory, used by the turn it foresaw; no turn missed.
            assert second["worker"] == advisory["worker"]
            assert await _outcomes(a, "hint-1", 1) == ["used"]
            await asyncio.sleep(1.2)  # past the advisory's expiry: A's copy must not settle it a second time
            assert await _outcomes(a, "hint-1", 1) == ["used"]
        else:
            # Each replica its own book: B saw no advisory (missed), A's expired unclaimed (wasted).
            assert await _outcomes(a, "hint-1", 2) == ["missed", "wasted"]
        await asyncio.sleep(0.1)  # each replica adds its counts to the shared ones at its next tick
        stats = (await b.client.get("/v1/admin/advisories/stats", headers={"Authorization": "Bearer admin-key"})).json()
        if replicas.distributed:  # A's signal and B's claim, one report from either replica
            assert stats["scope"] == "replicas"
            assert (stats["requests"], stats["missed"]) == (1, 0)
            assert stats["kinds"]["typing"]["outcomes"]["used"] == 1
            assert stats["kinds"]["typing"]["precision"] == 1.0
        else:  # B's own counts: one missed turn, no signal
            assert stats["scope"] == "replica"
            assert (stats["requests"], stats["missed"], stats["kinds"]) == (1, 1, {})


async def test_a_tenants_token_limit_holds_across_replicas(make_replicas: Any) -> None:
    limit = 100
    async with make_replicas(tenant_tokens_per_minute=limit) as replicas:
        words = " ".join(f"w{i}" for i in range(50))
        first = await _turn(replicas.a, "limit-1", [{"role": "user", "content": words}], max_tokens=8)
        used = first["usage"]["total_tokens"]
        assert limit / 2 <= used < limit  # one turn leaves either replica's own bucket positive, two do not
        await _turn(replicas.b, "limit-2", [{"role": "user", "content": words}], max_tokens=8)
        third = await replicas.b.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": words}], "max_tokens": 8},
            headers={"X-Session-Id": "limit-3"},
        )
        if replicas.distributed:
            assert third.status_code == 429, third.text
            assert third.json()["error"]["code"] == "tokens_per_minute_exceeded"
            assert float(third.headers["retry-after"]) > 0
        else:
            assert third.status_code == 200  # B counted only its own turn: up to twice the limit in all


async def test_a_signed_webhook_replayed_to_the_other_replica_is_refused(make_replicas: Any) -> None:
    async with make_replicas() as replicas:
        await _turn(replicas.a, "hook-1", [USER])
        body = orjson.dumps({"session_id": "hook-1", "state": "started"})
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            "x-sessiongate-timestamp": timestamp,
            "x-sessiongate-signature": sign(WEBHOOK_SECRET, timestamp, body),
        }
        accepted = await replicas.a.client.post("/v1/webhooks/typing", content=body, headers=headers)
        assert accepted.status_code == 202, accepted.text
        again_here = await replicas.a.client.post("/v1/webhooks/typing", content=body, headers=headers)
        assert again_here.status_code == 401  # either way, the replica that saw it refuses it
        replayed = await replicas.b.client.post("/v1/webhooks/typing", content=body, headers=headers)
        if replicas.distributed:
            assert replayed.status_code == 401, replayed.text
            assert replayed.json()["error"]["code"] == "invalid_signature"
            assert "replayed" in replayed.json()["error"]["message"]
        else:
            assert replayed.status_code == 202  # B's own replay cache never saw it


async def test_kv_belief_learned_on_one_replica_routes_the_other(make_replicas: Any) -> None:
    async with make_replicas() as replicas:
        a, b = replicas.a, replicas.b
        # Idle workers score the same for a new session and the policy rotates among them, each replica from its
        # own counter: one throwaway turn on A puts the session's first turn on the worker that B's rotation,
        # blind to where the KV is, would not pick for its first choice.
        await _turn(a, "throwaway", [{"role": "user", "content": "an unrelated question"}])
        first = await _turn(a, "kv-1", [USER])
        second = await _turn(b, "kv-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "more"}])
        details = second["usage"]["prompt_tokens_details"]["cached_tokens_details"]
        if replicas.distributed:
            assert second["worker"] == first["worker"]  # the worker holding the session's KV on its device
            assert details["device"] >= first["usage"]["prompt_tokens"]
        else:
            assert second["worker"] != first["worker"]  # B did not know; the KV came from the shared pool
            assert details["device"] < first["usage"]["prompt_tokens"]


async def test_with_redis_down_each_replica_decides_on_its_own_and_no_turn_fails(
    tmp_path: Any, free_port: Callable[[], int], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("redis", reason="redis-py is not installed (the `redis` extra)")
    from .conftest import running_replicas

    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: every call is refused
    async with running_replicas(tmp_path, redis_url=dead, advisory_ttl_s=1.0, tenant_tokens_per_minute=100) as rs:
        assert rs.distributed
        a = rs.a
        first = await _turn(a, "down-1", [USER])
        advisory = (await a.client.post("/v1/sessions/down-1/typing", json={"state": "started"})).json()
        assert advisory["state"] == "fired"
        target = rs.name_of(advisory["worker"])

        async def prefetched() -> bool:
            return any(p["state"] == "done" for p in rs.workers[target].prefetches.values())

        await eventually(prefetched)
        second = await _turn(a, "down-1", [USER, first["choices"][0]["message"], {"role": "user", "content": "go"}])
        assert second["worker"] == advisory["worker"]
        assert await _outcomes(a, "down-1", 1) == ["used"]  # this replica's own book claimed it

        body = orjson.dumps({"session_id": "down-1", "state": "stopped"})
        timestamp = str(int(time.time()))
        signature = sign(WEBHOOK_SECRET, timestamp, body)
        headers = {"x-sessiongate-timestamp": timestamp, "x-sessiongate-signature": signature}
        assert (await a.client.post("/v1/webhooks/typing", content=body, headers=headers)).status_code == 202
        assert (await a.client.post("/v1/webhooks/typing", content=body, headers=headers)).status_code == 401

        # The token limit falls back to this replica's bucket: two more turns of about 60 tokens empty it.
        words = " ".join(f"w{i}" for i in range(50))
        for session in ("down-2", "down-3"):
            await _turn(a, session, [{"role": "user", "content": words}], max_tokens=8)
        refused = await a.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": words}], "max_tokens": 8},
            headers={"X-Session-Id": "down-4"},
        )
        assert refused.status_code == 429


async def test_typing_on_both_replicas_makes_one_advisory_and_stops_through_either(make_replicas: Any) -> None:
    async with make_replicas(advisory_ttl_s=1.0, advisory_stop_grace_s=0.1) as replicas:
        a, b = replicas.a, replicas.b
        await _turn(a, "both-1", [USER])
        first = (await a.client.post("/v1/sessions/both-1/typing", json={"state": "started"})).json()
        again = (await b.client.post("/v1/sessions/both-1/typing", json={"state": "started"})).json()
        stopped = (await b.client.post("/v1/sessions/both-1/typing", json={"state": "stopped"})).json()
        assert stopped["state"] == "stopping"
        expected = 1 if replicas.distributed else 2

        async def prefetches_sent() -> bool:
            return sum(len(w.prefetches) for w in replicas.workers.values()) >= expected

        await eventually(prefetches_sent)
        await asyncio.sleep(0.1)
        prefetches = sum(len(w.prefetches) for w in replicas.workers.values())
        if replicas.distributed:
            assert (again["state"], again["id"]) == ("refreshed", first["id"])  # debounced across replicas
            assert prefetches == 1
            assert await _outcomes(a, "both-1", 1) == ["cancelled"]  # stopped on B, settled by its owner A
        else:
            assert again["state"] == "fired"
            assert again["id"] != first["id"]
            assert prefetches == 2
            assert await _outcomes(a, "both-1", 2) == ["cancelled", "wasted"]  # B's stopped, A's expired


RUN_TESTS = [{"type": "function", "function": {"name": "run_tests", "parameters": {"type": "object"}}}]


async def test_a_tool_result_on_the_other_replica_fires_the_scheduled_prefetch_early(make_replicas: Any) -> None:
    async with make_replicas(advisory_ttl_s=5.0) as replicas:
        a, b = replicas.a, replicas.b
        for replica in (a, b):  # a minute-long tool: the turn's tool call schedules its prefetch a minute ahead
            for _ in range(3):
                replica.state.advisor.tool_durations.record("default", "run_tests", 60.0)
        first = await _turn(a, "early-x", [USER], tools=RUN_TESTS, tool_choice="required")
        call = first["choices"][0]["message"]["tool_calls"][0]

        async def scheduled() -> bool:
            records = await a.state.store.list_advisories("early-x", tenant_id="default")
            return any(r.kind == "tool_call" for r in records)

        await eventually(scheduled)
        (planned,) = await a.state.store.list_advisories("early-x", tenant_id="default")
        assert planned.detail["tool_kv"]["action"] == "offload"

        # The tool returns after a second, and its result is posted to the replica that does not own the advisory.
        posted = await b.client.post(
            "/v1/sessions/early-x/tool_results", json={"tool_call_id": call["id"], "content": "3 passed"}
        )
        assert posted.status_code == 202, posted.text
        answer = posted.json()["advisory"]
        assert answer["state"] == "fired"

        async def prefetched() -> bool:
            return sum(len(w.prefetches) for w in replicas.workers.values()) >= 1

        await eventually(prefetched, timeout_s=3.0)  # now, not a minute later
        await asyncio.sleep(0.2)
        assert sum(len(w.prefetches) for w in replicas.workers.values()) == 1
        early = [r.state.advisor.stats.report()["tool_kv"].get("early", 0) for r in (a, b)]
        if replicas.distributed:
            # One advisory, A's: fired by its owner at B's request, early; every replica's view of it says so.
            assert answer["id"] == planned.id
            assert early == [1, 0]
            for replica in (a, b):
                record = await replica.state.shared.get_advisory("early-x")
                assert record is not None
                assert (record.id, record.owner.split("/")[0], record.fired, record.fired_early) == (
                    planned.id,
                    "replica-a",
                    True,
                    True,
                )
                assert record.fire_requested_at is not None
        else:
            # B knows nothing of A's advisory: the result makes a prefetch of its own; A's still waits for its time.
            assert answer["id"] != planned.id
            assert early == [0, 0]

        async def done() -> bool:
            return any(p["state"] == "done" for w in replicas.workers.values() for p in w.prefetches.values())

        await eventually(done)
        await asyncio.sleep(0.1)  # the owner writes "ready" to the shared state once it has read the status
        tool = {"role": "tool", "tool_call_id": call["id"], "content": "3 passed"}
        await _turn(b, "early-x", [USER, first["choices"][0]["message"], tool], tools=RUN_TESTS)
        if replicas.distributed:  # the turn on B claimed A's advisory, fired early: used
            assert await _outcomes(a, "early-x", 1) == ["used"]
        else:  # B's own prefetch was used; A's, unclaimed, is still waiting for its time
            assert await _outcomes(a, "early-x", 1) == ["pending", "used"]


def test_an_owner_polls_for_fire_requests_only_while_it_holds_a_scheduled_shared_advisory() -> None:
    from sessiongate.gateway.advisor.core import AdvisorBook, LiveAdvisory
    from sessiongate.gateway.advisor.quality import HintQuality
    from sessiongate.gateway.advisor.replicas import SharedAdvisories
    from sessiongate.gateway.shared import LocalShared

    replicas = SharedAdvisories(LocalShared(), replica="replica-a/run", unix=time.time, quality=HintQuality())
    book = AdvisorBook()
    advisory = LiveAdvisory(
        id="adv_1", session_id="s", tenant_id="t", kind="tool_call", worker_id="w", target="device",
        created_at=0.0, fire_at=60.0, expires_at=90.0,
    )  # fmt: skip
    book.add(advisory)
    assert not replicas.awaits_fire_requests(book)  # this replica's alone (Redis was down when it was made)
    advisory.shared = True
    assert replicas.awaits_fire_requests(book)  # scheduled and shared: another replica may ask for it
    advisory.fired = True
    assert not replicas.awaits_fire_requests(book)  # fired: nothing left to ask for

"""Load reports feed routing; a worker failing before its first byte is replaced once; policies by setting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from .conftest import Gateway

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hello there"}


async def _worker_for(gw: Gateway, session: str, *, stream: bool = False) -> str:
    response = await gw.client.post(
        "/v1/chat/completions", json={"messages": [USER], "stream": stream}, headers={"X-Session-Id": session}
    )
    assert response.status_code == 200, response.text
    return response.headers["x-sessiongate-worker"]


async def test_load_reports_reach_the_router(make_gateway: Any) -> None:
    async with make_gateway(load_poll_interval_s=0.02) as gw:
        gw.workers["worker-a"].queued = 30
        await asyncio.sleep(0.1)
        worker = gw.state.workers.get(gw.ids["worker-a"])
        assert worker.extension is True
        assert worker.load.queued_requests == 30
        views = {v.id: v for v in gw.state.router.candidates()}
        assert views[gw.ids["worker-a"]].load == 30
        assert views[gw.ids["worker-a"]].prefill_tokens_per_s == 5000.0
        # Every new session avoids the queue on worker a.
        assert {await _worker_for(gw, f"load-{i}") for i in range(4)} == {gw.ids["worker-b"]}


async def test_worker_without_extension_falls_back_to_in_flight_counts(make_gateway: Any) -> None:
    async with make_gateway(load_poll_interval_s=0.02) as gw:
        gw.workers["worker-a"].extension = False
        gw.workers["worker-a"].queued = 30  # not reported: the worker has no extension
        gw.workers["worker-b"].prefill_tokens_per_s = 4000.0  # as fast as the default assumed for worker a
        await asyncio.sleep(0.1)
        worker = gw.state.workers.get(gw.ids["worker-a"])
        assert worker.extension is False
        assert worker.load is None
        view = next(v for v in gw.state.router.candidates() if v.id == gw.ids["worker-a"])
        assert (view.running, view.load) == (None, 0)
        assert {await _worker_for(gw, f"noext-{i}") for i in range(4)} == set(gw.ids.values())


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "sticky", "cache_aware", "kv_aware"])
async def test_every_policy_serves_turns(make_gateway: Any, policy: str) -> None:
    async with make_gateway(routing_policy=policy) as gw:
        assert gw.state.router.policy.name == policy
        await _worker_for(gw, "p-1")
        await _worker_for(gw, "p-1", stream=True)


async def test_sticky_keeps_a_session_on_its_worker(make_gateway: Any) -> None:
    async with make_gateway(routing_policy="sticky") as gw:
        first = await _worker_for(gw, "st-1")
        assert {await _worker_for(gw, "st-1") for _ in range(3)} == {first}


@pytest.mark.parametrize("stream", [False, True])
async def test_worker_failing_before_first_byte_is_retried_on_another(make_gateway: Any, stream: bool) -> None:
    async with make_gateway() as gw:
        gw.workers["worker-a"].fail_status = 503
        for i in range(3):
            assert await _worker_for(gw, f"retry-{i}", stream=stream) == gw.ids["worker-b"]
            turns = (await gw.client.get(f"/v1/sessions/retry-{i}/turns")).json()["data"]
            assert [(t["status"], t["worker"]) for t in turns] == [("ok", gw.ids["worker-b"])]


async def test_both_workers_failing_fails_the_one_turn(make_gateway: Any) -> None:
    async with make_gateway() as gw:
        for worker in gw.workers.values():
            worker.fail_status = 503
        response = await gw.client.post(
            "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "both"}
        )
        assert response.status_code == 503
        turns = (await gw.client.get("/v1/sessions/both/turns")).json()["data"]
        assert [t["status"] for t in turns] == ["failed"]
        assert sum(len(w.requests) for w in gw.workers.values()) == 2  # one try each, no more


async def test_client_errors_are_not_retried(make_gateway: Any) -> None:
    async with make_gateway() as gw:
        for worker in gw.workers.values():
            worker.fail_status = 400
        response = await gw.client.post("/v1/chat/completions", json={"messages": [USER]})
        assert response.status_code == 400
        assert sum(len(w.requests) for w in gw.workers.values()) == 1

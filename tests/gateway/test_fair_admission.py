"""Fair admission through the real gateway app (gateway/turn/admission.py): the order in which queued turns reach the
worker, and turns shed at once (429/503 with Retry-After) that leave nothing in the store. Slots are held by turns
the fake worker never answers, released by cancelling them: ordering, not wall-clock thresholds."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.sdk import AsyncSessionGate

from .conftest import WORKER_NAMES, Gateway, running_gateway

pytestmark = pytest.mark.anyio

ADMIN = {"authorization": "Bearer admin-secret"}
# One worker: the slots are ADMISSION_MAX_ACTIVE_PER_WORKER.
ONE_WORKER: dict[str, Any] = {"worker_names": WORKER_NAMES[:1]}


def ask(session: str, text: str = "hello there") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"{session}: {text}"}], "max_tokens": 4}


async def chat(gw: Gateway, session: str, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    return await gw.client.post(
        "/v1/chat/completions", json={**ask(session), **extra}, headers={"x-session-id": session, **(headers or {})}
    )


class Recording(httpx.AsyncBaseTransport):
    """The gateway's transport, keeping every response it gives."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.responses: list[httpx.Response] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.responses.append(response)
        return response


async def until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 (polling the gateway's state: there is no event to wait on)
        await asyncio.sleep(0.005)


def spawn(coroutine: Coroutine[Any, Any, httpx.Response]) -> asyncio.Task[httpx.Response]:
    return asyncio.create_task(coroutine)


async def settle(tasks: list[asyncio.Task[httpx.Response]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def one_request_log(gw: Gateway) -> None:
    """Both workers append their chat requests to one list: the order the turns reached a worker."""
    shared: list[dict[str, Any]] = []
    for worker in gw.workers.values():
        worker.requests = shared


def sessions_at_worker(gw: Gateway) -> list[str]:
    """The session of each chat request the workers got, in the order they got them (`one_request_log`)."""
    bodies = next(iter(gw.workers.values())).requests
    return [str(body["messages"][-1]["content"]).split(":")[0] for body in bodies]


async def test_a_flood_from_one_session_does_not_delay_another_sessions_turn(tmp_path: Path) -> None:
    async with running_gateway(tmp_path, admission_max_active_per_worker=1, admission_max_wait_s=0, **ONE_WORKER) as gw:
        one_request_log(gw)
        for worker in gw.workers.values():
            worker.hang = True
        flood = [spawn(chat(gw, "flood"))]
        await until(lambda: gw.state.admission.active == 1)
        flood += [spawn(chat(gw, "flood")) for _ in range(7)]
        await until(lambda: gw.state.admission.waiting == 7)
        other = spawn(chat(gw, "other"))
        await until(lambda: gw.state.admission.waiting == 8)
        for worker in gw.workers.values():
            worker.hang = False
        flood[0].cancel()  # the turn holding the only slot ends (its client went away): the next one starts
        answer = await other
        assert answer.status_code == 200
        # The other session's turn went next, ahead of the seven the flood had queued before it.
        assert sessions_at_worker(gw)[:2] == ["flood", "other"]
        done = await asyncio.gather(*flood[1:])
        assert [r.status_code for r in done] == [200] * 7
        assert sessions_at_worker(gw)[2:] == ["flood"] * 7
        assert (gw.state.admission.active, gw.state.admission.waiting) == (0, 0)


async def test_a_shed_turn_gets_503_with_retry_after_and_leaves_nothing_stored(tmp_path: Path) -> None:
    async with running_gateway(
        tmp_path, admission_max_active_per_worker=1, admission_max_wait_s=0.000_001, **ONE_WORKER
    ) as gw:
        assert (await chat(gw, "warm")).status_code == 200  # a turn's active time is known now
        for worker in gw.workers.values():
            worker.hang = True
        holder = spawn(chat(gw, "holder"))
        await until(lambda: gw.state.admission.active == 1)
        shed = await chat(gw, "shed-me", headers={"idempotency-key": "k-1"})
        assert shed.status_code == 503
        assert shed.headers["retry-after"] == "1"
        error = shed.json()["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "gateway_saturated")
        assert gw.state.admission.waiting == 0  # refused, not queued
        assert (await gw.client.get("/v1/sessions/shed-me")).status_code == 404  # no session, no turn
        # A /v1/responses turn is a chat turn inside: the same queue, the same answer.
        response = await gw.client.post(
            "/v1/responses", json={"model": "fake-model", "input": "hello"}, headers={"x-session-id": "resp-shed"}
        )
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "gateway_saturated"
        assert (await gw.client.get("/v1/sessions/resp-shed")).status_code == 404
        await settle([holder])
        for worker in gw.workers.values():
            worker.hang = False
        metrics = (await gw.client.get("/metrics")).text
        assert "sessiongate_admission_returns_promised 2.0" in metrics  # both told when to come back
        await asyncio.sleep(int(shed.headers["retry-after-ms"]) / 1000)  # as told: on time, it queues
        # The idempotency key was never claimed: the retry runs as a first request.
        retried = await chat(gw, "shed-me", headers={"idempotency-key": "k-1"})
        assert retried.status_code == 200
        assert "idempotent-replayed" not in retried.headers
        turns = (await gw.client.get("/v1/sessions/shed-me/turns")).json()["data"]
        assert [t["status"] for t in turns] == ["ok"]
        metrics = (await gw.client.get("/metrics")).text
        assert 'sessiongate_admission_shed_total{status="503"} 2.0' in metrics
        assert "sessiongate_admission_waiting 0.0" in metrics
        assert "sessiongate_admission_returns_promised 1.0" in metrics  # the responses turn never came back
        assert "sessiongate_admission_wait_seconds_count 3.0" in metrics  # warm, holder and the retry: admitted


async def test_a_tenant_over_its_share_gets_429_and_the_other_503(tmp_path: Path) -> None:
    settings = {
        "admission_max_active_per_worker": 3,
        "admission_max_wait_s": 0.000_001,
        "admin_key": "admin-secret",
        **ONE_WORKER,
    }
    async with running_gateway(tmp_path, **settings) as gw:
        keys = {}
        for tenant in ("acme", "globex"):
            created = await gw.client.post("/v1/admin/keys", json={"tenant": tenant}, headers=ADMIN)
            keys[tenant] = {"authorization": f"Bearer {created.json()['key']}"}
        assert (await chat(gw, "warm", keys["acme"])).status_code == 200
        for worker in gw.workers.values():
            worker.hang = True
        held = [spawn(chat(gw, f"acme-{k}", keys["acme"])) for k in range(2)]
        held.append(spawn(chat(gw, "globex-0", keys["globex"])))
        await until(lambda: gw.state.admission.active == 3)
        over = await chat(gw, "acme-2", keys["acme"])  # acme holds 2 of the 3 turns; its share is half
        assert over.status_code == 429
        assert over.headers["retry-after"] == "1"
        assert over.json()["error"]["code"] == "fair_share_exceeded"
        under = await chat(gw, "globex-1", keys["globex"])
        assert under.status_code == 503
        assert under.json()["error"]["code"] == "gateway_saturated"
        await settle(held)
        for shed in ("acme-2", "globex-1"):
            found = await gw.client.get(f"/v1/sessions/{shed}", headers=keys[shed.split("-")[0]])
            assert found.status_code == 404


async def test_the_sdk_waits_as_a_shed_turn_asks_then_sends_it_again(tmp_path: Path) -> None:
    async with running_gateway(
        tmp_path, admission_max_active_per_worker=1, admission_max_wait_s=0.000_001, **ONE_WORKER
    ) as gw:
        assert (await chat(gw, "warm")).status_code == 200
        for worker in gw.workers.values():
            worker.hang = True
        holder = spawn(chat(gw, "holder"))
        await until(lambda: gw.state.admission.active == 1)
        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:  # the wait frees the gateway: the holder's client goes away
            sleeps.append(seconds)
            for worker in gw.workers.values():
                worker.hang = False
            await settle([holder])
            await until(lambda: gw.state.admission.active == 0)

        transport = Recording(gw.client._transport)
        async with AsyncSessionGate(base_url="http://gateway", transport=transport, sleep=sleep) as sdk:
            session = await sdk.sessions.create(session_id="sdk-shed")
            answer = await session.chat([{"role": "user", "content": "hello"}])
        assert answer.content == "echo: hello"
        [refusal] = [r for r in transport.responses if r.status_code == 503]
        assert refusal.headers["retry-after"] == "1"  # whole seconds, at least one
        # The SDK waited the exact wait the gateway asked (retry-after-ms), not its own backoff.
        assert sleeps == [int(refusal.headers["retry-after-ms"]) / 1000]
        turns = (await gw.client.get("/v1/sessions/sdk-shed/turns")).json()["data"]
        assert [t["status"] for t in turns] == ["ok"]  # the shed attempt left no turn


async def test_an_advisory_prefetch_takes_no_slot_and_goes_ahead_of_no_waiting_turn(tmp_path: Path) -> None:
    settings = {"admission_max_active_per_worker": 1, "admission_max_wait_s": 0, "load_poll_interval_s": 0.02}
    async with running_gateway(tmp_path, **settings, **ONE_WORKER) as gw:
        assert (await chat(gw, "typist")).status_code == 200
        worker = gw.workers["worker-a"]
        worker.hang = True
        holder = spawn(chat(gw, "holder"))
        await until(lambda: gw.state.admission.active == 1)
        queued = spawn(chat(gw, "queued"))
        await until(lambda: gw.state.admission.waiting == 1)
        started = gw.state.admission.started
        signal = await gw.client.post("/v1/sessions/typist/typing", json={"state": "started"})
        assert signal.status_code == 202
        # The advisor sends its prefetch to the worker itself: it lands while every slot is held and a turn waits.
        await until(lambda: any(p["state"] == "done" for p in worker.prefetches.values()))
        assert (gw.state.admission.active, gw.state.admission.waiting) == (1, 1)
        assert gw.state.admission.started == started
        worker.hang = False
        await settle([holder])
        assert (await queued).status_code == 200

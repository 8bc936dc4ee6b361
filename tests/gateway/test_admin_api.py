"""The session admin API: only the admin key; every operation, as an operator would observe it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Gateway, running_gateway

pytestmark = pytest.mark.anyio

ADMIN = {"authorization": "Bearer admin-secret"}
CLIENT = {"authorization": "Bearer client-secret"}
USER = {"role": "user", "content": "remember the milk and the eggs"}


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(
        tmp_path, admin_key="admin-secret", api_key="client-secret", load_poll_interval_s=0.02
    ) as gateway:
        yield gateway


async def _turn(gw: Gateway, session: str, messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response = await gw.client.post(
        "/v1/chat/completions", json={"messages": messages or [USER]}, headers={"X-Session-Id": session, **CLIENT}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/admin/sessions"),
        ("GET", "/v1/admin/sessions/s"),
        ("PATCH", "/v1/admin/sessions/s"),
        ("DELETE", "/v1/admin/sessions/s"),
        ("POST", "/v1/admin/sessions/s/kv/retain"),
        ("POST", "/v1/admin/sessions/s/kv/drop"),
        ("POST", "/v1/admin/sessions/s/close"),
        ("GET", "/v1/admin/workers"),
        ("POST", "/v1/admin/workers/worker-a:30000/drain"),
        ("POST", "/v1/admin/workers/worker-a:30000/undrain"),
        ("GET", "/v1/admin/advisories/stats"),
    ],
)
async def test_only_the_admin_key_opens_the_admin_api(gw: Gateway, method: str, path: str) -> None:
    client = await gw.client.request(method, path, headers=CLIENT)
    assert client.status_code == 403
    assert client.json()["error"]["type"] == "permission_error"
    assert (await gw.client.request(method, path)).status_code == 401
    assert (await gw.client.request(method, path, headers={"authorization": "Bearer nope"})).status_code == 401


async def test_admin_api_is_disabled_without_an_admin_key(gateway: Gateway) -> None:
    response = await gateway.client.get("/v1/admin/sessions", headers=ADMIN)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "admin_disabled"


async def test_list_and_filter_sessions(gw: Gateway) -> None:
    await _turn(gw, "low")
    await gw.client.post("/v1/sessions", json={"session_id": "high", "priority": 7}, headers=CLIENT)
    await gw.client.post("/v1/sessions", json={"session_id": "idle"}, headers=CLIENT)
    await gw.client.post("/v1/admin/sessions/idle/close", headers=ADMIN)

    async def ids(**params: Any) -> list[str]:
        response = await gw.client.get("/v1/admin/sessions", params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        return [s["id"] for s in response.json()["data"]]

    assert set(await ids()) == {"low", "high", "idle"}
    assert await ids(min_priority=5) == ["high"]
    assert set(await ids(state="active")) == {"low", "high"}
    assert await ids(state="closed") == ["idle"]
    assert set(await ids(tenant_id="default")) == {"low", "high", "idle"}
    assert await ids(tenant_id="acme") == []
    assert await ids(active_after="2999-01-01T00:00:00+00:00") == []
    first = (await gw.client.get("/v1/admin/sessions", params={"limit": 1}, headers=ADMIN)).json()
    assert first["has_more"] is True
    rest = await ids(after=first["data"][0]["id"])
    assert len(rest) == 2
    bad = await gw.client.get("/v1/admin/sessions", params={"active_after": "yesterday"}, headers=ADMIN)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "active_after"


async def test_a_cold_first_turn_is_believed_in_the_pool_its_worker_writes_to(gw: Gateway) -> None:
    # The turn has no hits, so the worker sends no cache report; its load report names the pool.
    await asyncio.sleep(0.1)  # a load report from each worker
    answer = await _turn(gw, "cold")
    assert "cached_tokens_details" not in answer["usage"]["prompt_tokens_details"]
    shown = (await gw.client.get("/v1/admin/sessions/cold", headers=ADMIN)).json()
    assert shown["kv"]["pool"] == answer["usage"]["total_tokens"]


async def test_show_session_with_turns_advisories_and_kv(gw: Gateway) -> None:
    first = await _turn(gw, "shown")
    await gw.client.post("/v1/sessions/shown/typing", json={"state": "started"}, headers=CLIENT)
    await _turn(gw, "shown", [USER, first["choices"][0]["message"], {"role": "user", "content": "and bread"}])
    await asyncio.sleep(0.1)
    response = await gw.client.get("/v1/admin/sessions/shown", headers=ADMIN)
    assert response.status_code == 200
    shown = response.json()
    assert [t["seq"] for t in shown["turns"]] == [1, 2]
    assert [a["kind"] for a in shown["advisories"]] == ["typing"]
    assert shown["advisories"][0]["outcome"] in {"used", "late"}
    worker = shown["turns"][1]["worker"]
    assert shown["kv"]["last_worker"] == worker
    assert shown["kv"]["device"][worker] > 0
    assert shown["kv"]["pool"] > 0
    assert (await gw.client.get("/v1/admin/sessions/nobody", headers=ADMIN)).status_code == 404


async def test_set_priority(gw: Gateway) -> None:
    await _turn(gw, "prio")
    patched = await gw.client.patch("/v1/admin/sessions/prio", json={"priority": 42}, headers=ADMIN)
    assert patched.json()["priority"] == 42
    assert (await gw.client.get("/v1/sessions/prio", headers=CLIENT)).json()["priority"] == 42
    bad = await gw.client.patch("/v1/admin/sessions/prio", json={"priority": 5000}, headers=ADMIN)
    assert bad.status_code == 400


async def test_retain_and_drop_kv_through_the_workers(gw: Gateway) -> None:
    await _turn(gw, "kv")
    retained = (await gw.client.post("/v1/admin/sessions/kv/kv/retain", json={"ttl_ms": 1000}, headers=ADMIN)).json()
    assert {r["worker"] for r in retained["workers"]} == set(gw.ids.values())
    assert all(r["operation"] == "retain" for r in retained["workers"])
    assert max(r["device_tokens"] for r in retained["workers"]) > 0
    assert all(r["storage_tokens"] > 0 for r in retained["workers"])  # the shared pool

    dropped = (await gw.client.post("/v1/admin/sessions/kv/kv/drop", headers=ADMIN)).json()
    assert all(r["operation"] == "drop" for r in dropped["workers"])
    assert all(("drop", "kv") in w.kv_ops for w in gw.workers.values())
    assert gw.workers["worker-a"].pool == []  # gone from the shared pool as well
    shown = (await gw.client.get("/v1/admin/sessions/kv", headers=ADMIN)).json()
    assert shown["kv"]["device"] == {}
    assert shown["kv"]["pool"] == 0


async def test_kv_operation_reports_a_worker_without_extension(gw: Gateway) -> None:
    await _turn(gw, "partial")
    gw.workers["worker-b"].extension = False
    result = (await gw.client.post("/v1/admin/sessions/partial/kv/retain", headers=ADMIN)).json()
    by_worker = {r["worker"]: r for r in result["workers"]}
    assert "error" in by_worker[gw.ids["worker-b"]]
    assert by_worker[gw.ids["worker-a"]]["operation"] == "retain"


async def test_close_then_delete_drops_kv_everywhere(gw: Gateway) -> None:
    await _turn(gw, "gone")
    closed = await gw.client.post("/v1/admin/sessions/gone/close", headers=ADMIN)
    assert closed.json()["state"] == "closed"
    refused = await gw.client.post(
        "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "gone", **CLIENT}
    )
    assert refused.status_code == 409
    deleted = (await gw.client.delete("/v1/admin/sessions/gone", headers=ADMIN)).json()
    assert deleted["deleted"] is True
    assert {r["worker"] for r in deleted["kv"]} == set(gw.ids.values())
    assert all(("drop", "gone") in w.kv_ops for w in gw.workers.values())
    assert (await gw.client.get("/v1/admin/sessions/gone", headers=ADMIN)).status_code == 404


async def test_workers_load_and_drain(gw: Gateway) -> None:
    gw.workers["worker-a"].queued = 3
    await asyncio.sleep(0.1)
    workers = {w["id"]: w for w in (await gw.client.get("/v1/admin/workers", headers=ADMIN)).json()["data"]}
    assert workers[gw.ids["worker-a"]]["healthy"] is True
    assert workers[gw.ids["worker-a"]]["load"]["queued_requests"] == 3
    assert workers[gw.ids["worker-a"]]["extension"] is True

    drained = await gw.client.post(f"/v1/admin/workers/{gw.ids['worker-b']}/drain", headers=ADMIN)
    assert drained.json()["draining"] is True
    assert drained.json()["routable"] is False
    for i in range(3):
        response = await gw.client.post(
            "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": f"d{i}", **CLIENT}
        )
        assert response.headers["x-sessiongate-worker"] == gw.ids["worker-a"]
    undrained = await gw.client.post(f"/v1/admin/workers/{gw.ids['worker-b']}/undrain", headers=ADMIN)
    assert undrained.json()["routable"] is True
    assert (await gw.client.post("/v1/admin/workers/nope:1/drain", headers=ADMIN)).status_code == 404


async def test_advisory_statistics_per_kind(gw: Gateway) -> None:
    first = await _turn(gw, "stats")
    # Fresh load reports (both workers idle) before the hint: a report taken during the first turn makes its
    # worker look busy, and the pool copy, which the belief now knows of, makes the other one nearly as cheap.
    await asyncio.sleep(0.1)
    await gw.client.post("/v1/sessions/stats/typing", json={"state": "started"}, headers=CLIENT)
    # The turn comes once the prefetch has landed (it counts as used then), however busy the machine is.
    advisor = gw.state.advisor
    for _ in range(200):
        live = advisor.book.get("stats", advisor.clock())
        if live is not None and live.ready_at is not None:
            break
        await asyncio.sleep(0.025)
    second = await _turn(gw, "stats", [USER, first["choices"][0]["message"], {"role": "user", "content": "more"}])
    await _turn(
        gw,
        "stats",
        [
            USER,
            first["choices"][0]["message"],
            {"role": "user", "content": "more"},
            second["choices"][0]["message"],
            {"role": "user", "content": "again"},
        ],
    )
    stats = (await gw.client.get("/v1/admin/advisories/stats", headers=ADMIN)).json()
    assert stats["requests"] == 2
    assert stats["missed"] == 1
    typing = stats["kinds"]["typing"]
    assert typing["outcomes"]["used"] == 1
    assert typing["precision"] == 1.0
    assert typing["recall"] == 0.5
    assert typing["mean_lead_time_s"] > 0

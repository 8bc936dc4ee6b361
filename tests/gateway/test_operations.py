"""Operational endpoints, the session API's own answers, and settings from the environment."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from sessiongate.gateway.settings import GatewaySettings, SettingsError

from .conftest import Gateway
from .test_signals import eventually

pytestmark = pytest.mark.anyio


async def test_health_readiness_and_models(gateway: Gateway) -> None:
    assert (await gateway.client.get("/healthz")).json() == {"status": "ok"}
    ready = await gateway.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {
        "store": "ok",
        "shared_state": "local (this replica's own memory)",
        "workers": "2 of 2 routable",
    }
    models = (await gateway.client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["fake-model"]


async def test_not_ready_without_a_routable_worker(gateway: Gateway) -> None:
    for worker in gateway.state.workers.workers:
        worker.draining = True
    ready = await gateway.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["workers"] == "0 of 2 routable"


async def test_metrics_count_turns_and_cached_prompt_tokens(gateway: Gateway) -> None:
    messages = [{"role": "user", "content": "count me in please"}]
    first = await gateway.client.post(
        "/v1/chat/completions", json={"messages": messages}, headers={"X-Session-Id": "m"}
    )
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "again"}]
    await gateway.client.post("/v1/chat/completions", json={"messages": messages}, headers={"X-Session-Id": "m"})
    text = (await gateway.client.get("/metrics")).text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")
    }
    ok_turns = sum(v for k, v in samples.items() if k.startswith('sessiongate_turns_total{status="ok"'))
    assert ok_turns == 2
    # kv_aware kept turn 2 on the idle worker holding its prefix on the device.
    assert samples['sessiongate_prompt_tokens_total{source="device"}'] > 0
    assert samples[f'sessiongate_worker_healthy{{worker="{gateway.ids["worker-a"]}"}}'] == 1
    assert samples['sessiongate_http_requests_total{route="/v1/chat/completions",status="200"}'] == 2


def _samples(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def test_metrics_show_each_workers_pool_calls_from_its_load_report(make_gateway: Any) -> None:
    """A worker whose link to the pool is slow says so in its load report (`pool_calls`), and the gateway's /metrics
    shows it per worker and kind of call: the recent mean and the totals."""
    async with make_gateway(load_poll_interval_s=0.02) as gw:
        slow, fast = gw.workers["worker-a"], gw.workers["worker-b"]
        slow.pool_call_ms, fast.pool_call_ms = 80.0, 2.0
        for worker in (slow, fast):
            worker.pool_call("read", 10)
            worker.pool_call("read", 30)
        turn = await gw.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b c"}]})
        assert turn.status_code == 200  # the worker that served it writes its prompt through to the pool
        writer_id = turn.headers["x-sessiongate-worker"]

        async def reported() -> bool:
            loads = {worker.id: worker.load for worker in gw.state.workers.workers}
            return all(loads.values()) and loads[writer_id].pool_calls["write"].calls == 1  # type: ignore[union-attr]

        await eventually(reported)
        samples = _samples((await gw.client.get("/metrics")).text)

    def sample(name: str, worker: str, op: str) -> float:
        return samples[f'sessiongate_worker_pool_{name}{{op="{op}",worker="{worker}"}}']

    slow_id, fast_id = gw.ids["worker-a"], gw.ids["worker-b"]
    assert sample("mean_call_seconds", slow_id, "read") == pytest.approx(0.080)
    assert sample("mean_call_seconds", fast_id, "read") == pytest.approx(0.002)
    assert sample("calls_total", slow_id, "read") == 2
    assert sample("pages_total", slow_id, "read") == 40
    assert sample("call_seconds_total", slow_id, "read") == pytest.approx(0.160)
    assert sample("calls_total", writer_id, "write") == 1
    assert sample("pages_total", writer_id, "write") == 4  # "<user> a b c", a page per token here
    other_id = fast_id if writer_id == slow_id else slow_id
    assert sample("calls_total", other_id, "write") == 0
    # No write lately: no recent mean rather than a stale one.
    assert f'sessiongate_worker_pool_mean_call_seconds{{op="write",worker="{other_id}"}}' not in samples


async def test_no_pool_figures_from_a_worker_whose_pool_is_not_timed(make_gateway: Any) -> None:
    async with make_gateway(load_poll_interval_s=0.02) as gw:
        for worker in gw.workers.values():
            worker.storage_backend = "file-unchecked"  # SGLang's own backend: sessiongate neither verifies nor times it
        turn = await gw.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a b"}]})
        assert turn.status_code == 200

        async def reported() -> bool:
            loads = [worker.load for worker in gw.state.workers.workers]
            return all(load is not None and load.storage_backend == "file-unchecked" for load in loads)

        await eventually(reported)
        samples = _samples((await gw.client.get("/metrics")).text)
    assert samples[f'sessiongate_worker_healthy{{worker="{gw.ids["worker-a"]}"}}'] == 1
    assert not [name for name in samples if name.startswith("sessiongate_worker_pool_")]


async def test_metrics_show_a_store_call_stuck_and_the_calls_it_refused(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = gateway.state.store
    idle = _samples((await gateway.client.get("/metrics")).text)
    assert idle["sessiongate_store_calls_in_flight"] == 0
    assert idle["sessiongate_store_oldest_call_seconds"] == 0
    assert idle["sessiongate_store_unavailable_total"] == 0
    # The database stops answering: a turn's first store call waits in the store's own transaction code.
    lock = store._write_lock
    assert lock is not None
    async with lock:
        stuck = asyncio.create_task(
            gateway.client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers={"X-Session-Id": "s"},
            )
        )
        await asyncio.sleep(0.3)
        waiting = _samples((await gateway.client.get("/metrics")).text)
        assert waiting["sessiongate_store_calls_in_flight"] >= 1
        assert waiting["sessiongate_store_oldest_call_seconds"] >= 0.25
    assert (await stuck).status_code == 200
    # Calls that fail as unavailable are counted, once each, across scrapes.
    counted = store.health()
    monkeypatch.setattr(store, "health", lambda: dataclasses.replace(counted, unavailable=counted.unavailable + 3))
    assert _samples((await gateway.client.get("/metrics")).text)["sessiongate_store_unavailable_total"] == 3
    assert _samples((await gateway.client.get("/metrics")).text)["sessiongate_store_unavailable_total"] == 3


async def test_session_api(gateway: Gateway) -> None:
    created = await gateway.client.post(
        "/v1/sessions", json={"session_id": "api-1", "priority": 5, "metadata": {"user": "ada"}}
    )
    assert created.status_code == 201
    assert created.json()["priority"] == 5
    duplicate = await gateway.client.post("/v1/sessions", json={"session_id": "api-1"})
    assert duplicate.status_code == 409
    assert duplicate.headers["x-should-retry"] == "false"
    generated = (await gateway.client.post("/v1/sessions")).json()["id"]
    assert generated.startswith("sess_")

    page = (await gateway.client.get("/v1/sessions", params={"limit": 1})).json()
    assert len(page["data"]) == 1
    assert page["has_more"] is True
    rest = (await gateway.client.get("/v1/sessions", params={"after": page["data"][0]["id"]})).json()
    assert {s["id"] for s in page["data"] + rest["data"]} == {"api-1", generated}

    patched = await gateway.client.patch("/v1/sessions/api-1", json={"priority": -3})
    assert patched.json()["priority"] == -3
    assert patched.json()["metadata"] == {"user": "ada"}
    bad = await gateway.client.patch("/v1/sessions/api-1", json={"priority": "high"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "priority"
    assert (await gateway.client.get("/v1/sessions", params={"limit": 0})).status_code == 400

    deleted = await gateway.client.delete("/v1/sessions/api-1")
    assert deleted.json() == {"id": "api-1", "object": "session.deleted", "deleted": True}
    assert (await gateway.client.get("/v1/sessions/api-1")).status_code == 404


async def test_api_key_when_configured(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(api_key="s3cret", allow_unauthenticated=False) as gw:
        missing = await gw.client.get("/v1/sessions")
        assert missing.status_code == 401
        assert missing.json()["error"]["type"] == "authentication_error"
        wrong = await gw.client.get("/v1/sessions", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await gw.client.get("/v1/sessions", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert (await gw.client.get("/healthz")).status_code == 200  # probes need no key


def test_settings_precedence_and_validation() -> None:
    env = {
        "SESSIONGATE_PORT": "9001",
        "SESSIONGATE_WORKERS": "http://a:1/, http://b:2",
        "SESSIONGATE_LOG_JSON": "false",
        "SESSIONGATE_UPSTREAM_READ_TIMEOUT_S": "12.5",
    }
    settings = GatewaySettings.from_env(env, port=9002, host=None)
    assert settings.port == 9002  # a flag beats the environment
    assert settings.host == "127.0.0.1"  # None means "not given": the default stays
    assert settings.workers == ("http://a:1", "http://b:2")
    assert settings.log_json is False
    assert settings.upstream_read_timeout_s == 12.5
    with pytest.raises(SettingsError, match="SESSIONGATE_PORT"):
        GatewaySettings.from_env({"SESSIONGATE_PORT": "eighty"})
    with pytest.raises(SettingsError, match="not an http"):
        GatewaySettings.from_env({"SESSIONGATE_WORKERS": "ftp://x"})
    with pytest.raises(SettingsError, match="SESSIONGATE_LOG_JSON"):
        GatewaySettings.from_env({"SESSIONGATE_LOG_JSON": "perhaps"})
    moves = GatewaySettings.from_env({"SESSIONGATE_POOL_TO_DEVICE_LATENCY_S": "0.012"})
    assert moves.pool_to_device_latency_s == 0.012
    with pytest.raises(SettingsError, match="POOL_TO_DEVICE_LATENCY_S"):
        GatewaySettings.from_env({"SESSIONGATE_POOL_TO_DEVICE_LATENCY_S": "-1"})
    with pytest.raises(SettingsError, match="HOST_TO_DEVICE_BYTES_PER_S"):
        GatewaySettings.from_env({"SESSIONGATE_HOST_TO_DEVICE_BYTES_PER_S": "0"})

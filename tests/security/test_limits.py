"""Per-tenant limits: requests in flight and tokens per minute, refused with 429 + Retry-After in the OpenAI
error format, one tenant's limit never touching another's."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from sessiongate.gateway.errors import RateLimited
from sessiongate.gateway.turn.limits import EffectiveLimits, TenantLimits
from sessiongate.sessions import TenantRecord

from .conftest import admin, bearer

USER = {"role": "user", "content": "count to ten please"}


@pytest.mark.anyio
async def test_concurrent_requests_over_the_limit_get_429(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(tenant_max_concurrent=1) as gw:
        acme, globex = bearer(await gw.new_key("acme")), bearer(await gw.new_key("globex"))
        gw.worker.token_delay_s = 0.05
        body = {"messages": [USER], "stream": True, "max_tokens": 8}
        statuses: list[int] = []

        async def first() -> None:
            statuses.append((await gw.client.post("/v1/chat/completions", headers=acme, json=body)).status_code)

        async with anyio.create_task_group() as group:
            group.start_soon(first)
            while gw.state.limits.in_flight("acme") == 0:  # noqa: ASYNC110 (polling gateway state, no event to wait on)
                await anyio.sleep(0.005)
            second = await gw.client.post("/v1/chat/completions", headers=acme, json=body)
            assert second.status_code == 429
            assert second.headers["retry-after"] == "1"
            assert second.json()["error"]["type"] == "rate_limit_error"
            assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
            other = await gw.client.post("/v1/chat/completions", headers=globex, json={"messages": [USER]})
            assert other.status_code == 200  # another tenant is not affected
        assert statuses == [200]
        gw.worker.token_delay_s = 0
        assert gw.state.limits.in_flight("acme") == 0  # released when the stream ended
        again = await gw.client.post("/v1/chat/completions", headers=acme, json={"messages": [USER]})
        assert again.status_code == 200
        # A failed turn releases its slot too.
        gw.worker.fail_status = 500
        assert (await gw.client.post("/v1/chat/completions", headers=acme, json=body)).status_code == 500
        assert gw.state.limits.in_flight("acme") == 0


@pytest.mark.anyio
async def test_tokens_per_minute_over_the_limit_get_429(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(tenant_tokens_per_minute=20) as gw:
        acme, globex = bearer(await gw.new_key("acme")), bearer(await gw.new_key("globex"))
        long_prompt = {"role": "user", "content": " ".join(["word"] * 30)}
        first = await gw.client.post("/v1/chat/completions", headers=acme, json={"messages": [long_prompt]})
        assert first.status_code == 200
        assert first.json()["usage"]["total_tokens"] > 20
        refused = await gw.client.post("/v1/chat/completions", headers=acme, json={"messages": [USER]})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "tokens_per_minute_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        other = await gw.client.post("/v1/chat/completions", headers=globex, json={"messages": [USER]})
        assert other.status_code == 200


def test_token_bucket_refills_over_time() -> None:
    now = [0.0]
    limits = TenantLimits(max_concurrent=0, tokens_per_minute=60, clock=lambda: now[0])
    admission = limits.admit("t")
    admission.charge(90)  # 30 over: the bucket is at -30, refilling 1 token/s
    admission.release()
    with pytest.raises(RateLimited) as refused:
        limits.admit("t")
    assert refused.value.headers() == {"Retry-After": "31", "retry-after-ms": "31000"}
    now[0] = 31.0
    limits.admit("t").release()


@pytest.mark.anyio
async def test_admin_overrides_a_tenants_limits(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(tenant_tokens_per_minute=0) as gw:
        acme, globex = bearer(await gw.new_key("acme")), bearer(await gw.new_key("globex"))
        long_prompt = {"role": "user", "content": " ".join(["word"] * 30)}
        path = "/v1/admin/tenants/acme/limits"
        assert (await gw.client.put(path, json={"tokens_per_minute": 20}, headers=acme)).status_code == 401
        assert (await gw.client.put(path, json={"tokens_per_minute": -1}, headers=admin())).status_code == 400
        set_limits = await gw.client.put(path, json={"tokens_per_minute": 20}, headers=admin())
        assert set_limits.status_code == 200
        assert set_limits.json()["limits"] == {"max_concurrent": None, "tokens_per_minute": 20}
        assert set_limits.json()["effective_limits"] == {"max_concurrent": 0, "tokens_per_minute": 20}

        for _ in range(2):  # globex keeps the global value (no limit)
            answer = await gw.client.post("/v1/chat/completions", headers=globex, json={"messages": [long_prompt]})
            assert answer.status_code == 200
        assert (
            await gw.client.post("/v1/chat/completions", headers=acme, json={"messages": [long_prompt]})
        ).status_code == 200
        refused = await gw.client.post("/v1/chat/completions", headers=acme, json={"messages": [USER]})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "tokens_per_minute_exceeded"

        shown = await gw.client.get("/v1/admin/tenants/acme", headers=admin())
        assert shown.json()["limits"]["tokens_per_minute"] == 20
        listed = (await gw.client.get("/v1/admin/tenants", headers=admin())).json()["data"]
        assert {t["id"]: t["limits"]["tokens_per_minute"] for t in listed}["globex"] is None
        assert (await gw.client.get("/v1/admin/tenants/nobody", headers=admin())).status_code == 404

        # Back to the global value: acme is served again.
        cleared = await gw.client.put(path, json={"tokens_per_minute": None}, headers=admin())
        assert cleared.json()["effective_limits"]["tokens_per_minute"] == 0
        assert (
            await gw.client.post("/v1/chat/completions", headers=acme, json={"messages": [USER]})
        ).status_code == 200


@pytest.mark.anyio
async def test_overrides_set_elsewhere_are_reloaded(make_gateway: Callable[..., Any]) -> None:
    """An override written by another replica (straight in the shared store) applies within the reload period."""
    async with make_gateway(tenant_max_concurrent=5, key_cache_ttl_s=0.05) as gw:
        assert gw.state.limits.for_tenant("acme").max_concurrent == 5
        await gw.state.store.set_tenant_limits("acme", max_concurrent=1, tokens_per_minute=None)
        with anyio.fail_after(10):
            while gw.state.limits.for_tenant("acme").max_concurrent != 1:  # noqa: ASYNC110 (no event to wait on)
                await anyio.sleep(0.02)
        await gw.state.store.set_tenant_limits("acme", max_concurrent=None, tokens_per_minute=None)
        with anyio.fail_after(10):
            while gw.state.limits.for_tenant("acme").max_concurrent != 5:  # noqa: ASYNC110 (no event to wait on)
                await anyio.sleep(0.02)


def test_override_falls_back_to_the_global_value_and_caps_the_bucket() -> None:
    now = [0.0]
    limits = TenantLimits(max_concurrent=2, tokens_per_minute=600, clock=lambda: now[0])
    limits.admit("t").release()  # the bucket starts full: 600
    limits.set_override(
        TenantRecord(id="t", name="t", created_at=datetime.now(UTC), max_concurrent=None, tokens_per_minute=60)
    )
    assert limits.for_tenant("t") == EffectiveLimits(max_concurrent=2, tokens_per_minute=60)
    assert limits.for_tenant("other") == limits.defaults
    admission = limits.admit("t")  # the lowered limit caps what the bucket holds: 60, not 600
    admission.charge(90)
    admission.release()
    with pytest.raises(RateLimited) as refused:
        limits.admit("t")
    assert refused.value.headers() == {"Retry-After": "31", "retry-after-ms": "31000"}
    limits.replace_overrides([])  # the override is gone: the global 600/min refills the -30 in 3 s, not 31 s
    now[0] = 3.5
    limits.admit("t").release()

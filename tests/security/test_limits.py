"""Per-tenant limits: requests in flight and tokens per minute, refused with 429 + Retry-After in the OpenAI
error format, one tenant's limit never touching another's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from gateway.errors import RateLimited
from gateway.limits import TenantLimits

from .conftest import bearer

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
    assert refused.value.headers() == {"Retry-After": "31"}
    now[0] = 31.0
    limits.admit("t").release()

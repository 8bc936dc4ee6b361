"""Workers that report the prompt tokens queued ahead (`LoadReport.queued_prefill_tokens`): through the real app,
against fake workers speaking the extension's load report."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from .test_signals import FAST, USER

pytestmark = pytest.mark.anyio


async def _worker_of(gw: Any, session: str) -> str:
    headers = {"X-Session-Id": session}
    response = await gw.client.post("/v1/chat/completions", json={"messages": [USER]}, headers=headers)
    assert response.status_code == 200, response.text
    return str(gw.name_of(response.headers["x-sessiongate-worker"]))


@pytest.mark.parametrize("policy", ["kv_aware", "dynamo_cost"])
async def test_new_sessions_avoid_the_worker_with_a_long_prefill_queued(make_gateway: Any, policy: str) -> None:
    async with make_gateway(**FAST, routing_policy=policy) as gw:
        for worker in gw.workers.values():
            worker.queued = 1  # one request queued on each: by request counts, the two are equal
        gw.workers["worker-a"].queued_prefill_tokens = 200_000  # ... but a's is a 200k-token prompt
        gw.workers["worker-b"].queued_prefill_tokens = 300

        async def reported() -> bool:
            return all(w.active_prefill_tokens is not None for w in gw.state.router.candidates())

        for _ in range(100):
            if await reported():
                break
            await asyncio.sleep(0.02)
        assert [await _worker_of(gw, f"fresh-{policy}-{i}") for i in range(4)] == ["worker-b"] * 4


async def test_new_sessions_avoid_a_worker_whose_device_memory_running_sequences_fill(make_gateway: Any) -> None:
    async with make_gateway(**FAST, routing_policy="kv_aware") as gw:
        for worker in gw.workers.values():
            worker.running, worker.queued, worker.queued_prefill_tokens = 1, 0, 0  # equal by counts and queues
            worker.device_kv_tokens_total = 32_768
        gw.workers["worker-a"].device_kv_tokens_used = 31_000  # a's running sequence holds nearly all its pool
        gw.workers["worker-b"].device_kv_tokens_used = 1_000

        def views() -> dict[str, Any]:
            return {gw.name_of(w.id): w for w in gw.state.router.candidates()}

        for _ in range(100):
            if views()["worker-a"].active_kv_tokens == 31_000:
                break
            await asyncio.sleep(0.02)
        assert (views()["worker-a"].active_kv_tokens, views()["worker-a"].device_kv_tokens) == (31_000, 32_768)
        assert [await _worker_of(gw, f"fresh-memory-{i}") for i in range(4)] == ["worker-b"] * 4

"""The fake worker honours what SGLang honours: a request's `cache_salt` is part of its cache key, so a salted
prompt only hits KV cached under the same salt, and a session KV operation only finds (and drops) pages of
its own salt."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.sglang_ext.protocol import LOAD_PATH, SESSIONS_PATH

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "one two three four five six"}]


async def _cached(client: httpx.AsyncClient, salt: str | None) -> int:
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 2}
    if salt is not None:
        body["cache_salt"] = salt
    answer = (await client.post("/v1/chat/completions", json=body)).json()
    cached: int = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert answer["usage"]["prompt_tokens"] == 7  # the salt is no prompt token
    return cached


async def test_a_salted_prompt_only_hits_its_own_salt() -> None:
    app = create_fake_worker(FakeWorkerBehaviour())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as client:
        assert await _cached(client, "tenant-a") == 0
        assert await _cached(client, "tenant-b") == 0  # same prompt, other salt: a miss
        assert await _cached(client, None) == 0  # unsalted does not match salted either
        # A hit reuses all but the prompt's last token, as in SGLang.
        assert await _cached(client, "tenant-a") == 6
        assert await _cached(client, None) == 6


async def test_session_kv_operations_are_keyed_by_salt() -> None:
    app = create_fake_worker(FakeWorkerBehaviour())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as client:
        await _cached(client, "tenant-a")
        await _cached(client, "tenant-b")
        unsalted = await client.post(f"{SESSIONS_PATH}/s/retain", json={"messages": MESSAGES})
        assert unsalted.json()["device_tokens"] == 0
        salted = await client.post(f"{SESSIONS_PATH}/s/retain", json={"messages": MESSAGES, "cache_salt": "tenant-a"})
        assert salted.json()["device_tokens"] == 7
        drop = await client.post(f"{SESSIONS_PATH}/s/drop", json={"messages": MESSAGES, "cache_salt": "tenant-a"})
        assert drop.json()["device_tokens"] == 7
        assert await _cached(client, "tenant-a") == 0  # dropped
        assert await _cached(client, "tenant-b") == 6  # another tenant's identical prompt stays


async def _chat(client: httpx.AsyncClient, words: str) -> dict[str, int]:
    body = {"messages": [{"role": "user", "content": words}], "max_tokens": 2, "return_cached_tokens_details": True}
    answer = (await client.post("/v1/chat/completions", json=body)).json()
    details: dict[str, int] = (answer.get("sglext") or {}).get("cached_tokens_details") or {}
    return {tier: details.get(tier, 0) for tier in ("device", "host", "storage")}


async def test_without_a_storage_backend_no_pool_is_written_or_read() -> None:
    pool: list[tuple[str, ...]] = []
    writer = FakeWorkerBehaviour(pool=pool, storage_backend=None, prefetch_threshold=1)
    reader = FakeWorkerBehaviour(pool=pool, prefetch_threshold=1)
    prompt = " ".join(f"w{i}" for i in range(20))
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=create_fake_worker(writer)), base_url="http://a") as a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=create_fake_worker(reader)), base_url="http://b") as b,
    ):
        await _chat(a, prompt)
        assert pool == []
        assert (await _chat(b, prompt))["storage"] == 0
        assert (await a.get(LOAD_PATH)).json()["storage_backend"] is None
        assert pool  # b, with a backend, wrote it through
        assert (await _chat(a, prompt)) == {"device": 20, "host": 0, "storage": 0}  # a's own device still serves it


async def test_the_device_counts_a_shared_prefix_once_and_evicts_to_host() -> None:
    worker = FakeWorkerBehaviour(device_kv_tokens_total=30, host_kv_tokens_total=30)
    shared = " ".join(f"s{i}" for i in range(10))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_fake_worker(worker)), base_url="http://w"
    ) as c:
        await _chat(c, shared + " one two three four")
        await _chat(c, shared + " five six seven eight")
        # 1 role token + 10 shared + 4 + 4 of each: 19 tokens held, within 30.
        assert worker.held_tokens(worker.device) == 19
        assert (await c.get(LOAD_PATH)).json()["device_kv_tokens_cached"] == 19
        await _chat(c, " ".join(f"x{i}" for i in range(20)))  # 21 more: the oldest prompts leave the device
        assert worker.held_tokens(worker.device) <= 30
        # Back from host memory, but for the role token every prompt starts with (all but the last token reused).
        assert await _chat(c, shared + " one two three four") == {"device": 1, "host": 13, "storage": 0}

"""The fake worker honours what SGLang honours: a request's `cache_salt` is part of its cache key, so a salted
prompt only hits KV cached under the same salt, and a session KV operation only finds (and drops) pages of
its own salt."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.sglang_ext.protocol import SESSIONS_PATH

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

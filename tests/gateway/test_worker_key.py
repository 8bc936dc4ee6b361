"""The workers' API key: read from the settings, sent on every call the gateway's worker client makes."""

from __future__ import annotations

import httpx
import pytest

from sessiongate.gateway.settings import GatewaySettings
from sessiongate.gateway.workers.upstream import make_http_client

pytestmark = pytest.mark.anyio


async def _authorizations(worker_api_key: str) -> list[str | None]:
    seen: list[str | None] = []

    def worker(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    client = make_http_client(
        connect_timeout_s=1, read_timeout_s=1, transport=httpx.MockTransport(worker), worker_api_key=worker_api_key
    )
    async with client:
        await client.post("http://w:1/v1/chat/completions", json={})
        await client.get("http://w:1/sessiongate/v1/load")
        await client.post("http://w:1/sessiongate/v1/prefetch", json={})
    return seen


async def test_the_worker_key_goes_on_every_worker_call() -> None:
    assert await _authorizations("wk-0123456789") == ["Bearer wk-0123456789"] * 3
    assert await _authorizations("") == [None] * 3  # no key configured: none sent


def test_the_worker_key_comes_from_the_environment() -> None:
    assert GatewaySettings.from_env({"SESSIONGATE_WORKER_API_KEY": "wk-abc"}).worker_api_key == "wk-abc"
    assert GatewaySettings.from_env({}).worker_api_key == ""

"""KV isolation against a real SGLang 0.5.23 CPU worker (tiny model): the same long prompt sent by another
tenant finds nothing cached, sent again by the same tenant finds its prefix cached.

The gateway runs in-process (real ASGI app, real SQLite store, real HTTP to the worker) with tenant keys.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sglang_ext.launcher import WorkerProcess

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ADMIN = {"authorization": "Bearer admin-for-engine-test"}
LONG = "You are a careful assistant. " + " ".join(f"Fact {i}: the archive shelf {i} holds maps." for i in range(40))


@pytest.fixture
async def gateway(
    engine_worker: WorkerProcess, tmp_path: Path, open_gateway: Callable[..., Any]
) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        workers=(engine_worker.url,),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        admin_key=ADMIN["authorization"].split()[1],
        cache_salt_secret="engine-test-secret",
    )
    app = create_app(settings)
    async with open_gateway(app) as client:
        yield client


async def _key(client: httpx.AsyncClient, tenant: str) -> dict[str, str]:
    answer = await client.post("/v1/admin/keys", json={"tenant": tenant}, headers=ADMIN)
    assert answer.status_code == 201
    return {"authorization": f"Bearer {answer.json()['key']}"}


async def _cached(client: httpx.AsyncClient, headers: dict[str, str], question: str) -> tuple[int, int]:
    body = {
        "model": "tiny",
        "max_tokens": 2,
        "temperature": 0,
        "messages": [{"role": "system", "content": LONG}, {"role": "user", "content": question}],
    }
    answer = await client.post("/v1/chat/completions", headers=headers, json=body)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    return int(usage["prompt_tokens"]), int(usage["prompt_tokens_details"]["cached_tokens"])


async def test_another_tenant_gets_no_cached_tokens(gateway: httpx.AsyncClient) -> None:
    acme, globex = await _key(gateway, "acme"), await _key(gateway, "globex")
    prompt_tokens, first = await _cached(gateway, acme, "Where are the maps?")
    assert prompt_tokens > 200
    assert first == 0
    _, same_tenant = await _cached(gateway, acme, "Which shelf has maps?")
    assert same_tenant > 200  # the long shared prefix is reused within the tenant
    _, other_tenant = await _cached(gateway, globex, "Where are the maps?")
    assert other_tenant == 0  # the identical prompt from another tenant is computed afresh
    _, other_again = await _cached(gateway, globex, "Which shelf has maps?")
    assert other_again > 200  # ...and then cached for that tenant

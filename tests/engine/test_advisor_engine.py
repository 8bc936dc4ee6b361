"""An advisory prefetch between two real SGLang CPU workers sharing one KV pool (tiny model).

Both workers serve the same model (KV keys, and so the pool, are per model). Turn 1 runs on one worker, which
writes its KV through to the shared pool. That worker is drained, so the advisor
(asked by an explicit hint) picks the other one and asks it to prefetch the session's context from the pool; once
the worker says the prefetch is done, the worker is undrained and turn 2 follows the reservation to the other
worker, finding its prefix there instead of recomputing it. The advisory is recorded as used.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess
from tests.conftest import running_workers

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ADMIN = {"authorization": "Bearer admin"}
SYSTEM = "You are a travel assistant. " + " ".join(f"Rule {i}: answer briefly, cite guide page {i}." for i in range(40))


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    root = tmp_path_factory.mktemp("advisor-engine")
    pool = root / "pool"
    # One model for both (the session's shared models directory): KV keys, and so the shared pool, are per model.
    configs = [
        WorkerConfig(
            state_dir=root / name, port=free_port(), pool_dir=pool, cpu_threads=cores_per_worker(2), gpu_share=2
        )
        for name in ("w1", "w2")
    ]
    with running_workers(*configs) as (first, second):
        yield first, second


@pytest.fixture
async def gateway(
    workers: tuple[WorkerProcess, WorkerProcess], tmp_path: Path, open_gateway: Callable[..., Any]
) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        allow_unauthenticated=True,
        admin_key="admin",
        workers=tuple(w.url for w in workers),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        advisory_ttl_s=120.0,
    )
    app = create_app(settings)
    async with open_gateway(app) as client:
        yield client


async def test_explicit_hint_moves_the_kv_to_the_other_worker(gateway: httpx.AsyncClient) -> None:
    headers = {"X-Session-Id": "engine-advisory"}
    base = {"model": "tiny", "max_tokens": 8, "temperature": 0}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Three days in Lisbon: what first?"},
    ]
    first = await gateway.post("/v1/chat/completions", json={**base, "messages": messages}, headers=headers)
    assert first.status_code == 200, first.text
    home = first.headers["x-sessiongate-worker"]
    messages.append({"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]})

    # The worker writes the turn's KV through to the pool in the background: give it the moment a user takes to
    # read the answer before typing again.
    await asyncio.sleep(3)
    assert (await gateway.post(f"/v1/admin/workers/{home}/drain", headers=ADMIN)).status_code == 200
    hint = await gateway.post("/v1/sessions/engine-advisory/advise", json={})
    assert hint.status_code == 202, hint.text
    target = hint.json()["worker"]
    assert target != home

    deadline = time.monotonic() + 60
    while True:
        kv = (await gateway.get("/v1/admin/sessions/engine-advisory", headers=ADMIN)).json()["kv"]
        if kv["device"].get(target) or kv["host"].get(target):
            break  # the worker reported the prefetch done (on its device, or in host memory if the device was full)
        assert time.monotonic() < deadline, kv
        await asyncio.sleep(0.2)
    # The turn comes while its home is still draining (the load that moved the advisory away has not gone): it
    # goes where the advisory brought its KV. (Once home is back with the KV still on its device, either worker is
    # as good, and a landed reservation only breaks ties: tests/gateway/test_routing.py.)
    messages.append({"role": "user", "content": "And what should I eat?"})
    second = await gateway.post("/v1/chat/completions", json={**base, "messages": messages}, headers=headers)
    assert (await gateway.post(f"/v1/admin/workers/{home}/undrain", headers=ADMIN)).status_code == 200
    assert second.status_code == 200, second.text
    assert second.headers["x-sessiongate-worker"] == target
    details = second.json()["usage"]["prompt_tokens_details"]["cached_tokens_details"]
    assert details["device"] + details["host"] > 0  # found on the target, not recomputed nor read at request time

    deadline = time.monotonic() + 30
    while True:
        advisories = (await gateway.get("/v1/admin/sessions/engine-advisory", headers=ADMIN)).json()["advisories"]
        if advisories and advisories[0]["outcome"] != "pending":
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert advisories[0]["kind"] == "explicit"
    assert advisories[0]["outcome"] == "used"

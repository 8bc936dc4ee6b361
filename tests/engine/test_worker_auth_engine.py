"""A worker started with an API key (SGLang's `--api-key`) and the gateway that holds it (real SGLang, CPU).

SGLang guards every route of its app but `/health*`, `/ready*` and `/metrics` with `Authorization: Bearer <key>`,
the extension's routes included (they are added to the same app). The gateway sends `SESSIONGATE_WORKER_API_KEY`
on every call to a worker: generation, load reports, advisory prefetches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.protocol import INFO_PATH, LOAD_PATH, PREFETCH_PATH, SESSIONS_PATH

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

KEY = "worker-key-for-tests"
BASE = {"model": "tiny", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def keyed_worker(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[WorkerProcess]:
    root = tmp_path_factory.mktemp("keyed-worker")
    process = start_worker(WorkerConfig(state_dir=root, port=free_port(), api_key=KEY))
    try:
        process.wait_ready(300)  # /health needs no key: readiness probes stay keyless
        yield process
    finally:
        process.stop()


def test_the_extensions_endpoints_want_the_workers_key(keyed_worker: WorkerProcess) -> None:
    prefetch = {"session_id": "s", "input_ids": list(range(3, 200)), "target": "host"}
    drop = {"input_ids": list(range(3, 200))}
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", INFO_PATH, None),
        ("GET", LOAD_PATH, None),
        ("POST", PREFETCH_PATH, prefetch),
        ("POST", f"{SESSIONS_PATH}/s/retain", {**drop, "priority": 5, "ttl_ms": 1000}),
        ("POST", f"{SESSIONS_PATH}/s/drop", drop),
    ]
    with httpx.Client(base_url=keyed_worker.url, timeout=60) as client:
        for method, path, body in calls:
            refused = client.request(method, path, json=body)
            assert refused.status_code == 401, (path, refused.text)
            wrong = client.request(method, path, json=body, headers={"Authorization": "Bearer not-the-key"})
            assert wrong.status_code == 401, path
            allowed = client.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
            assert allowed.status_code in (200, 202), (path, allowed.text)
        assert client.get("/health").status_code == 200


async def test_the_gateway_sends_the_workers_key(
    keyed_worker: WorkerProcess, tmp_path: Path, open_gateway: Callable[..., Any]
) -> None:
    common = {
        "allow_unauthenticated": True,
        "workers": (keyed_worker.url,),
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
    }
    async with open_gateway(create_app(GatewaySettings(**common, worker_api_key=KEY))) as gateway:
        headers = {"X-Session-Id": "keyed"}
        messages = [{"role": "user", "content": "hello"}]
        answer = await gateway.post("/v1/chat/completions", json={**BASE, "messages": messages}, headers=headers)
        assert answer.status_code == 200, answer.text
        hint = await gateway.post("/v1/sessions/keyed/advise", json={})  # an advisory prefetch on the worker
        assert hint.status_code == 202, hint.text
    async with open_gateway(create_app(GatewaySettings(**common))) as keyless:
        refused = await keyless.post("/v1/chat/completions", json={**BASE, "messages": messages})
        assert refused.status_code == 401, refused.text  # the gateway relays the worker's refusal as it is
        assert "worker answered 401" in refused.text

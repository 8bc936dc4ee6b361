"""Fixtures for the gateway's own logic: the real ASGI app, a real SQLite store, fake workers that speak
SGLang's HTTP API (benchmarks.fake_worker) on real localhost sockets, in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.gateway.workers.pool import worker_id_for
from sessiongate.sglang_ext.ports import pick_port
from tests.conftest import WithLifespanState, fake_workers

WORKER_NAMES = ("worker-a", "worker-b")


@dataclass
class Gateway:
    client: httpx.AsyncClient
    workers: dict[str, FakeWorkerBehaviour]
    app: Any
    state: Any
    database_url: str
    # Each fake worker's URL and worker id (`host:port`) by name ("worker-a", "worker-b").
    urls: dict[str, str]
    ids: dict[str, str]

    def name_of(self, worker_id: str) -> str:
        """The fake worker's name for a worker id."""
        return next(name for name, id_ in self.ids.items() if id_ == worker_id)


@contextlib.asynccontextmanager
async def running_gateway(
    tmp_path: Path, *, worker_names: tuple[str, ...] = WORKER_NAMES, **settings: Any
) -> AsyncIterator[Gateway]:
    """The gateway in front of fake workers (two unless `worker_names` says otherwise), served on real sockets."""
    shared_pool: list[tuple[str, ...]] = []
    # The tests' prompts are a few words: the workers load any pool hit, as `WorkerConfig(prefetch_threshold=1)`
    # would (SGLang's default threshold, 256 tokens, would hide every storage hit).
    behaviours = {name: FakeWorkerBehaviour(pool=shared_pool, prefetch_threshold=1) for name in worker_names}
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    async with fake_workers(behaviours) as urls:
        options: dict[str, Any] = {
            "workers": tuple(urls.values()),
            "database_url": database_url,
            "health_interval_s": 0.05,
            "allow_unauthenticated": True,
            **settings,
        }
        app = create_app(GatewaySettings(**options))
        async with app.router.lifespan_context(app) as state:
            served = WithLifespanState(app, state)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=served), base_url="http://gateway"
            ) as client:
                ids = {name: worker_id_for(url) for name, url in urls.items()}
                yield Gateway(client, behaviours, app, state["gateway"], database_url, urls, ids)


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path) as gw:
        yield gw


@pytest.fixture
def make_gateway(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Gateway]]:
    def make(**settings: Any) -> contextlib.AbstractAsyncContextManager[Gateway]:
        return running_gateway(tmp_path, **settings)

    return make


@contextlib.asynccontextmanager
async def served(app: Any, *, port: int | None = None, **config: Any) -> AsyncIterator[str]:
    """`app` behind a real uvicorn server on 127.0.0.1 (on `port`, else a free one); yields its URL. `config`: more
    of `uvicorn.Config`'s options (`http`, `lifespan`, ...)."""
    port = port or pick_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task

"""Fixtures for the gateway's own logic: the real ASGI app, a real SQLite store, fake workers that speak
SGLang's HTTP API in-process (benchmarks.fake_worker)."""

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
from starlette.types import ASGIApp, Receive, Scope, Send

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sglang_ext.ports import pick_port
from tests.conftest import WithLifespanState

WORKER_URLS = ("http://worker-a:30000", "http://worker-b:30000")


class HostDispatch:
    """One ASGI transport for several fake workers, chosen by the Host header (host:port)."""

    def __init__(self, apps: dict[str, ASGIApp]) -> None:
        self.apps = apps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = dict(scope["headers"]).get(b"host", b"").decode().split(":")[0]
        await self.apps[host](scope, receive, send)


@dataclass
class Gateway:
    client: httpx.AsyncClient
    workers: dict[str, FakeWorkerBehaviour]
    app: Any
    state: Any
    database_url: str


@contextlib.asynccontextmanager
async def running_gateway(tmp_path: Path, *, real_network: bool = False, **settings: Any) -> AsyncIterator[Gateway]:
    """The gateway in front of two fake workers; `real_network` uses its real transport (for real sockets)."""
    shared_pool: list[tuple[str, ...]] = []
    # The tests' prompts are a few words: the workers load any pool hit, as `WorkerConfig(prefetch_threshold=1)`
    # would (SGLang's default threshold, 256 tokens, would hide every storage hit).
    behaviours = {
        name: FakeWorkerBehaviour(pool=shared_pool, prefetch_threshold=1) for name in ("worker-a", "worker-b")
    }
    # raise_app_exceptions=False: a fake worker that dies mid-stream looks like a closed connection.
    transport = httpx.ASGITransport(
        app=HostDispatch({k: create_fake_worker(v) for k, v in behaviours.items()}), raise_app_exceptions=False
    )
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    options: dict[str, Any] = {
        "workers": WORKER_URLS,
        "database_url": database_url,
        "health_interval_s": 0.05,
        "allow_unauthenticated": True,
        **settings,
    }
    app = create_app(GatewaySettings(**options), worker_transport=None if real_network else transport)
    async with app.router.lifespan_context(app) as state:
        served = WithLifespanState(app, state)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://gateway") as client:
            yield Gateway(client, behaviours, app, state["gateway"], database_url)


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

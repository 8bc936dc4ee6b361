"""Shared fixtures: the anyio backend, free ports, and the gateway app served in-process with its lifespan.

Part-specific fixtures live in each test folder's conftest.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker

OpenGateway = Callable[[Starlette], contextlib.AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A function that returns a TCP port free on 127.0.0.1 right now."""
    return _free_port


class WithLifespanState:
    """Serve an app with the state its lifespan yielded, as a real ASGI server would."""

    def __init__(self, app: Any, state: dict[str, Any]) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope["state"] = dict(self.state)
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def _open_gateway(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app) as state,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=WithLifespanState(app, dict(state or {}))),
            base_url="http://gateway",
            timeout=120,
        ) as client,
    ):
        yield client


@pytest.fixture(scope="session")
def open_gateway() -> OpenGateway:
    """`async with open_gateway(create_app(settings)) as client:` the app, its lifespan run, in-process."""
    return _open_gateway


@pytest.fixture(scope="module")
def engine_worker(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[WorkerProcess]:
    """One real SGLang CPU worker (tiny model, the launcher's defaults) for the module's tests."""
    process = start_worker(WorkerConfig(state_dir=tmp_path_factory.mktemp("engine"), port=free_port()))
    try:
        process.wait_ready(300)
        yield process
    finally:
        process.stop()

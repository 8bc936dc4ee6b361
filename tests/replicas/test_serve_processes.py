"""Two real `sessiongate serve` processes on one SQLite database and one Redis, in front of two fake worker
processes (benchmarks.fake_worker over real HTTP): one client alternating between them sees one gateway."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.processes import FakeWorkerProcess, GatewayServer, local_gateway_env

from .conftest import RedisSpace

ADMIN = {"Authorization": "Bearer admin-key"}
USER = {"role": "user", "content": "plan a trip to Lisbon for three days"}


@pytest.fixture
def two_serve_processes(tmp_path: Path, redis_space: RedisSpace) -> Iterator[tuple[GatewayServer, GatewayServer]]:
    workers = [FakeWorkerProcess(tmp_path) for _ in range(2)]
    started: list[Any] = list(workers)
    try:
        for worker in workers:
            worker.wait_ready()
        env = {
            **local_gateway_env(tmp_path / "replicas.db"),
            "SESSIONGATE_REDIS_URL": redis_space.url,
            "SESSIONGATE_REDIS_PREFIX": redis_space.prefix,
            "SESSIONGATE_ADMIN_KEY": "admin-key",
            "SESSIONGATE_CACHE_SALT_SECRET": "replicas-salt",
            "SESSIONGATE_ADVISORY_TTL_S": "2",
        }
        gateways = []
        for name in ("serve-a", "serve-b"):  # one after the other: the first migrates the database
            gateway = GatewayServer(
                tmp_path, workers=[w.url for w in workers], env={**env, "SESSIONGATE_INSTANCE_ID": name}
            )
            started.append(gateway)
            gateway.wait_ready()
            gateways.append(gateway)
        yield gateways[0], gateways[1]
    finally:
        for process in reversed(started):
            process.stop()


def test_a_hint_on_one_serve_process_is_used_by_the_turn_on_the_other(
    two_serve_processes: tuple[GatewayServer, GatewayServer],
) -> None:
    a, b = two_serve_processes
    with httpx.Client(timeout=30) as client:
        session = {"X-Session-Id": "serve-1"}
        first = client.post(f"{a.url}/v1/chat/completions", json={"messages": [USER]}, headers=session)
        assert first.status_code == 200, first.text
        advisory = client.post(f"{a.url}/v1/sessions/serve-1/typing", json={"state": "started"}).json()
        assert advisory["state"] == "fired"
        time.sleep(0.5)  # the prefetch finishes on the fake worker, and A writes "ready"
        messages = [USER, first.json()["choices"][0]["message"], {"role": "user", "content": "go"}]
        second = client.post(f"{b.url}/v1/chat/completions", json={"messages": messages}, headers=session)
        assert second.status_code == 200, second.text
        assert second.headers["x-sessiongate-worker"] == advisory["worker"]
        deadline = time.monotonic() + 10
        while True:
            shown = client.get(f"{a.url}/v1/admin/sessions/serve-1", headers=ADMIN).json()
            outcomes = [x["outcome"] for x in shown["advisories"]]
            if "pending" not in outcomes or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert outcomes == ["used"]
        assert shown["advisories"][0]["turn_id"] == second.headers["x-sessiongate-turn-id"]
        time.sleep(2.5)  # past the advisory's expiry on A: still one advisory, still used
        shown = client.get(f"{b.url}/v1/admin/sessions/serve-1", headers=ADMIN).json()
        assert [x["outcome"] for x in shown["advisories"]] == ["used"]
        stats = client.get(f"{b.url}/v1/admin/advisories/stats", headers=ADMIN).json()
        assert (stats["scope"], stats["missed"], stats["kinds"]["typing"]["outcomes"]["used"]) == ("replicas", 0, 1)

"""The store unavailable: PostgreSQL stopped (our own throwaway cluster, never the machine's shared server) and
SQLite locked by another writer. While down: 503 in the OpenAI format with Retry-After, quickly, nothing written;
after: success, and the store holds no half-written turn."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.processes import free_port

REPO = Path(__file__).resolve().parents[2]


def postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are: scripts/postgres-bindir.sh knows Debian's /usr/lib/postgresql/<v>/bin."""
    found = subprocess.run(
        ["bash", str(REPO / "scripts" / "postgres-bindir.sh")], capture_output=True, text=True, timeout=30
    )
    return Path(found.stdout.strip()) if found.returncode == 0 else None


class ThrowawayPostgres:
    """initdb in a temp dir and pg_ctl on a free port, run as the postgres OS user; stopped at the end."""

    def __init__(self, root: Path, bindir: Path) -> None:
        self.initdb = shlex.quote(str(bindir / "initdb"))
        self.pg_ctl = shlex.quote(str(bindir / "pg_ctl"))
        self.data = root / "pgdata"
        self.port = free_port()
        self.log = root / "postgres.log"
        shutil.chown(root, "postgres")
        self._as_postgres(f"{self.initdb} -D {self.data} -A trust -U postgres --no-sync > {root / 'initdb.log'} 2>&1")

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, command: str) -> None:
        subprocess.run(["su", "postgres", "-c", command], check=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(f"{self.pg_ctl} -D {self.data} -o '{options}' -l {self.log} -w start > /dev/null")

    def stop(self, mode: str = "immediate") -> None:
        self._as_postgres(f"{self.pg_ctl} -D {self.data} -m {mode} -w stop > /dev/null")

    def running(self) -> bool:
        status = subprocess.run(["su", "postgres", "-c", f"{self.pg_ctl} -D {self.data} status"], capture_output=True)
        return status.returncode == 0


@pytest.fixture
def postgres() -> Iterator[ThrowawayPostgres]:
    bindir = postgres_bindir()
    if bindir is None:
        reason = "no PostgreSQL server binaries (initdb, pg_ctl): see scripts/postgres-bindir.sh"
        if os.environ.get("SESSIONGATE_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)  # CI provisioned PostgreSQL: a missing server is a broken machine, not a skip
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="sessiongate-pg-"))  # outside pytest's 0700 dirs: postgres must enter it
    try:
        server = ThrowawayPostgres(root, bindir)
        server.start()
        try:
            yield server
        finally:
            if server.running():
                server.stop("fast")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _chat(url: str, session_id: str, content: str = "hello") -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": content}]},
        headers={"x-session-id": session_id},
        timeout=30,
    )


def _assert_down(url: str, session_id: str) -> None:
    started = time.monotonic()
    answer = _chat(url, session_id, "while down")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "store_unavailable"
    assert answer.headers["retry-after"] == "1"
    assert httpx.get(f"{url}/v1/sessions/{session_id}", timeout=30).status_code == 503
    assert httpx.get(f"{url}/readyz", timeout=30).status_code == 503
    assert time.monotonic() - started < 8


def test_postgres_down_then_back(
    postgres: ThrowawayPostgres, start_worker: Callable[..., Any], start_gateway: Callable[..., Any]
) -> None:
    worker = start_worker()
    gateway = start_gateway([worker.url], database_url=postgres.url)
    assert _chat(gateway.url, "pg-1").status_code == 200

    postgres.stop("immediate")  # as in a crash
    started = time.monotonic()
    _assert_down(gateway.url, "pg-1")
    _assert_down(gateway.url, "pg-new")
    assert time.monotonic() - started < 5  # refused connections fail fast

    postgres.start()
    assert _chat(gateway.url, "pg-1", "back again").status_code == 200
    turns = httpx.get(f"{gateway.url}/v1/sessions/pg-1/turns", timeout=10).json()["data"]
    assert [t["status"] for t in turns] == ["ok", "ok"]
    assert [t["input_messages"][-1]["content"] for t in turns] == ["hello", "back again"]
    assert httpx.get(f"{gateway.url}/v1/sessions/pg-new", timeout=10).status_code == 404  # nothing half-made


def test_sqlite_locked_then_free(
    tmp_path: Path, start_worker: Callable[..., Any], start_gateway: Callable[..., Any]
) -> None:
    worker = start_worker()
    gateway = start_gateway([worker.url])
    assert _chat(gateway.url, "lite-1").status_code == 200

    blocker = sqlite3.connect(tmp_path / "gateway.db", timeout=1, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    try:
        started = time.monotonic()
        answer = _chat(gateway.url, "lite-1", "while locked")
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "store_unavailable"
        assert time.monotonic() - started < 8  # the busy timeout (5 s), then a clear answer
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    assert _chat(gateway.url, "lite-1", "unlocked").status_code == 200
    rows = sqlite3.connect(tmp_path / "gateway.db").execute(
        "SELECT status FROM turns JOIN sessions ON sessions.id = turns.session_id WHERE sessions.id = 'lite-1' "
        "ORDER BY seq"
    )
    assert [r[0] for r in rows] == ["ok", "ok"]

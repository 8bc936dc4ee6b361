"""The `sessiongate` command, run as a user runs it (a subprocess of the installed entry point)."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def _sessiongate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessiongate.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_help_lists_the_subcommands() -> None:
    result = _sessiongate("--help")
    assert result.returncode == 0
    for command in ("serve", "worker", "up", "demo", "db"):
        assert command in result.stdout


def test_db_upgrade_creates_the_schema_and_is_idempotent(tmp_path: Path) -> None:
    database = tmp_path / "store.db"
    for _ in range(2):
        result = _sessiongate("db", "upgrade", "--database-url", f"sqlite+aiosqlite:///{database}")
        assert result.returncode == 0, result.stderr
        assert "latest schema" in result.stdout
    with sqlite3.connect(database) as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
        tenants = [row[0] for row in db.execute("select id from tenants")]
    assert {"tenants", "sessions", "turns", "tool_calls", "advisories", "workers"} <= tables
    assert tenants == ["default"]


def test_worker_help_does_not_start_anything() -> None:
    result = _sessiongate("worker", "--help")
    assert result.returncode == 0
    assert "--model-path" in result.stdout


def test_serve_refuses_a_bad_setting_clearly(tmp_path: Path) -> None:
    result = _sessiongate(
        "serve", "--worker", "ftp://nowhere", "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    )
    assert result.returncode != 0
    assert "not an http(s) URL" in result.stderr


@pytest.mark.timeout(120)
def test_serve_answers_on_its_port(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sessiongate.cli",
            "serve",
            "--port",
            str(port),
            "--worker",
            "http://127.0.0.1:9",
            "--database-url",
            f"sqlite+aiosqlite:///{tmp_path / 'serve.db'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(300):
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert process.poll() is None, process.stdout.read() if process.stdout else ""
                time.sleep(0.1)
        assert health.json() == {"status": "ok"}
        # The only worker is down: not ready, and a turn is refused in the OpenAI error format.
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 503
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal (its documented behaviour).
    assert process.returncode in (0, -signal.SIGTERM)
    assert '"event": "gateway_started"' in output
    assert "Traceback" not in output


def test_up_serves_smollm2_unless_told_otherwise() -> None:
    from sessiongate.cli import build_parser

    assert build_parser().parse_args(["up"]).model_size == "smollm2"
    assert build_parser().parse_args(["up", "--model", "tiny"]).model_size == "tiny"
    assert build_parser().parse_args(["up", "--model-size", "medium"]).model_size == "medium"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--model", "gpt-5"])


def test_up_tells_the_router_the_kv_size_of_the_model_it_serves() -> None:
    from sessiongate.cli import build_parser
    from sessiongate.gateway.settings import GatewaySettings
    from sessiongate.up import _gateway_defaults

    defaults = _gateway_defaults(build_parser().parse_args(["up"]))
    assert GatewaySettings.from_env(defaults).kv_bytes_per_token == 46_080  # SmolLM2, float32
    assert _gateway_defaults(build_parser().parse_args(["up", "--model", "tiny"])) == {
        "SESSIONGATE_KV_BYTES_PER_TOKEN": str(2 * 2 * 2 * 32 * 4)
    }
    assert _gateway_defaults(build_parser().parse_args(["up", "--model-path", "/models/x"])) == {}

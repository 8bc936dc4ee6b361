"""`sessiongate up`, the README's main command, end to end: real workers (tiny model), the gateway, the demo, and a
stop that leaves nothing running."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_up_runs_the_demo_and_stops_everything(tmp_path: Path, free_port: Callable[[], int]) -> None:
    gateway_port, worker_port = free_port(), free_port()
    # `up` numbers its workers' ports from the base upward: the second one must be free too.
    while worker_port + 1 == gateway_port or _taken(worker_port + 1):
        worker_port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessiongate.cli",
            "up",
            "--model",
            "tiny",
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            str(gateway_port),
            "--worker-base-port",
            str(worker_port),
            "--demo",
            "--exit-after-demo",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "sessiongate is up" in out
    turns = re.findall(r"^  (\d)\s+ok\s", out, re.MULTILINE)
    assert turns == ["1", "2", "3", "4"], out[-4000:]
    assert out.rstrip().endswith("stopped")
    for port in (gateway_port, worker_port, worker_port + 1):
        assert not _listening(port), f"port {port} still answers after `up` stopped"

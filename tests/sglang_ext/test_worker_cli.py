"""`worker_main` (what `sessiongate worker` runs): a real worker in the foreground, stopped by a signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from sessiongate.sglang_ext.protocol import INFO_PATH

pytestmark = pytest.mark.engine

RUN_WORKER = "import sys\nfrom sessiongate.sglang_ext.launcher import worker_main\nsys.exit(worker_main())\n"


def wait_for_line(process: subprocess.Popen[str], pattern: str, timeout: float) -> re.Match[str]:
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r}; the worker said:\n{''.join(seen)}")


def test_worker_runs_until_signalled_then_stops_its_server(
    worker_state_dir: Path, free_ports: Callable[[], int]
) -> None:
    # SIGINT (Ctrl-C) takes the same handler; one server start is enough to check it.
    port = free_ports()
    environ = dict(os.environ, SESSIONGATE_WORKER_STATE_DIR=str(worker_state_dir))
    log_file = worker_state_dir / f"cli-{port}.log"
    command = [sys.executable, "-c", RUN_WORKER, "--port", str(port), "--log-file", str(log_file)]
    with subprocess.Popen(command, env=environ, stderr=subprocess.PIPE, text=True) as cli:
        try:
            ready = wait_for_line(cli, r"ready at (\S+) \(pid (\d+)\)", timeout=300)
            url, server_pid = ready.group(1), int(ready.group(2))
            assert url == f"http://127.0.0.1:{port}"
            assert httpx.get(url + INFO_PATH, timeout=30).status_code == 200
            cli.send_signal(signal.SIGTERM)
            assert cli.wait(timeout=60) == 0
        finally:
            if cli.poll() is None:
                cli.kill()
    # The server's whole process group is gone, and nothing answers on its port.
    with pytest.raises(ProcessLookupError):
        os.killpg(server_pid, 0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health", timeout=5)

"""Real processes for load tests and fault tests: fake workers and the gateway, each its own OS process.

`FakeWorkerProcess` runs `python -m benchmarks.fake_worker`, `GatewayServer` runs `sessiongate serve` (uvicorn,
uvloop, httptools: what production runs). Both log to a file, are started in their own process group and are
stopped by their pid only; `kill()` sends SIGKILL (a crash), `pause()`/`resume()` SIGSTOP/SIGCONT (a hang).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

__all__ = ["FakeWorkerProcess", "GatewayServer", "ManagedProcess", "free_port"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ManagedProcess:
    def __init__(self, command: list[str], *, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_http(self, url: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.log_path.name}: exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{url} not ready after {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as in a crash."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        self._log.close()


class FakeWorkerProcess(ManagedProcess):
    def __init__(self, log_dir: Path, *, port: int | None = None, token_delay_s: float = 0.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "benchmarks.fake_worker", "--port", str(self.port)]
        command += ["--token-delay-s", str(token_delay_s)]
        super().__init__(command, log_path=log_dir / f"fake-worker-{self.port}.log")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_http(f"{self.url}/health", timeout_s)


class GatewayServer(ManagedProcess):
    """`sessiongate serve` on a free port; `env` holds SESSIONGATE_* settings."""

    def __init__(self, log_dir: Path, *, workers: list[str], env: Mapping[str, str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "sessiongate.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        for worker in workers:
            command += ["--worker", worker]
        super().__init__(command, log_path=log_dir / f"gateway-{self.port}.log", env=env)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_http(f"{self.url}/healthz", timeout_s)

"""Real processes for load tests and fault tests: fake workers and the gateway, each its own OS process.

`FakeWorkerProcess` runs `python -m sessiongate.benchmarks.fake_worker`, `GatewayServer` runs `sessiongate serve`
(uvicorn,
uvloop, httptools: what production runs), `SmgProcess` runs SGLang's model gateway (`smg`, Rust: the router's
current home) and `SglangRouterProcess` its predecessor (the `sglang-router` 0.3.2 wheel) for comparisons.
All log to a file, are started in their own process group and are stopped by their pid only; `kill()` sends
SIGKILL (a crash), `pause()`/`resume()` SIGSTOP/SIGCONT (a hang).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from sessiongate.sglang_ext.ports import pick_port

__all__ = [
    "FakeWorkerProcess",
    "FloorProxyProcess",
    "GatewayServer",
    "ManagedProcess",
    "SglangRouterProcess",
    "SmgProcess",
    "free_port",
    "local_gateway_env",
    "sglang_router_installed",
    "smg_installed",
]


_LIBC = ctypes.CDLL(None, use_errno=True)


def free_port() -> int:
    """A port free on 127.0.0.1 now, outside the kernel's ephemeral range (`sglang_ext.ports.pick_port`)."""
    return pick_port()


class ManagedProcess:
    def __init__(
        self, command: list[str], *, log_path: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            cwd=cwd,
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

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) of the running process so far, to the nanosecond.

        Its POSIX CPU-time clock, not /proc/<pid>/stat (what psutil reads): that counts in 10 ms ticks, too coarse
        for a proxy that spends tens of microseconds per request."""
        clock = ctypes.c_int()
        error = _LIBC.clock_getcpuclockid(self.pid, ctypes.byref(clock))
        if error:
            raise OSError(error, f"clock_getcpuclockid({self.pid}): {os.strerror(error)}")
        return time.clock_gettime(clock.value)

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
    """`prefix_cache=False` turns off the fake's cache model, whose lookup cost grows with every prompt it has
    seen: a worker for throughput benchmarks, whose cost must stay flat over thousands of requests."""

    def __init__(
        self, log_dir: Path, *, port: int | None = None, token_delay_s: float = 0.0, prefix_cache: bool = True
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "sessiongate.benchmarks.fake_worker", "--port", str(self.port)]
        command += ["--token-delay-s", str(token_delay_s)]
        if not prefix_cache:
            command.append("--no-prefix-cache")
        super().__init__(command, log_path=log_dir / f"fake-worker-{self.port}.log")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_http(f"{self.url}/health", timeout_s)


class FloorProxyProcess(ManagedProcess):
    """`benchmarks.floor_proxy` in front of `workers`: the least a Python gateway on this stack costs per turn (with
    `database_url`, the least one that records every turn there costs)."""

    def __init__(
        self,
        log_dir: Path,
        *,
        workers: list[str],
        port: int | None = None,
        database_url: str | None = None,
        least_store: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "sessiongate.benchmarks.floor_proxy", "--port", str(self.port)]
        for worker in workers:
            command += ["--worker", worker]
        if database_url is not None:  # the stored floor: every turn recorded
            command += ["--database-url", database_url]
        if least_store is not None:  # the least stored floor: every turn recorded the least way
            command += ["--least-store", str(least_store)]
        super().__init__(command, log_path=log_dir / f"floor-proxy-{self.port}.log")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Up when it answers at all (it has no health route: any path but the chat route is 404)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.log_path.name}: exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                httpx.get(f"{self.url}/", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.url} not ready after {timeout_s} s:\n{self.log_tail()}")


class GatewayServer(ManagedProcess):
    """`sessiongate serve` on a free port; `env` holds SESSIONGATE_* settings. `cwd`: where it runs (`python -m` puts
    that directory first on its path, ahead of PYTHONPATH: a gateway meant to run another source tree runs there)."""

    def __init__(
        self,
        log_dir: Path,
        *,
        workers: list[str],
        env: Mapping[str, str],
        port: int | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "sessiongate.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        for worker in workers:
            command += ["--worker", worker]
        super().__init__(command, log_path=log_dir / f"gateway-{self.port}.log", env=env, cwd=cwd)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        self.wait_http(f"{self.url}/healthz", timeout_s)


def local_gateway_env(database_path: Path, *, log_level: str = "warning") -> dict[str, str]:
    """A benchmark gateway's settings: no keys (local use), its own SQLite store, so sessions persist."""
    return {
        "SESSIONGATE_ALLOW_UNAUTHENTICATED": "1",
        "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{database_path}",
        "SESSIONGATE_LOG_LEVEL": log_level,
    }


# `python -m sglang_router.launch_router` imports the wheel's Python mini load balancer, which imports SGLang
# itself (and torch); the Rust router needs only these two modules.
_SGLANG_ROUTER_MAIN = """
import argparse, sys
from sglang_router.router import Router
from sglang_router.router_args import RouterArgs
parser = argparse.ArgumentParser()
RouterArgs.add_cli_args(parser, use_router_prefix=False)
args = RouterArgs.from_cli_args(parser.parse_args(sys.argv[1:]), use_router_prefix=False)
args._validate_router_args()
Router.from_args(args).start()
"""


def sglang_router_installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


class SglangRouterProcess(ManagedProcess):
    """SGLang's router (the `sglang-router` wheel) in front of `workers`.

    `policy="manual"` routes by the `x-smg-routing-key` header, each key sticking to one worker: its session
    persistence. Its Prometheus listener gets a free port of its own, so that two routers never collide.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        workers: list[str],
        policy: str = "manual",
        log_level: str = "warn",
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-c", _SGLANG_ROUTER_MAIN, "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--worker-urls", *workers, "--policy", policy, "--log-level", log_level]
        command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        super().__init__(command, log_path=log_dir / f"sglang-router-{self.port}.log")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        # /health answers before the workers are registered; /readiness only once one can be routed to.
        self.wait_http(f"{self.url}/readiness", timeout_s)


def smg_installed() -> bool:
    return importlib.util.find_spec("smg") is not None


class SmgProcess(ManagedProcess):
    """SGLang's model gateway (`smg launch`, the `smg` wheel, Rust) in front of `workers`.

    `policy="manual"` routes by the `x-smg-routing-key` header, each key sticking to one worker (session
    persistence); `cache_aware` is its prefix-tree policy. Its Prometheus listener gets a free port of its own.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        workers: list[str],
        policy: str = "manual",
        log_level: str = "warn",
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # `python -m smg`, not the `smg` script: sglang-router 0.3.2 installs a console script of the same name (its
        # own CLI, which imports all of sglang), and whichever wheel was installed last owns `bin/smg`.
        command = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--worker-urls", *workers, "--policy", policy, "--log-level", log_level]
        command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        super().__init__(command, log_path=log_dir / f"smg-{self.port}.log")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self.wait_http(f"{self.url}/readiness", timeout_s)

"""A Mooncake Store master on this machine, for workers that use Mooncake as their shared KV pool.

Mooncake Store (the `mooncake` extra: `mooncake-transfer-engine`, or `mooncake-transfer-engine-non-cuda`
on a machine without CUDA) keeps each KV page in the memory that some worker lent to the pool
(`WorkerConfig.mooncake_segment_bytes`); the master only knows which page is where. One master
process serves the RPC service the workers' clients talk to, the transfer engine's HTTP metadata
service, and an HTTP admin port (`/health`, `/metrics`, `/get_all_keys`).

- `MasterConfig`: ports, bind address and log file; `pool_of(worker_config)` points a worker at it.
- `start_master(config)`: starts `mooncake_master` in its own process group and returns a
  `MooncakeMaster` (`wait_ready()`, `keys()`, `segments()`, `stop()`, a context manager).
- `mooncake_unavailable()`: why the Mooncake client cannot be used here, or None.
- A pool whose memory no worker lends (workers with `mooncake_segment_bytes=0`) lives in storage nodes:
  `sglang_ext.mooncake_node`.

Like the worker launcher, this imports nothing of Mooncake itself: the master runs under the
worker interpreter (`MasterConfig.python`), which has the package.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sessiongate.sglang_ext.worker_config import WorkerConfig
from sessiongate.sglang_ext.worker_process import log_tail

__all__ = [
    "MasterConfig",
    "MasterStartError",
    "MooncakeMaster",
    "build_master_command",
    "mooncake_unavailable",
    "spawn_logged",
    "start_master",
    "stop_process_group",
]

_POLL_SECONDS = 0.2


class MasterStartError(RuntimeError):
    """`mooncake_master` exited or did not become ready; the message ends with its log's tail."""


@dataclass(frozen=True)
class MasterConfig:
    """One `mooncake_master`: where it listens (all three services on `host`) and where it logs."""

    host: str = "127.0.0.1"
    rpc_port: int = 50051
    metadata_port: int = 8080
    admin_port: int = 9003
    """HTTP admin/metrics: `/health`, `/metrics`, `/get_all_keys`."""
    log_file: Path = Path(".sessiongate/logs/mooncake-master.log")
    python: str | None = None
    """The interpreter whose `mooncake` package holds the binary; None: this one."""
    extra_args: tuple[str, ...] = ()
    """More `mooncake_master` flags, e.g. `--default_kv_lease_ttl=30s`."""
    launch_prefix: tuple[str, ...] = ()
    """What runs the master's command, e.g. `ip netns exec sg-NAME` for a master behind an emulated link
    (`benchmarks.pool_link`); it must exec the command, so that the process started is the master."""

    @property
    def master_address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def pool_of(self, worker: WorkerConfig) -> WorkerConfig:
        """`worker` with this master's Mooncake Store as its KV pool."""
        return worker.replace(
            storage_backend="mooncake",
            mooncake_master=self.master_address,
            mooncake_metadata_server=self.metadata_server,
        )


def build_master_command(config: MasterConfig) -> list[str]:
    # `mooncake.cli` execs the binary shipped inside the wheel, so the process we start is the master.
    return [
        *config.launch_prefix,
        config.python or sys.executable,
        "-m",
        "mooncake.cli",
        f"--rpc_address={config.host}",
        f"--rpc_port={config.rpc_port}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={config.host}",
        f"--http_metadata_server_port={config.metadata_port}",
        f"--metrics_host={config.host}",
        f"--metrics_port={config.admin_port}",
        *config.extra_args,
    ]


@dataclass
class MooncakeMaster:
    """A started `mooncake_master`. `stop()` is idempotent; use as a context manager to stop on exit."""

    config: MasterConfig
    process: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """The master's exit code once it has ended, else None."""
        return self.process.poll()

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.config.admin_url + path, timeout=5.0) as response:
            body: bytes = response.read()
            return body

    def _serving(self) -> bool:
        try:
            health = json.loads(self._get("/health"))
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return False
        return bool(health.get("service_ready"))

    def wait_ready(self, timeout: float = 30.0) -> float:
        """Block until the admin `/health` says the service is ready; return the seconds since start."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise self._failure(f"mooncake_master exited with code {self.process.returncode}")
            if self._serving():
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise self._failure(f"mooncake_master was not ready after {timeout:.0f} s")
            time.sleep(_POLL_SECONDS)

    def keys(self) -> list[str]:
        """Every key the master knows (its admin `/get_all_keys`, one per line)."""
        return [line for line in self._get("/get_all_keys").decode().splitlines() if line]

    def segments(self) -> list[str]:
        """The segments mounted in the pool, `host:port` each (its admin `/get_all_segments`)."""
        return [line for line in self._get("/get_all_segments").decode().splitlines() if line]

    def _failure(self, what: str) -> MasterStartError:
        return MasterStartError(f"{what}; the end of {self.config.log_file}:\n{log_tail(self.config.log_file)}")

    def kill(self) -> None:
        """End the master at once, as a crash would (the workers are not told)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL to its process group after `timeout` seconds; return its exit code."""
        return stop_process_group(self.process, timeout)

    def __enter__(self) -> MooncakeMaster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_master(config: MasterConfig) -> MooncakeMaster:
    """Start `mooncake_master` for `config` in its own process group; call `wait_ready()` next."""
    return MooncakeMaster(config=config, process=spawn_logged(build_master_command(config), config.log_file))


def spawn_logged(command: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    """`command` in its own process group, its output appended to `log_file` after a line naming it."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(f"\n=== sessiongate: starting {' '.join(command)}\n".encode())
        log.flush()
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop_process_group(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, then SIGKILL to its process group after `timeout` seconds; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def mooncake_unavailable(python: str | None = None) -> str | None:
    """None when `python` (default: this interpreter) can import the Mooncake Store client, else why not.

    Checked in a child process: the client is a native extension whose shared libraries (libibverbs,
    librdmacm, libnuma; libcuda for the CUDA wheel) are only looked for at import.
    """
    probe = subprocess.run(
        [python or sys.executable, "-c", "from mooncake.store import MooncakeDistributedStore"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode == 0:
        return None
    return probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit code {probe.returncode}"

"""A Mooncake Store storage node: a client that lends the pool its memory and does nothing else.

Workers normally lend the pool their own memory (`WorkerConfig.mooncake_segment_bytes`), so most of a page's
reads stay on the worker's machine. For a pool that lives elsewhere, as a cluster's dedicated pool servers do,
the workers lend nothing (`mooncake_segment_bytes=0`: Mooncake 0.3.13 takes a client with no segment) and a
storage node holds the pages: every put and get then crosses the network to it (`benchmarks.pool_link` puts it
behind an emulated link).

- `StorageNodeConfig`, `start_storage_node(config)` -> `StorageNode` (`wait_ready(master)`, `stop()`, a context
  manager); `python -m sessiongate.sglang_ext.mooncake_node --hostname ...` is the node itself (`main`).

Like `sglang_ext.mooncake`, importing this imports nothing of Mooncake: the node runs under the worker
interpreter, which has it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sessiongate.sglang_ext.mooncake import (
    MasterConfig,
    MasterStartError,
    MooncakeMaster,
    spawn_logged,
    stop_process_group,
)
from sessiongate.sglang_ext.worker_process import log_tail

__all__ = ["StorageNode", "StorageNodeConfig", "build_node_command", "main", "start_storage_node"]

_READY_LINE = "storage node ready"


@dataclass(frozen=True)
class StorageNodeConfig:
    """One storage node of the pool that `master` runs: the memory it lends, and where it is reached."""

    master: MasterConfig
    hostname: str
    """The address the workers' transfer engines reach its segment at."""
    segment_bytes: int = 512 << 20
    local_buffer_bytes: int = 16 << 20
    protocol: str = "tcp"
    log_file: Path = Path(".sessiongate/logs/mooncake-node.log")
    python: str | None = None
    """The interpreter with the `mooncake` package; None: this one."""
    launch_prefix: tuple[str, ...] = ()
    """As `MasterConfig.launch_prefix`, e.g. `ip netns exec sg-NAME`."""


def build_node_command(config: StorageNodeConfig) -> list[str]:
    return [
        *config.launch_prefix,
        config.python or sys.executable,
        "-m",
        "sessiongate.sglang_ext.mooncake_node",
        f"--hostname={config.hostname}",
        f"--metadata-server={config.master.metadata_server}",
        f"--master={config.master.master_address}",
        f"--segment-bytes={config.segment_bytes}",
        f"--local-buffer-bytes={config.local_buffer_bytes}",
        f"--protocol={config.protocol}",
    ]


@dataclass
class StorageNode:
    config: StorageNodeConfig
    process: subprocess.Popen[bytes]

    def wait_ready(self, master: MooncakeMaster, timeout: float = 30.0) -> None:
        """Block until the node has mounted its segment and the master lists it."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise self._failure(f"the storage node exited with code {self.process.returncode}")
            log = self.config.log_file.read_text(errors="replace") if self.config.log_file.exists() else ""
            if _READY_LINE in log and any(s.startswith(f"{self.config.hostname}:") for s in master.segments()):
                return
            if time.monotonic() > deadline:
                raise self._failure(f"the storage node was not ready after {timeout:.0f} s")
            time.sleep(0.2)

    def _failure(self, what: str) -> MasterStartError:
        return MasterStartError(f"{what}; the end of {self.config.log_file}:\n{log_tail(self.config.log_file)}")

    def stop(self, timeout: float = 10.0) -> int:
        return stop_process_group(self.process, timeout)

    def __enter__(self) -> StorageNode:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_storage_node(config: StorageNodeConfig) -> StorageNode:
    """Start the node in its own process group; call `wait_ready(master)` next."""
    return StorageNode(config=config, process=spawn_logged(build_node_command(config), config.log_file))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--metadata-server", required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--segment-bytes", type=int, required=True)
    parser.add_argument("--local-buffer-bytes", type=int, default=16 << 20)
    parser.add_argument("--protocol", default="tcp")
    args = parser.parse_args(argv)
    from mooncake.store import MooncakeDistributedStore  # type: ignore[import-untyped]

    # Blocked before Mooncake starts its threads, so that they inherit the mask and only `sigwait` takes them.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    store = MooncakeDistributedStore()
    code = store.setup(
        args.hostname,
        args.metadata_server,
        args.segment_bytes,
        args.local_buffer_bytes,
        args.protocol,
        "",
        args.master,
    )
    if code != 0:
        print(f"storage node: setup failed with code {code}", flush=True)
        return 1
    print(f"{_READY_LINE}: {args.segment_bytes} bytes at {args.hostname}", flush=True)
    signal.sigwait(stop_signals)  # the segment stays mounted while we wait
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The shared KV pool behind an emulated network link, for the replay and the tests: rate, delay, and the arithmetic.

On a CPU machine every tier is slow and the pool is in the same memory, so a page read back from the pool costs
next to nothing next to a prefill; on a GPU cluster it crosses a network whose rate is a real share of the prefill
it saves. `PoolLink` puts the pool's far side (a Mooncake master and storage node, `sglang_ext.mooncake`) in a
network namespace behind `scripts/pool-link.sh`, a link with a set rate and delay in both directions, and
`pool_link_rate_mbit` says which rate makes a read cost on this machine the share of a prefill it costs an H100
(docs/benchmarks.md, "An emulated pool link").

- `PoolLink(name, rate_mbit, delay_ms)`: a context manager; `local` / `remote` addresses, `netns`, `command(argv)`
  (the argv that runs in the namespace), `popen(argv)`, `run(argv)`.
- `link_unavailable()`: why a link cannot be made here (not root, no `ip netns`, no TUN, no script), or None.
- `far_pool(link, state_dir)`: a Mooncake master and one storage node lending the pool's memory, both in the
  namespace; `FarPool.pool_of(worker)` points a worker at it, lending nothing itself, so that every page it reads
  from the pool crosses the link.
- `measure_link(link)`: bandwidth both ways and the round trip, over TCP to a process in the namespace.
- `pool_link_rate_mbit(kv_bytes_per_token, prefill_tokens_per_s, ratio)`; `LinkSpec` / `link_spec(text, model)`,
  the replay's `--pool-link` (`auto`: the rate for the model from its prefill measured on these machines).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessiongate.sglang_ext.models import kv_bytes_per_token
from sessiongate.sglang_ext.mooncake import MasterConfig, MooncakeMaster, start_master
from sessiongate.sglang_ext.mooncake_node import StorageNode, StorageNodeConfig, start_storage_node
from sessiongate.sglang_ext.worker_config import WorkerConfig

__all__ = [
    "H100_POOL_READ_RATIO",
    "MEASURED_PREFILL_TOKENS_PER_S",
    "FarPool",
    "LinkMeasurement",
    "LinkSpec",
    "PoolLink",
    "PoolLinkError",
    "far_pool",
    "link_spec",
    "link_unavailable",
    "measure_link",
    "pool_link_rate_mbit",
]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pool-link.sh"

H100_POOL_READ_RATIO = 131072 / 12.5e9 / (1 / 40000)
"""A token's KV read over the pool's link, as a share of its prefill, on an H100 with an 8B model: Llama-3.1-8B's
128 KiB of KV per token over a 100 Gb/s link (12.5 GB/s) against ~40k tokens/s of prefill: ~0.42."""


MEASURED_PREFILL_TOKENS_PER_S: dict[str, float] = {"tiny": 21159.0, "medium": 848.0, "smollm2": 248.0}
"""Cold prefill of 2,048 tokens on one thread of the 2-core machines these benchmarks run on (2026-11-28,
`python -m sessiongate.benchmarks.pool_link_rate`; docs/benchmarks.md, "An emulated pool link")."""


class PoolLinkError(RuntimeError):
    """`pool-link.sh` failed; the message holds what it printed."""


def pool_link_rate_mbit(
    kv_bytes_per_token: float, prefill_tokens_per_s: float, ratio: float = H100_POOL_READ_RATIO
) -> float:
    """The link rate (Mbit/s) at which reading a token's KV takes `ratio` of the time its prefill takes.

    read = bytes / rate and prefill = 1 / tokens_per_s, so rate = bytes x tokens_per_s / ratio (in bits).
    """
    if kv_bytes_per_token <= 0 or prefill_tokens_per_s <= 0 or ratio <= 0:
        raise ValueError("kv_bytes_per_token, prefill_tokens_per_s and ratio must be positive")
    return kv_bytes_per_token * 8 * prefill_tokens_per_s / ratio / 1e6


@dataclass(frozen=True)
class LinkSpec:
    """The link a replay puts between its workers and their shared pool, and the pool's size behind it."""

    rate_mbit: float
    delay_ms: float = 0.5
    pool_bytes: int = 1 << 30


def link_spec(rate: str, model_size: str, delay_ms: float = 0.5) -> LinkSpec:
    """`rate`: Mbit/s, or `auto` for the rate that gives `model_size` an H100's read/prefill share here."""
    if rate == "auto":
        if model_size not in MEASURED_PREFILL_TOKENS_PER_S:
            raise ValueError(f"no measured prefill rate for {model_size!r}: give the link's rate in Mbit/s")
        mbit = pool_link_rate_mbit(kv_bytes_per_token(model_size), MEASURED_PREFILL_TOKENS_PER_S[model_size])
    else:
        mbit = float(rate)
    if mbit <= 0 or delay_ms < 0:
        raise ValueError(f"a link needs a positive rate and a delay of 0 or more, got {rate} and {delay_ms}")
    return LinkSpec(round(mbit, 1), delay_ms)


def link_unavailable() -> str | None:
    """None when `PoolLink` can work here, else why not."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if not SCRIPT.is_file():
        return f"{SCRIPT} is not here (a checkout has it, an installed wheel does not)"
    if os.geteuid() != 0:
        return "making a network namespace and shaping its link needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2's `ip` and `tc` are not installed"
    if shutil.which("python3") is None:
        return "no `python3` on the PATH (it runs the link's relay, sessiongate/benchmarks/link_relay.py)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (the link's devices are TUN devices)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


@dataclass(frozen=True)
class LinkAddresses:
    netns: str
    local: str
    remote: str


class PoolLink:
    """`scripts/pool-link.sh up` on enter, `down` on exit (also when `up` fails half way)."""

    def __init__(
        self, name: str, rate_mbit: float, delay_ms: float, loss_pct: float = 0.0, *, block: int | None = None
    ) -> None:
        self.name = name
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.loss_pct = loss_pct
        self.block = block
        self._addresses: LinkAddresses | None = None

    def _script(self, *args: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PoolLinkError(f"pool-link.sh {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def up(self) -> PoolLink:
        args = ["up", self.name, "--rate", f"{max(1, round(self.rate_mbit * 1000))}kbit", "--delay", f"{self.delay_ms}"]
        if self.loss_pct:
            args += ["--loss", f"{self.loss_pct}"]
        if self.block is not None:
            args += ["--block", str(self.block)]
        fields = dict(part.split("=", 1) for part in self._script(*args).split())
        self._addresses = LinkAddresses(fields["netns"], fields["local"], fields["remote"])
        return self

    def down(self) -> None:
        self._script("down", self.name)
        self._addresses = None

    def status(self) -> str:
        return self._script("status", self.name)

    @property
    def addresses(self) -> LinkAddresses:
        if self._addresses is None:
            raise PoolLinkError(f"link {self.name} is not up")
        return self._addresses

    @property
    def netns(self) -> str:
        return self.addresses.netns

    @property
    def local(self) -> str:
        """This side's address: what processes in the namespace reach us at."""
        return self.addresses.local

    @property
    def remote(self) -> str:
        """The namespace's address: the pool's far side."""
        return self.addresses.remote

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run in the namespace (`ip netns exec` execs it: the process started is `argv[0]` itself)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(argv), capture_output=True, text=True, check=False, **kwargs)

    def __enter__(self) -> PoolLink:
        try:
            return self.up()
        except BaseException:
            with contextlib.suppress(PoolLinkError):
                self.down()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.down()


# A stdlib echo peer for `measure_link`, run in the namespace: per connection, a 1-byte ping is answered with one
# byte; `S<n>\n` makes it read n bytes then send one; `R<n>\n` makes it send n bytes.
_PEER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        f = conn.makefile("rb")
        while True:
            line = f.readline()
            if not line:
                break
            kind, n = line[:1], int(line[1:].strip() or 0)
            if kind == b"P":
                conn.sendall(b"p")
            elif kind == b"S":
                left = n
                while left:
                    left -= len(f.read1(min(left, 1 << 20)))
                conn.sendall(b"s")
            elif kind == b"R":
                chunk = bytes(1 << 20)
                while n:
                    conn.sendall(chunk[: min(n, len(chunk))])
                    n -= min(n, len(chunk))
"""


@dataclass(frozen=True)
class LinkMeasurement:
    up_mbit: float
    """This side to the namespace, Mbit/s of payload."""
    down_mbit: float
    """The namespace to this side."""
    rtt_ms: float
    """Median round trip of a 1-byte ping over an open connection."""


def measure_link(link: PoolLink, nbytes: int = 30 << 20, pings: int = 20, port: int = 5201) -> LinkMeasurement:
    """Send `nbytes` each way over one TCP connection to a peer in the namespace, and ping it `pings` times."""
    peer = link.popen([sys.executable, "-c", _PEER, link.remote, str(port)], stdout=subprocess.PIPE)
    try:
        assert peer.stdout is not None
        peer.stdout.readline()
        with socket.create_connection((link.remote, port), timeout=60) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            rtts = []
            for _ in range(pings):
                started = time.perf_counter()
                conn.sendall(b"P\n")
                conn.recv(1)
                rtts.append(time.perf_counter() - started)
            payload = bytes(1 << 20)
            started = time.perf_counter()
            conn.sendall(f"S{nbytes}\n".encode())
            left = nbytes
            while left:
                left -= conn.send(payload[: min(left, len(payload))])
            conn.recv(1)
            up_s = time.perf_counter() - started
            started = time.perf_counter()
            conn.sendall(f"R{nbytes}\n".encode())
            left = nbytes
            while left:
                got = conn.recv(min(left, 1 << 20))
                if not got:
                    raise PoolLinkError("the peer closed the connection")
                left -= len(got)
            down_s = time.perf_counter() - started
        rtts.sort()
        return LinkMeasurement(nbytes * 8 / up_s / 1e6, nbytes * 8 / down_s / 1e6, rtts[len(rtts) // 2] * 1000)
    finally:
        peer.kill()
        peer.wait()
        if peer.stdout is not None:
            peer.stdout.close()


@dataclass(frozen=True)
class FarPool:
    """A Mooncake Store whose master and memory are on the far side of `link`."""

    link: PoolLink
    master: MooncakeMaster
    node: StorageNode

    def pool_of(self, worker: WorkerConfig) -> WorkerConfig:
        """`worker` using this pool from this side of the link, lending it no memory of its own."""
        return self.master.config.pool_of(worker).replace(
            mooncake_segment_bytes=0, mooncake_local_hostname=self.link.local
        )


@contextlib.contextmanager
def far_pool(
    link: PoolLink,
    state_dir: Path,
    pool_bytes: int = 512 << 20,
    ports: tuple[int, int, int] = (50051, 8080, 9003),
    python: str | None = None,
) -> Iterator[FarPool]:
    """Start a master (RPC, metadata and admin on `ports`) and a storage node lending `pool_bytes`, in the
    namespace; stop both on exit. Their logs go to `state_dir`."""
    in_netns = ("ip", "netns", "exec", link.netns)
    master_config = MasterConfig(
        host=link.remote,
        rpc_port=ports[0],
        metadata_port=ports[1],
        admin_port=ports[2],
        log_file=state_dir / f"mooncake-master-{link.name}.log",
        python=python,
        launch_prefix=in_netns,
    )
    with start_master(master_config) as master:
        master.wait_ready()
        node_config = StorageNodeConfig(
            master=master_config,
            hostname=link.remote,
            segment_bytes=pool_bytes,
            log_file=state_dir / f"mooncake-node-{link.name}.log",
            python=python,
            launch_prefix=in_netns,
        )
        with start_storage_node(node_config) as node:
            node.wait_ready(master)
            yield FarPool(link, master, node)

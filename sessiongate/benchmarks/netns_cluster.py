"""A whole deployment on one machine, each part on its own network: for fault tests that need a real network.

`scripts/netns-cluster.sh` makes one network namespace per node on one bridge (198.19.N.0/24); this module starts
the parts in them with `ip netns exec`, each bound to its node's address, none to loopback:

    gw1, gw2   `sessiongate serve` replicas sharing the store and Redis (port 8000)
    wk1, wk2   `sessiongate worker`: real SGLang CPU workers (the tiny model unless `model_size` says otherwise),
               the Mooncake pool (port 30000)
    pg         PostgreSQL (a throwaway cluster: initdb, pg_ctl; port 5432)
    rd         redis-server (port 6379, nothing saved)
    mc         the Mooncake master and one storage node lending the pool's memory; its link runs through
               `link_relay.py` (TAP), so `shape("mc", delay_ms, loss_pct)` slows or breaks it while it runs

The test process is the client, on the bridge at `.1`. Faults: `cut(role)` / `heal(role)` (the node's link down,
packets vanish, connections stay half-open), `shape(role, ...)`, `signal(role, sig)` (every process of the node:
SIGSTOP a hang, SIGKILL a crash), `stop(role)` / `start_gateway(role)`. Everything stops, and the namespaces and
devices go, on exit, also when the start fails half way (`NetnsCluster` is a context manager).

- `netns_unavailable()`: why a cluster cannot be made here, or None.
- `ClusterNetwork(name)`: the network alone (`up`, `down`, `node`, `command`, `cut`, `heal`, `shape`).
- `NetnsCluster(name, root)`: the network and every process; `gateway_url(role)`, `worker_url(role)`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from sessiongate.sglang_ext.mooncake import MasterConfig, MooncakeMaster, start_master
from sessiongate.sglang_ext.mooncake_node import StorageNode, StorageNodeConfig, start_storage_node

from .processes import ManagedProcess

__all__ = [
    "NODES",
    "ClusterError",
    "ClusterNetwork",
    "NetnsCluster",
    "Node",
    "netns_unavailable",
]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "netns-cluster.sh"
POSTGRES_BINDIR_SCRIPT = SCRIPT.parent / "postgres-bindir.sh"
NODES = ("gw1", "gw2", "wk1", "wk2", "pg", "rd", "mc")
GATEWAY_PORT, WORKER_PORT, PG_PORT, REDIS_PORT = 8000, 30000, 5432, 6379
MOONCAKE_PORTS = (50051, 8080, 9003)
POSTGRES_KEEPALIVES = "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
"""Server-side TCP keepalives, as docs/tenancy-and-faults.md advises for any PostgreSQL the gateways reach over a
network: a backend whose client vanished in a partition ends about 25 s after its last traffic."""


class ClusterError(RuntimeError):
    """The script failed or a part did not start; the message says which and holds its output or log."""


def netns_unavailable() -> str | None:
    """None when a cluster can be made here, else why not."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if not SCRIPT.is_file():
        return f"{SCRIPT} is not here (a checkout has it, an installed wheel does not)"
    if os.geteuid() != 0:
        return "making network namespaces and a bridge needs root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("python3") is None:
        return "no `python3` on the PATH (it runs the pool link's relay, sessiongate/benchmarks/link_relay.py)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (the pool's link is a pair of TAP devices)"
    if shutil.which("redis-server") is None:
        return "no redis-server (scripts/ensure-redis.sh)"
    if subprocess.run(["bash", str(POSTGRES_BINDIR_SCRIPT)], capture_output=True, check=False).returncode != 0:
        return "no PostgreSQL server binaries (initdb, pg_ctl): see scripts/postgres-bindir.sh"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


@dataclass(frozen=True)
class Node:
    role: str
    netns: str
    address: str
    device: str
    """Its link's device on the bridge's side: `cut` sets it down."""


class ClusterNetwork:
    """`netns-cluster.sh up` on enter (undone if it fails half way), `down` on exit."""

    def __init__(self, name: str, nodes: tuple[str, ...] = NODES, *, relayed: tuple[str, ...] = ("mc",)) -> None:
        self.name = name
        self.roles = nodes
        self.relayed = relayed
        self.nodes: dict[str, Node] = {}
        self.client = ""

    def _script(self, *args: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ClusterError(f"netns-cluster.sh {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def up(self) -> ClusterNetwork:
        relay = ["--relay", " ".join(self.relayed)] if self.relayed else []
        out = self._script("up", self.name, "--nodes", " ".join(self.roles), *relay)
        for line in out.splitlines():
            fields = dict(part.split("=", 1) for part in line.split())
            if "client" in fields:
                self.client = fields["client"]
            elif "node" in fields:
                node = Node(fields["node"], fields["netns"], fields["addr"], fields["dev"])
                self.nodes[node.role] = node
        return self

    def down(self) -> None:
        self._script("down", self.name)

    def node(self, role: str) -> Node:
        return self.nodes[role]

    def address(self, role: str) -> str:
        return self.nodes[role].address

    def command(self, role: str, argv: list[str]) -> list[str]:
        """`argv` run in the node's namespace (`ip netns exec` execs it: the process started is `argv[0]`)."""
        return ["ip", "netns", "exec", self.nodes[role].netns, *argv]

    def pids(self, role: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.nodes[role].netns], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def signal(self, role: str, sig: signal.Signals) -> None:
        """Send `sig` to every process in the node's namespace (its whole software, as a host's)."""
        for pid in self.pids(role):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def cut(self, role: str) -> None:
        self._script("cut", self.name, role)

    def heal(self, role: str) -> None:
        self._script("heal", self.name, role)

    def shape(self, role: str, delay_ms: float, loss_pct: float) -> None:
        """Delay (each way) and loss on a relayed node's link, from now on; `shape(role, 0, 0)` removes them."""
        self._script("shape", self.name, role, "--delay", f"{delay_ms:g}", "--loss", f"{loss_pct:g}")

    def status(self) -> str:
        return self._script("status", self.name)

    def __enter__(self) -> ClusterNetwork:
        try:
            return self.up()
        except BaseException:
            with contextlib.suppress(ClusterError):
                self.down()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.down()


def _wait_http(url: str, process: ManagedProcess | None, timeout_s: float, *, ok: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.process.poll() is not None:
            raise ClusterError(
                f"{process.log_path.name} exited with {process.process.returncode}:\n{process.log_tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code in ok:
                return
        time.sleep(0.2)
    tail = process.log_tail() if process is not None else ""
    raise ClusterError(f"{url} not ready after {timeout_s:.0f} s:\n{tail}")


class NetnsCluster:
    """The cluster of the module docstring under `root` (logs, databases, models): `start()` / `stop()`, or a
    context manager. `gateway_env` adds SESSIONGATE_* settings to both replicas."""

    def __init__(
        self,
        name: str,
        root: Path,
        *,
        gateway_env: Mapping[str, str] | None = None,
        pool_bytes: int = 256 << 20,
        python: str | None = None,
        model_size: str = "tiny",
        worker_args: tuple[str, ...] = (),
    ) -> None:
        self.net = ClusterNetwork(name)
        self.root = root
        self.python = python or sys.executable
        self.pool_bytes = pool_bytes
        self.gateway_env = dict(gateway_env or {})
        self.model_size = model_size
        self.worker_args = worker_args
        """More `sessiongate worker` options for both workers, e.g. `--prefetch-threshold 64`."""
        self.processes: dict[str, ManagedProcess] = {}
        self.master: MooncakeMaster | None = None
        self.storage: StorageNode | None = None
        self._pg_data: Path | None = None
        self._pg_ctl: str | None = None
        self.started_in_s = 0.0

    # addresses

    def gateway_url(self, role: str) -> str:
        return f"http://{self.net.address(role)}:{GATEWAY_PORT}"

    def worker_url(self, role: str) -> str:
        return f"http://{self.net.address(role)}:{WORKER_PORT}"

    def worker_id(self, role: str) -> str:
        """The gateway's id for the worker (`host:port` of its URL)."""
        return f"{self.net.address(role)}:{WORKER_PORT}"

    @property
    def database_url(self) -> str:
        return f"postgresql+asyncpg://postgres@{self.net.address('pg')}:{PG_PORT}/postgres"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.net.address('rd')}:{REDIS_PORT}/0"

    # parts

    def _spawn(self, key: str, role: str, argv: list[str], env: Mapping[str, str] | None = None) -> ManagedProcess:
        process = ManagedProcess(self.net.command(role, argv), log_path=self.root / f"{key}.log", env=env)
        self.processes[key] = process
        return process

    def _start_postgres(self) -> None:
        found = subprocess.run(["bash", str(POSTGRES_BINDIR_SCRIPT)], capture_output=True, text=True, timeout=30)
        if found.returncode != 0:
            raise ClusterError(f"no PostgreSQL server binaries: {found.stderr.strip()}")
        bindir = Path(found.stdout.strip())
        pg_root = self.root / "pg"
        pg_root.mkdir()
        shutil.chown(pg_root, "postgres")
        self._pg_data, self._pg_ctl = pg_root / "data", shlex.quote(str(bindir / "pg_ctl"))
        initdb = shlex.quote(str(bindir / "initdb"))
        self._as_postgres(f"{initdb} -D {self._pg_data} -A trust -U postgres --no-sync > {pg_root}/initdb.log 2>&1")
        # Trust from the cluster's subnet: initdb's pg_hba.conf admits loopback only.
        with (self._pg_data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.net.client.rsplit('.', 1)[0]}.0/24 trust\n")
        self.start_postgres()

    def _as_postgres(self, command: str, *, in_netns: bool = False) -> None:
        argv = ["su", "postgres", "-c", command]
        subprocess.run(self.net.command("pg", argv) if in_netns else argv, check=True, timeout=120)

    def start_postgres(self) -> None:
        """(Re)start PostgreSQL in its namespace, listening on its address only."""
        options = f"-p {PG_PORT} -k {self._pg_data} -c listen_addresses={self.net.address('pg')} -c fsync=off"
        # A partition leaves each gateway connection's backend waiting for a client that has given up (its FIN was
        # lost): 15-20 MB and a connection slot per partition, for hours, until the server probes the link.
        options += f" {POSTGRES_KEEPALIVES}"
        log = self._pg_data.parent / "postgres.log" if self._pg_data else "postgres.log"
        self._as_postgres(
            f"{self._pg_ctl} -D {self._pg_data} -o '{options}' -l {log} -w start > /dev/null", in_netns=True
        )

    def stop_postgres(self, mode: str = "fast") -> None:
        if self._pg_data is not None and (self._pg_data / "postmaster.pid").exists():
            self._as_postgres(f"{self._pg_ctl} -D {self._pg_data} -m {mode} -w stop > /dev/null")

    def _start_redis(self) -> None:
        argv = ["redis-server", "--bind", self.net.address("rd"), "--port", str(REDIS_PORT), "--save", ""]
        self._spawn("redis", "rd", [*argv, "--appendonly", "no", "--protected-mode", "no"])

    def _start_pool(self) -> None:
        in_netns = tuple(self.net.command("mc", []))
        address = self.net.address("mc")
        master_config = MasterConfig(
            host=address,
            rpc_port=MOONCAKE_PORTS[0],
            metadata_port=MOONCAKE_PORTS[1],
            admin_port=MOONCAKE_PORTS[2],
            log_file=self.root / "mooncake-master.log",
            python=self.python,
            launch_prefix=in_netns,
        )
        self.master = start_master(master_config)
        self.master.wait_ready()
        node_config = StorageNodeConfig(
            master=master_config,
            hostname=address,
            segment_bytes=self.pool_bytes,
            log_file=self.root / "mooncake-node.log",
            python=self.python,
            launch_prefix=in_netns,
        )
        self.storage = start_storage_node(node_config)

    def _start_worker(self, role: str) -> None:
        master = self.master
        assert master is not None
        address = self.net.address(role)
        argv = [self.python, "-m", "sessiongate.cli", "worker", "--host", address, "--port", str(WORKER_PORT)]
        argv += ["--state-dir", str(self.root / role), "--cpu-threads", "1", "--log-level", "warning"]
        argv += ["--model-size", self.model_size, *self.worker_args]
        argv += ["--storage-backend", "mooncake", "--mooncake-master", master.config.master_address]
        argv += ["--mooncake-metadata-server", master.config.metadata_server, "--mooncake-segment-bytes", "0"]
        argv += ["--mooncake-local-hostname", address, "--log-file", str(self.root / f"{role}-sglang.log")]
        self._spawn(role, role, argv)

    def gateway_settings(self, role: str) -> dict[str, str]:
        return {
            "SESSIONGATE_DATABASE_URL": self.database_url,
            "SESSIONGATE_REDIS_URL": self.redis_url,
            "SESSIONGATE_ALLOW_UNAUTHENTICATED": "true",
            "SESSIONGATE_CACHE_SALT_SECRET": f"netns-cluster-{self.net.name}",
            "SESSIONGATE_HEALTH_INTERVAL_S": "0.5",
            "SESSIONGATE_HEALTH_TIMEOUT_S": "1",
            "SESSIONGATE_LOG_LEVEL": "info",
            **self.gateway_env,
        }

    def start_gateway(self, role: str, *, wait: bool = True) -> ManagedProcess:
        """(Re)start the replica in `role`'s namespace; `wait`: until it answers `/healthz`."""
        argv = [self.python, "-m", "sessiongate.cli", "serve", "--host", self.net.address(role)]
        argv += ["--port", str(GATEWAY_PORT)]
        for worker in ("wk1", "wk2"):
            argv += ["--worker", self.worker_url(worker)]
        old = self.processes.get(role)
        if old is not None:
            old.stop()
        process = self._spawn(role, role, argv, env=self.gateway_settings(role))
        if wait:
            _wait_http(f"{self.gateway_url(role)}/healthz", process, 120)
        return process

    def start(self, timeout_s: float = 300.0) -> NetnsCluster:
        started = time.monotonic()
        self.net.up()
        try:
            self._start_redis()
            self._start_pool()
            for worker in ("wk1", "wk2"):
                self._start_worker(worker)  # the longest start (model, engine): under way while the rest starts
            self._start_postgres()
            assert self.master is not None
            assert self.storage is not None
            self.storage.wait_ready(self.master)
            self.start_gateway("gw1")  # migrates the empty database first; the second replica finds it done
            self.start_gateway("gw2")
            for worker in ("wk1", "wk2"):
                _wait_http(f"{self.worker_url(worker)}/health", self.processes[worker], timeout_s)
            for gateway in ("gw1", "gw2"):
                _wait_http(f"{self.gateway_url(gateway)}/readyz", self.processes[gateway], 60)
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        return self

    def wait_routable(self, gateway: str, workers: int, timeout_s: float = 30.0) -> None:
        """Until `gateway`'s /readyz says `workers` workers are routable."""
        deadline = time.monotonic() + timeout_s
        want = f"{workers} of 2 routable"
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.gateway_url(gateway)}/readyz", timeout=5).json()["checks"]["workers"] == want:
                    return
            time.sleep(0.2)
        raise ClusterError(f"{gateway}: not {want} after {timeout_s} s")

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            with contextlib.suppress(Exception):
                process.stop()
        for part in (self.storage, self.master):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        with contextlib.suppress(Exception):
            self.stop_postgres("immediate")
        self.net.down()  # ends whatever is left in the namespaces

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def link_cut(self, role: str) -> Iterator[None]:
        self.net.cut(role)
        try:
            yield
        finally:
            self.net.heal(role)

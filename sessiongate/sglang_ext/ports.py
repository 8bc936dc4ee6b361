"""TCP ports for workers started side by side: chosen and claimed before the worker starts, so no two meet.

An SGLang server listens on two TCP ports in the configurations sessiongate runs (one node, no data parallelism):
its HTTP `--port` and the torch.distributed store of its scheduler (`--nccl-port`; its other channels are IPC
files). Left to itself SGLang picks the store's port as "free right now"; a second worker starting beside a first
one once took the first one's HTTP port that way before the first had bound it, and the first then failed with
"address already in use". The launcher therefore passes both ports, and claims each for the worker's lifetime:

- a claim is a file `<port>` in a directory shared by every launcher in the same network namespace (created with
  O_EXCL, holding the claiming process's pid); a claim whose process is gone is stale and taken over. Ports belong
  to a network namespace, not to the machine: workers in two namespaces (two hosts' worth of network on one
  machine, `scripts/netns-cluster.sh`) may both use port 30000, so each namespace has its own directory;
- `claim(port)` refuses a port another live launcher holds or that something already listens on;
- `claim_free()` picks a free port nobody has claimed, from `pick_port()`.

`pick_port()` draws from below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), not from `bind(0)`:
a worker binds its HTTP port a minute after the port is chosen (model load, tokenizer), and in that minute every
outgoing connection and every `bind(0)` on the machine (the Mooncake client's, Gloo's, another test's) draws from
the ephemeral range and can take it. Below it, only a process that names the port gets it.

Errors: `PortTaken` (a `RuntimeError`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PortClaims", "PortTaken", "default_claims_dir", "pick_port", "port_is_bindable"]

_ATTEMPTS = 64
# Below Linux's default ephemeral range (32768-60999) and above the ports Mooncake's client draws from on its own
# (its RPC and transfer-engine ports: 12300-15100 by default).
_FIXED_RANGE = (20000, 32767)


class PortTaken(RuntimeError):
    """The port is claimed by another live launcher or something already listens on it."""


def default_claims_dir() -> Path:
    """`<tmp>/sessiongate-ports/netns-<inode>`: one directory per network namespace (its ports are its own)."""
    base = Path(tempfile.gettempdir()) / "sessiongate-ports"
    try:
        return base / f"netns-{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:  # no /proc: one directory for the machine
        return base


def port_is_bindable(host: str, port: int) -> bool:
    """Whether a listening socket could bind `host:port` now (SO_REUSEADDR, as uvicorn and torch bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, outside the kernel's ephemeral range where it can (see the module doc)."""
    low, high = _FIXED_RANGE[0], min(_FIXED_RANGE[1], _ephemeral_low() - 1)
    if high - low >= 1000:
        for _ in range(_ATTEMPTS):
            port = random.randint(low, high)
            if port_is_bindable(host, port):
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@dataclass
class PortClaims:
    """The claims this process holds, in `directory`; `release_all()` (or each `release`) gives them back."""

    directory: Path = field(default_factory=default_claims_dir)
    held: set[int] = field(default_factory=set)

    def _path(self, port: int) -> Path:
        return self.directory / str(port)

    def _take(self, port: int) -> bool:
        """Create the claim file; take over a stale one. False when a live process holds it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(port)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    owner = int(path.read_text().strip() or "0")
                except (OSError, ValueError):
                    owner = 0
                if owner and (owner == os.getpid() or _alive(owner)):
                    return False
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # stale: its launcher is gone
                continue
            with os.fdopen(fd, "w") as claim:
                claim.write(str(os.getpid()))
            self.held.add(port)
            return True
        return False

    def claim(self, host: str, port: int) -> int:
        """Claim `port` for a worker on `host`, or raise `PortTaken` saying who has it."""
        if port in self.held:
            raise PortTaken(f"port {port} is already claimed by a worker this process started")
        if not self._take(port):
            raise PortTaken(f"port {port} is claimed by another sessiongate launcher ({self._path(port)})")
        if not port_is_bindable(host, port):
            self.release(port)
            raise PortTaken(f"port {port} on {host} is already in use")
        return port

    def claim_free(self, host: str) -> int:
        """A port free on `host` now and claimed by nobody else, claimed for this process."""
        for _ in range(_ATTEMPTS):
            port = pick_port(host)
            try:
                return self.claim(host, port)
            except PortTaken:
                continue
        raise PortTaken(f"no free unclaimed port found on {host} after {_ATTEMPTS} tries")

    def release(self, port: int) -> None:
        if port in self.held:
            self.held.discard(port)
            try:
                self._path(port).unlink()
            except OSError as error:
                if error.errno != errno.ENOENT:
                    raise

    def release_all(self) -> None:
        for port in list(self.held):
            self.release(port)

"""The delay of an emulated pool link: a relay between two TUN devices that holds each packet for a fixed time.

`scripts/pool-link.sh` joins this side to a network namespace with a pair of TUN devices that this relay opens
(`sg-NAME-h` here, `sg-NAME-n` moved into the namespace) and forwards between: whatever one side's kernel sends
out of its device comes in on the other's `delay_ms` later, or is dropped with probability `loss_pct`. The rate is
not ours: a tbf qdisc on each device's egress lets packets out at the link's rate (kernel-side, as a NIC would).
Why a relay: the machines this runs on have a kernel built without netem (`CONFIG_NET_SCH_NETEM` is not set), the
qdisc a veth pair would use for the delay; tbf and TUN are there. Only the standard library, run as a file
(`python3 link_relay.py HOST_IF NS_IF DELAY_MS [LOSS_PCT]`, root): it is started before any virtual environment is
known. The devices exist while it runs (they are not persistent), so ending it takes the link down. Packets keep
their order; the relay adds the delay after the rate, as a link's propagation follows its serialisation.

`--tap` makes the two devices TAP (Ethernet frames) instead of TUN, so that one end can join a bridge
(`scripts/netns-cluster.sh` puts a node's link on its cluster's bridge this way). `--control FILE`: on SIGHUP the
relay reads `DELAY_MS LOSS_PCT` from FILE and applies them to the packets that arrive from then on (a fault
injected into a running link, and removed again, without cutting its connections).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import random
import selectors
import signal
import struct
import sys
import time

__all__ = ["open_tun", "relay"]

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_READ_SIZE = 1 << 16


def open_tun(name: str, *, tap: bool = False) -> int:
    """A non-blocking fd of the TUN (or TAP) device `name` (created here if absent, gone once every fd of it is
    closed)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), (_IFF_TAP if tap else _IFF_TUN) | _IFF_NO_PI))
    return fd


def _read_control(path: str) -> tuple[float, float] | None:
    """`DELAY_MS LOSS_PCT` from the control file, as (seconds, fraction); None when it is absent or malformed."""
    try:
        with open(path) as control:
            fields = control.read().split()
        return float(fields[0]) / 1000.0, float(fields[1]) / 100.0
    except (OSError, ValueError, IndexError):
        return None


def relay(left: int, right: int, delay_s: float, loss: float, control: str | None = None) -> None:
    """Forward packets between the two fds, each `delay_s` late, dropping a `loss` fraction; until SIGTERM.
    With `control`, SIGHUP rereads both from that file."""
    held: dict[int, collections.deque[tuple[float, bytes]]] = {left: collections.deque(), right: collections.deque()}
    peer = {left: right, right: left}
    # select(2), not epoll: epoll's timeout is whole milliseconds, which would add up to 1 ms to a sub-ms delay.
    selector = selectors.SelectSelector()
    selector.register(left, selectors.EVENT_READ)
    selector.register(right, selectors.EVENT_READ)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    def reshape(*_: object) -> None:
        nonlocal delay_s, loss
        shape = _read_control(control) if control else None
        if shape is not None:
            delay_s, loss = shape
            print(f"link_relay: now {delay_s * 1000:g} ms, {loss * 100:g}% loss", flush=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reshape)
    while not stopping:
        now = time.monotonic()
        for source, queue in held.items():
            while queue and queue[0][0] <= now:
                # The far device down or its queue full: the packet is lost, as on a wire.
                with contextlib.suppress(OSError):
                    os.write(peer[source], queue.popleft()[1])
        dues = [queue[0][0] for queue in held.values() if queue]
        timeout = max(0.0, min(dues) - now) if dues else 0.5
        try:
            ready = selector.select(timeout)
        except InterruptedError:  # a signal (SIGHUP) during the wait: Python retries, but be explicit
            continue
        for key, _ in ready:
            fd = key.fd
            arrived = time.monotonic()
            while True:
                try:
                    packet = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if loss and random.random() < loss:
                    continue
                held[fd].append((arrived + delay_s, packet))


def main(argv: list[str]) -> int:
    tap = "--tap" in argv
    argv = [arg for arg in argv if arg != "--tap"]
    control = None
    if "--control" in argv and argv.index("--control") + 1 < len(argv):
        at = argv.index("--control")
        control = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    if len(argv) not in (3, 4):
        print("usage: link_relay.py HOST_IF NS_IF DELAY_MS [LOSS_PCT] [--tap] [--control FILE]", file=sys.stderr)
        return 2
    os.setsid()  # its own session: the shell that started it may end, the link stays up
    left, right = open_tun(argv[0], tap=tap), open_tun(argv[1], tap=tap)
    print(f"link_relay: {argv[0]} <-> {argv[1]}, {argv[2]} ms", flush=True)
    loss = float(argv[3]) / 100.0 if len(argv) == 4 else 0.0
    relay(left, right, float(argv[2]) / 1000.0, loss, control)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

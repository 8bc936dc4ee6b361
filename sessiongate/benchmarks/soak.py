"""Soak: the network-namespace cluster under steady load for N minutes, one fault injected every minute.

The cluster is `benchmarks.netns_cluster` (two gateway replicas, two real SGLang CPU workers with the tiny model,
PostgreSQL, Redis, the Mooncake pool, each in its own namespace). `--sessions` clients each send greedy turns back to
back (half of them streamed) to one replica, with an `Idempotency-Key` per turn, and retry what was not answered as
a careful client does: the same key, on the other replica when theirs does not connect, after `Retry-After` on a
409 or 503. Every `--fault-every-s` one fault of `FAULTS` is injected in turn and removed `--hold-s` later.

It reports: answered turns against the store's rows (every answered turn is one `ok` row with its content: 0 lost,
0 doubled), memory (RSS of every process of each node) over time, and for each fault whether the replicas'
`/metrics` showed it (a worker out of routing, the shared state unavailable, 503s, a replica's counters reset);
`report.json`, `report.md` and `soak.png` under `--out` (default benchmarks/results/soak-<time>/).

    python -m sessiongate.benchmarks.soak --minutes 10
    python -m sessiongate.benchmarks.soak --minutes 3 --fault-every-s 30    # a short run

Needs what the cluster needs (root, iproute2, /dev/net/tun, redis-server, PostgreSQL's server binaries, Mooncake).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from sessiongate.sdk._sse import parse_events
from sessiongate.sessions import create_engine

from .netns_cluster import NODES, NetnsCluster, netns_unavailable

__all__ = ["FAULTS", "SoakConfig", "main", "run_soak"]

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 10.0
    fault_every_s: float = 60.0
    hold_s: float = 10.0
    sessions: int = 6
    max_tokens: int = 8
    sample_every_s: float = 2.0
    seed: int = 0


@dataclass
class Fault:
    name: str
    metric: str
    """What on the replicas' /metrics shows it."""
    start: Callable[[NetnsCluster], None]
    stop: Callable[[NetnsCluster], None]


def _restart(cluster: NetnsCluster, role: str) -> None:
    cluster.start_gateway(role)


FAULTS = (
    Fault(
        "worker wk1 link cut",
        "sessiongate_worker_healthy{wk1} = 0",
        lambda c: c.net.cut("wk1"),
        lambda c: c.net.heal("wk1"),
    ),
    Fault(
        "Redis link cut",
        "sessiongate_shared_state_available = 0",
        lambda c: c.net.cut("rd"),
        lambda c: c.net.heal("rd"),
    ),
    Fault(
        "PostgreSQL link cut",
        "sessiongate_http_requests{status=503} rises",
        lambda c: c.net.cut("pg"),
        lambda c: c.net.heal("pg"),
    ),
    Fault(
        "pool link 50 ms, 5% loss",
        "(none on the gateway: answers unchanged, prefetches slower)",
        lambda c: c.net.shape("mc", 50, 5),
        lambda c: c.net.shape("mc", 0, 0),
    ),
    Fault(
        "worker wk2 half-open (SIGSTOP)",
        "sessiongate_worker_healthy{wk2} = 0",
        lambda c: c.net.signal("wk2", signal.SIGSTOP),
        lambda c: c.net.signal("wk2", signal.SIGCONT),
    ),
    Fault(
        "gateway gw2 SIGKILLed, restarted",
        "gw2's counters reset (its scrape fails meanwhile)",
        lambda c: c.net.signal("gw2", signal.SIGKILL),
        lambda c: _restart(c, "gw2"),
    ),
)


@dataclass
class Run:
    started: float = field(default_factory=time.monotonic)
    answered: list[tuple[str, str]] = field(default_factory=list)
    """(session id, the user message) of every turn the client got an answer for."""
    given_up: int = 0
    retries: dict[str, int] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)


async def _turn(client: httpx.AsyncClient, urls: list[str], body: dict[str, Any], headers: dict[str, str]) -> bool:
    """One turn, retried (same key) until answered or 120 s; True when answered."""
    deadline = time.monotonic() + 120
    replica = 0
    while time.monotonic() < deadline:
        try:
            response = await client.post(f"{urls[replica]}/v1/chat/completions", json=body, headers=headers)
        except httpx.TransportError:
            replica = 1 - replica  # that replica does not answer: the other one
            await asyncio.sleep(0.5)
            continue
        if response.status_code in (409, 429, 503):
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
            continue
        if response.status_code != 200:
            await asyncio.sleep(1)
            continue
        if not body.get("stream"):
            return True
        events = list(parse_events(response.content))
        if any(e.done for e in events) and not any("error" in e.json() for e in events if not e.done):
            return True
        await asyncio.sleep(0.5)  # an error event: the key was released, the retry runs anew
    return False


async def _client(index: int, cluster: NetnsCluster, config: SoakConfig, run: Run, stop: asyncio.Event) -> None:
    rng = random.Random(config.seed * 7919 + index)
    mine = [cluster.gateway_url("gw1"), cluster.gateway_url("gw2")]
    urls = mine if index % 2 == 0 else mine[::-1]
    async with httpx.AsyncClient(timeout=60) as client:
        context = 0
        while not stop.is_set():
            session_id = f"soak-{index}-{context}"
            messages: list[dict[str, Any]] = []
            for turn in range(6):  # a short conversation, then a new session: prompts stay small
                if stop.is_set():
                    return
                content = f"client {index} context {context} turn {turn}: {rng.randrange(10**6)}"
                messages.append({"role": "user", "content": content})
                body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": config.max_tokens}
                body["stream"] = rng.random() < 0.5
                headers = {"x-session-id": session_id, "idempotency-key": f"{session_id}-{turn}"}
                if await _turn(client, urls, body, headers):
                    run.answered.append((session_id, content))
                    messages.append({"role": "assistant", "content": "..."})
                else:
                    run.given_up += 1
                    messages.pop()
            context += 1


def _metrics(text_: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text_.splitlines():
        if line and line[0] != "#":
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return round(total / 1024, 1)


async def _sampler(cluster: NetnsCluster, config: SoakConfig, run: Run, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=3) as client:
        while not stop.is_set():
            sample: dict[str, Any] = {"t": run.now(), "answered": len(run.answered), "rss_mb": {}, "metrics": {}}
            for role in NODES:
                sample["rss_mb"][role] = _rss_mb(cluster.net.pids(role))
            for role in ("gw1", "gw2"):
                try:
                    scraped = await client.get(f"{cluster.gateway_url(role)}/metrics")
                    sample["metrics"][role] = _metrics(scraped.text)
                except httpx.HTTPError:
                    sample["metrics"][role] = None
            run.samples.append(sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.sample_every_s)


async def _injector(cluster: NetnsCluster, config: SoakConfig, run: Run, stop: asyncio.Event) -> None:
    index = 0
    while True:
        with contextlib.suppress(TimeoutError):
            pause = config.fault_every_s / 2 if index == 0 else max(1.0, config.fault_every_s - config.hold_s)
            await asyncio.wait_for(stop.wait(), pause)
        if stop.is_set():
            return
        fault = FAULTS[index % len(FAULTS)]
        record = {"name": fault.name, "metric": fault.metric, "start": run.now()}
        await asyncio.to_thread(fault.start, cluster)
        await asyncio.sleep(config.hold_s)
        await asyncio.to_thread(fault.stop, cluster)
        record["end"] = run.now()
        run.faults.append(record)
        index += 1


def _worker_down(sample: dict[str, Any], worker_id: str) -> bool:
    return any(
        m is not None and m.get(f'sessiongate_worker_healthy{{worker="{worker_id}"}}') == 0
        for m in sample["metrics"].values()
    )


def _visible(fault: dict[str, Any], samples: list[dict[str, Any]], cluster: NetnsCluster) -> bool:
    """Whether a sample during the fault (or within 5 s after) shows it on a replica's /metrics."""
    window = [s for s in samples if fault["start"] <= s["t"] <= fault["end"] + 5]
    before = [s for s in samples if s["t"] < fault["start"]]
    name = fault["name"]
    if "wk1" in name or "wk2" in name:
        worker_id = cluster.worker_id("wk1" if "wk1" in name else "wk2")
        return any(_worker_down(s, worker_id) for s in window)
    if "Redis" in name:
        return any(
            m is not None and m.get("sessiongate_shared_state_available") == 0
            for s in window
            for m in s["metrics"].values()
        )
    if "PostgreSQL" in name:

        def refused(s: dict[str, Any]) -> float:
            return float(
                sum(
                    v
                    for m in s["metrics"].values()
                    if m is not None
                    for k, v in m.items()
                    if k.startswith("sessiongate_http_requests_total") and 'status="503"' in k
                )
            )

        return bool(window) and bool(before) and max(refused(s) for s in window) > refused(before[-1])
    if "gateway" in name:

        def served(s: dict[str, Any]) -> float | None:
            m = s["metrics"].get("gw2")
            if m is None:
                return None
            return float(sum(v for k, v in m.items() if k.startswith("sessiongate_http_requests_total")))

        seen = [served(s) for s in [*before[-1:], *window]]
        return None in seen or any(b is not None and a is not None and b < a for a, b in itertools.pairwise(seen))
    return False


async def _store_rows(database_url: str) -> list[tuple[str, str, str]]:
    engine = create_engine(database_url)
    try:
        async with engine.connect() as db:
            rows = (await db.execute(text("SELECT session_id, status, input_messages FROM turns"))).all()
    finally:
        await engine.dispose()
    out = []
    for session_id, status, messages in rows:
        if isinstance(messages, str):
            messages = json.loads(messages)
        last = messages[-1]["content"] if messages else ""
        out.append((str(session_id), str(status), str(last)))
    return out


async def _drive(cluster: NetnsCluster, config: SoakConfig) -> Run:
    run = Run()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_client(i, cluster, config, run, stop)) for i in range(config.sessions)]
    sampler = asyncio.create_task(_sampler(cluster, config, run, stop))
    injector = asyncio.create_task(_injector(cluster, config, run, stop))
    await asyncio.sleep(config.minutes * 60)
    stop.set()
    await injector  # a fault under way is removed before the end
    await asyncio.gather(*tasks)
    await sampler
    return run


def run_soak(config: SoakConfig, out: Path) -> dict[str, Any]:
    why = netns_unavailable()
    if why is not None:
        raise SystemExit(f"soak: no network-namespace cluster here: {why}")
    root = Path(tempfile.mkdtemp(prefix="sessiongate-soak-"))
    root.chmod(0o755)
    with NetnsCluster(f"soak{random.randrange(100)}", root) as cluster:
        started_in = cluster.started_in_s
        run = asyncio.run(_drive(cluster, config))
        rows = asyncio.run(_store_rows(cluster.database_url))
        visible = {f["name"] + f" @ {f['start']:.0f} s": _visible(f, run.samples, cluster) for f in run.faults}
    shutil.rmtree(root, ignore_errors=True)  # the cluster's logs and databases (kept if it failed: they say why)
    ok_rows: dict[tuple[str, str], int] = {}
    for session_id, status, content in rows:
        if status == "ok":
            ok_rows[(session_id, content)] = ok_rows.get((session_id, content), 0) + 1
    lost = [a for a in run.answered if ok_rows.get(a, 0) == 0]
    doubled = [key for key, n in ok_rows.items() if n > 1]
    statuses: dict[str, int] = {}
    for _, status, _ in rows:
        statuses[status] = statuses.get(status, 0) + 1
    report = {
        "config": asdict(config),
        "cluster_started_in_s": round(started_in, 1),
        "answered_turns": len(run.answered),
        "given_up_turns": run.given_up,
        "store_rows_by_status": statuses,
        "lost_accepted_turns": len(lost),
        "doubled_turns": len(doubled),
        "faults": run.faults,
        "faults_visible_in_metrics": visible,
        "rss_mb_first_last": {role: [run.samples[0]["rss_mb"][role], run.samples[-1]["rss_mb"][role]] for role in NODES}
        if run.samples
        else {},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**report, "samples": run.samples}, indent=1))
    (out / "report.md").write_text(_markdown(report))
    _plot(run, out / "soak.png")
    return report


def _markdown(report: dict[str, Any]) -> str:
    config = report["config"]
    lines = [
        f"# Soak: {config['minutes']:g} min, a fault every {config['fault_every_s']:g} s (held {config['hold_s']:g} s),"
        f" {config['sessions']} clients",
        "",
        f"- cluster started in {report['cluster_started_in_s']} s",
        f"- answered turns: {report['answered_turns']}; given up after 120 s of retries: {report['given_up_turns']}",
        f"- store rows by status: {report['store_rows_by_status']}",
        f"- **lost accepted turns: {report['lost_accepted_turns']}**; doubled: {report['doubled_turns']}",
        "",
        "| fault | start (s) | end (s) | shown on /metrics by | visible |",
        "|---|---|---|---|---|",
    ]
    for fault, (key, seen) in zip(report["faults"], report["faults_visible_in_metrics"].items(), strict=True):
        del key
        lines.append(f"| {fault['name']} | {fault['start']:.0f} | {fault['end']:.0f} | {fault['metric']} | {seen} |")
    lines += ["", "| node | RSS first (MB) | RSS last (MB) |", "|---|---|---|"]
    for role, (first, last) in report["rss_mb_first_last"].items():
        lines.append(f"| {role} | {first} | {last} |")
    return "\n".join(lines) + "\n"


def _plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run.samples:
        return
    times = [s["t"] for s in run.samples]
    figure, (memory, turns) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for role in NODES:
        memory.plot(times, [s["rss_mb"][role] for s in run.samples], label=role)
    memory.set_ylabel("RSS of the node's processes (MB)")
    memory.legend(ncol=4, fontsize=8)
    turns.plot(times, [s["answered"] for s in run.samples], color="black")
    turns.set_ylabel("answered turns (cumulative)")
    turns.set_xlabel("seconds")
    for fault in run.faults:
        for axis in (memory, turns):
            axis.axvspan(fault["start"], fault["end"], color="red", alpha=0.12)
        turns.text(fault["start"], 0, fault["name"], rotation=90, fontsize=7, va="bottom")
    figure.suptitle("sessiongate soak on a network-namespace cluster (red: a fault held)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sessiongate.benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fault-every-s", type=float, default=60.0)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    config = SoakConfig(
        minutes=args.minutes, fault_every_s=args.fault_every_s, hold_s=args.hold_s, sessions=args.sessions
    )
    out = args.out or RESULTS / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    report = run_soak(config, out)
    print(_markdown(report))
    print(f"written to {out}")


if __name__ == "__main__":
    main()

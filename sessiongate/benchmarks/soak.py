"""Soak: the network-namespace cluster under steady load for N minutes, one fault injected every minute.

The cluster is `benchmarks.netns_cluster` (two gateway replicas, two real SGLang CPU workers with the real SmolLM2
model unless `--model-size` says otherwise, PostgreSQL, Redis, the Mooncake pool, each in its own namespace).
`--sessions` clients each send greedy turns back to back (half of them streamed) to one replica, with an
`Idempotency-Key` per turn, and retry what was not answered as a careful client does: the same key, on the other
replica when theirs does not connect, after `Retry-After` on a 409 or 503. Every `--fault-every-s` one fault of
`FAULTS` is injected in turn and removed `--hold-s` later.

Spot checks, every `--spot-every-s`: a two-turn conversation with a long system prompt (several KV pages, so its
KV is written through to the pool and can be read back on either worker) goes through the replicas, and each answer
is compared with a recompute of the same messages sent straight to a worker under a cache salt of its own (nothing
cached can serve it). Greedy decoding: a page served wrong from any tier shows as other tokens.

It reports: answered turns against the store's rows (every answered turn is one `ok` row with its content: 0 lost,
0 doubled), the spot checks (wrong answers, and which tier served their cached prompt tokens), memory (the
proportional set size, PSS, of every process of each node: shared pages counted once, so PostgreSQL's shared
buffers are not counted once per backend) over time and its growth after the warm-up, and for each fault whether
the replicas' `/metrics` showed it (a worker out of routing, the shared state unavailable, 503s, a replica's
counters reset); `report.json`, `report.md` and `soak.png` under `--out` (default
benchmarks/results/soak-<time>/).

    python -m sessiongate.benchmarks.soak --minutes 10
    python -m sessiongate.benchmarks.soak --minutes 3 --fault-every-s 30 --model-size tiny   # a short run

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
from .soak_report import fault_visible, markdown, memory_growth, plot, spot_summary

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
    model_size: str = "smollm2"
    pool_mb: int = 128
    """The Mooncake storage node's segment: small enough that it fills during the warm-up, so the run shows the
    pool's steady state (full, evicting) rather than its filling."""
    spot_every_s: float = 30.0
    warmup_share: float = 0.3
    """Memory growth is judged from the sample at this share of the run (caches, pools and buffers filled) to the
    last."""
    flat_tolerance: float = 0.05
    """A node's memory is flat when it grew by at most this share of its size after the warm-up."""


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
        "sessiongate_store_oldest_call_seconds >= 1, or 503s or sessiongate_store_unavailable rise",
        lambda c: c.net.cut("pg"),
        lambda c: c.net.heal("pg"),
    ),
    Fault(
        "pool link 50 ms, 5% loss",
        "sessiongate_worker_pool_mean_call_seconds >= 3x before (and >= 50 ms)",
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
    spot_checks: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""
    """The served model name, as `/v1/models` says."""

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)


async def _turn(
    client: httpx.AsyncClient, urls: list[str], body: dict[str, Any], headers: dict[str, str]
) -> dict[str, Any] | None:
    """One turn, retried (same key) until answered or 120 s: the answer (a streamed one's is `{}`), or None."""
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
            answer: dict[str, Any] = response.json()
            return answer
        events = list(parse_events(response.content))
        if any(e.done for e in events) and not any("error" in e.json() for e in events if not e.done):
            return {}
        await asyncio.sleep(0.5)  # an error event: the key was released, the retry runs anew
    return None


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
                body = {"model": run.model, "messages": messages, "temperature": 0, "max_tokens": config.max_tokens}
                body["stream"] = rng.random() < 0.5
                headers = {"x-session-id": session_id, "idempotency-key": f"{session_id}-{turn}"}
                if await _turn(client, urls, body, headers) is not None:
                    run.answered.append((session_id, content))
                    messages.append({"role": "assistant", "content": "..."})
                else:
                    run.given_up += 1
                    messages.pop()
            context += 1


SPOT_QUESTIONS = (
    ("What is the capital of Italy?", "And what is the capital of France?"),
    ("Name a primary colour.", "Name another one."),
    ("How many days are in a week?", "And how many months are in a year?"),
    ("What do bees make?", "What do cows give?"),
)
SPOT_MAX_TOKENS = 16


def spot_system_prompt(check: int) -> str:
    """Several KV pages (64 tokens each) unique to one spot check, so its KV is its own and reaches the pool."""
    lines = (f"Fact {i}: ledger {check}-{i} lies in vault {i % 5}, shelf {i * 7 % 11}." for i in range(40))
    return "You are a helpful assistant. Answer in one short sentence.\n" + "\n".join(lines)


async def _recompute(client: httpx.AsyncClient, worker_urls: list[str], body: dict[str, Any]) -> str | None:
    """The answer to `body` computed from nothing cached: straight to a worker, under a cache salt no other
    request has (SGLang keys every cached page by the salt); None when no worker answered in 120 s."""
    salted = {**body, "cache_salt": f"soak-recompute-{random.randrange(1 << 62):x}"}
    deadline = time.monotonic() + 120
    attempt = 0
    while time.monotonic() < deadline:
        url = worker_urls[attempt % len(worker_urls)]
        attempt += 1
        with contextlib.suppress(httpx.HTTPError):
            response = await client.post(f"{url}/v1/chat/completions", json=salted)
            if response.status_code == 200:
                return str(response.json()["choices"][0]["message"].get("content") or "")
        await asyncio.sleep(1)
    return None


async def _spot_checker(cluster: NetnsCluster, config: SoakConfig, run: Run, stop: asyncio.Event) -> None:
    replicas = [cluster.gateway_url("gw1"), cluster.gateway_url("gw2")]
    workers = [cluster.worker_url("wk1"), cluster.worker_url("wk2")]
    async with httpx.AsyncClient(timeout=60) as client:
        for check in itertools.count():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.spot_every_s if check else config.spot_every_s / 3)
            if stop.is_set():
                return
            session_id = f"spot-{check}"
            messages: list[dict[str, Any]] = [{"role": "system", "content": spot_system_prompt(check)}]
            for turn, question in enumerate(SPOT_QUESTIONS[check % len(SPOT_QUESTIONS)]):
                messages.append({"role": "user", "content": question})
                body = {"model": run.model, "messages": messages, "temperature": 0, "max_tokens": SPOT_MAX_TOKENS}
                urls = replicas if (check + turn) % 2 == 0 else replicas[::-1]  # the second turn: the other replica
                headers = {"x-session-id": session_id, "idempotency-key": f"{session_id}-{turn}"}
                answer = await _turn(client, urls, body, headers)
                if answer is None:
                    run.spot_checks.append({"check": check, "turn": turn, "t": run.now(), "answered": False})
                    break
                content = str(answer["choices"][0]["message"].get("content") or "")
                reference = await _recompute(client, workers, body)
                details = ((answer.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens_details")
                run.spot_checks.append(
                    {
                        "check": check,
                        "turn": turn,
                        "t": run.now(),
                        "answered": True,
                        "worker": (answer.get("sessiongate") or {}).get("worker"),
                        "cached_tokens_details": details,
                        "answer": content,
                        "recomputed": reference,
                        "equal": None if reference is None else content == reference,
                    }
                )
                messages.append({"role": "assistant", "content": content})


def _metrics(text_: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text_.splitlines():
        if line and line[0] != "#":
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def _pss_mb(pids: list[int]) -> tuple[float, float]:
    """The node's memory: the processes' proportional set sizes summed (a page that n of them share counts 1/n
    in each, so PostgreSQL's shared buffers count once, not once per backend as summed RSS would), and the part
    of it in shared memory (`Pss_Shmem`: PostgreSQL's shared buffers, a fixed region that fills as the database
    is read, not an allocation that grows)."""
    pss = shmem = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Pss_Shmem:"):
                    shmem += int(line.split()[1])
    return round(pss / 1024, 1), round(shmem / 1024, 1)


async def _sampler(cluster: NetnsCluster, config: SoakConfig, run: Run, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=3) as client:
        while not stop.is_set():
            sample: dict[str, Any] = {"t": run.now(), "answered": len(run.answered), "metrics": {}}
            sample["pss_mb"], sample["shmem_mb"] = {}, {}
            for role in NODES:
                sample["pss_mb"][role], sample["shmem_mb"][role] = _pss_mb(cluster.net.pids(role))
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
    async with httpx.AsyncClient(timeout=10) as client:
        run.model = (await client.get(f"{cluster.gateway_url('gw1')}/v1/models")).json()["data"][0]["id"]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_client(i, cluster, config, run, stop)) for i in range(config.sessions)]
    tasks.append(asyncio.create_task(_spot_checker(cluster, config, run, stop)))
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
    with NetnsCluster(
        f"soak{random.randrange(100)}", root, model_size=config.model_size, pool_bytes=config.pool_mb << 20
    ) as cluster:
        started_in = cluster.started_in_s
        run = asyncio.run(_drive(cluster, config))
        rows = asyncio.run(_store_rows(cluster.database_url))
        visible = {f["name"] + f" @ {f['start']:.0f} s": fault_visible(f, run.samples, cluster) for f in run.faults}
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
        "spot_checks": {**spot_summary(run.spot_checks), "max_tokens": SPOT_MAX_TOKENS},
        "memory": memory_growth(run.samples, warmup_share=config.warmup_share, flat_tolerance=config.flat_tolerance),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**report, "samples": run.samples}, indent=1))
    (out / "report.md").write_text(markdown(report))
    plot(run.samples, run.faults, out / "soak.png")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sessiongate.benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fault-every-s", type=float, default=60.0)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--model-size", default="smollm2", choices=("tiny", "medium", "smollm2"))
    parser.add_argument("--spot-every-s", type=float, default=30.0)
    parser.add_argument("--pool-mb", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    config = SoakConfig(
        minutes=args.minutes,
        fault_every_s=args.fault_every_s,
        hold_s=args.hold_s,
        sessions=args.sessions,
        model_size=args.model_size,
        spot_every_s=args.spot_every_s,
        pool_mb=args.pool_mb,
    )
    out = args.out or RESULTS / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    report = run_soak(config, out)
    print(markdown(report))
    print(f"written to {out}")


if __name__ == "__main__":
    main()

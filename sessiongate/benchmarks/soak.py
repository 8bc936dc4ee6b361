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
                    if (k.startswith("sessiongate_http_requests_total") and 'status="503"' in k)
                    or k == "sessiongate_store_unavailable_total"
                )
            )

        stuck = any(
            m is not None and m.get("sessiongate_store_oldest_call_seconds", 0) >= 1
            for s in window
            for m in s["metrics"].values()
        )
        return stuck or (bool(window) and bool(before) and max(refused(s) for s in window) > refused(before[-1]))
    if "pool link" in name:
        # The mean time per pool call over the fault against the 30 s before it, from the workers' cumulative
        # counters: single slow calls (a big write on a busy machine) move a recent mean, not this.
        during = _pool_seconds_per_call(before[-1:] + window)
        usual = _pool_seconds_per_call([s for s in before if s["t"] >= fault["start"] - 30])
        return any(seconds >= max(0.05, 3 * usual.get(series, 0.0)) for series, seconds in during.items())
    if "gateway" in name:

        def served(s: dict[str, Any]) -> float | None:
            m = s["metrics"].get("gw2")
            if m is None:
                return None
            return float(sum(v for k, v in m.items() if k.startswith("sessiongate_http_requests_total")))

        seen = [served(s) for s in [*before[-1:], *window]]
        return None in seen or any(b is not None and a is not None and b < a for a, b in itertools.pairwise(seen))
    return False


def _pool_seconds_per_call(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Per worker and kind of call (read, write, lookup): the seconds per pool call made between the first and the
    last of `samples`, from the workers' cumulative counters as a replica's /metrics shows them."""

    def counters(sample: dict[str, Any]) -> dict[str, float]:
        scraped: dict[str, float] = next((m for m in sample["metrics"].values() if m), {})
        return {k: v for k, v in scraped.items() if k.startswith("sessiongate_worker_pool_")}

    if len(samples) < 2:
        return {}
    first, last = counters(samples[0]), counters(samples[-1])
    out = {}
    for key, calls in last.items():
        if not key.startswith("sessiongate_worker_pool_calls_total{"):
            continue
        seconds_key = key.replace("_calls_total{", "_call_seconds_total{", 1)
        made = calls - first.get(key, 0.0)
        if made > 0 and seconds_key in last:
            series = key.split("{", 1)[1]
            out[series] = (last[seconds_key] - first.get(seconds_key, 0.0)) / made
    return out


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
        "spot_checks": _spot_summary(run.spot_checks),
        "memory": _memory_growth(run.samples, config),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({**report, "samples": run.samples}, indent=1))
    (out / "report.md").write_text(_markdown(report))
    _plot(run, out / "soak.png")
    return report


def _spot_summary(checks: list[dict[str, Any]]) -> dict[str, Any]:
    compared = [c for c in checks if c.get("equal") is not None]
    tiers: dict[str, int] = {}
    for check in compared:
        for tier, tokens in (check.get("cached_tokens_details") or {}).items():
            if isinstance(tokens, int) and tokens > 0:
                tiers[tier] = tiers.get(tier, 0) + 1
    return {
        "turns": len(checks),
        "compared": len(compared),
        "wrong": sum(1 for c in compared if not c["equal"]),
        "unanswered": sum(1 for c in checks if not c["answered"]),
        "turns_with_cached_tokens_from": tiers,
    }


def _own_mb(sample: dict[str, Any], role: str) -> float:
    """A node's memory less its shared memory: what its processes allocated for themselves."""
    return float(sample["pss_mb"][role] - sample.get("shmem_mb", {}).get(role, 0.0))


def _memory_growth(samples: list[dict[str, Any]], config: SoakConfig) -> dict[str, dict[str, Any]]:
    """Per node: PSS first, after the warm-up and last (MB), its shared memory at the end, and the growth of its
    own memory (PSS less shared memory) after the warm-up, that growth's least-squares slope (MB per minute) and
    whether it is flat (`config.flat_tolerance`)."""
    if not samples:
        return {}
    end = samples[-1]["t"]
    after = [s for s in samples if s["t"] >= config.warmup_share * end] or samples[-1:]
    out = {}
    for role in NODES:
        warm, last = _own_mb(after[0], role), _own_mb(samples[-1], role)
        times = [s["t"] / 60 for s in after]
        values = [_own_mb(s, role) for s in after]
        mean_t, mean_v = sum(times) / len(times), sum(values) / len(values)
        spread = sum((t - mean_t) ** 2 for t in times)
        slope = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread if spread else 0.0
        out[role] = {
            "first_mb": samples[0]["pss_mb"][role],
            "warm_mb": after[0]["pss_mb"][role],
            "last_mb": samples[-1]["pss_mb"][role],
            "shmem_last_mb": samples[-1].get("shmem_mb", {}).get(role, 0.0),
            "own_warm_mb": round(warm, 1),
            "growth_after_warmup_mb": round(last - warm, 1),
            "slope_mb_per_min": round(slope, 2),
            "flat": last - warm <= config.flat_tolerance * warm,
        }
    return out


def _markdown(report: dict[str, Any]) -> str:
    config = report["config"]
    spot = report["spot_checks"]
    lines = [
        f"# Soak: {config['minutes']:g} min, a fault every {config['fault_every_s']:g} s (held {config['hold_s']:g} s),"
        f" {config['sessions']} clients",
        "",
        f"- cluster started in {report['cluster_started_in_s']} s",
        f"- answered turns: {report['answered_turns']}; given up after 120 s of retries: {report['given_up_turns']}",
        f"- store rows by status: {report['store_rows_by_status']}",
        f"- **lost accepted turns: {report['lost_accepted_turns']}**; doubled: {report['doubled_turns']}",
        f"- model: {config['model_size']}; spot checks (answers against a recompute, greedy, {SPOT_MAX_TOKENS} tokens):"
        f" {spot['compared']} turns compared, **{spot['wrong']} wrong**, {spot['unanswered']} unanswered; turns whose"
        f" prompt was partly served from a cache, by tier: {spot['turns_with_cached_tokens_from']}",
        "",
        "| fault | start (s) | end (s) | shown on /metrics by | visible |",
        "|---|---|---|---|---|",
    ]
    for fault, (key, seen) in zip(report["faults"], report["faults_visible_in_metrics"].items(), strict=True):
        del key
        lines.append(f"| {fault['name']} | {fault['start']:.0f} | {fault['end']:.0f} | {fault['metric']} | {seen} |")
    share = f"{config['warmup_share']:.0%}"
    tolerance = f"{config['flat_tolerance']:.0%}"
    lines += [
        "",
        f"Memory: PSS of each node's processes (MB), first, at warm = the first sample after {share} of the run, and"
        " last; shared memory at the end (PostgreSQL's shared buffers); own = PSS less shared memory; flat = own"
        f" memory grew by at most {tolerance} of its warm value after the warm-up.",
        "",
        "| node | PSS first | PSS warm | PSS last | shared last | own growth after warm-up | own slope MB/min | flat |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for role, m in report["memory"].items():
        lines.append(
            f"| {role} | {m['first_mb']} | {m['warm_mb']} | {m['last_mb']} | {m['shmem_last_mb']} |"
            f" {m['growth_after_warmup_mb']:+} | {m['slope_mb_per_min']:+} | {m['flat']} |"
        )
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
        memory.plot(times, [s["pss_mb"][role] for s in run.samples], label=role)
    memory.set_ylabel("PSS of the node's processes (MB)")
    memory.set_yscale("log")
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
    print(_markdown(report))
    print(f"written to {out}")


if __name__ == "__main__":
    main()

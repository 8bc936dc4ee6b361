"""Load and soak test: many concurrent sessions through a real gateway process in front of fast fake workers.

Starts `--workers` fake SGLang workers (`python -m sessiongate.benchmarks.fake_worker`, instant: no prefix-cache
model unless `--worker-prefix-cache`) and one gateway (`sessiongate serve`: uvicorn, uvloop, httptools) on a fresh
SQLite store (or `--database-url`), then runs `--sessions` concurrent sessions for `--duration` seconds, each sending
turns back to back (a share of them streamed), resending its conversation as a client of an OpenAI-compatible API
does. It reports throughput, latency (p50/p99) and the latency the gateway adds (against the same requests sent
straight to a worker), errors, the turns the store recorded against the turns answered, and the gateway's RSS over
time. The client is aiohttp, reading each answer whole, as `router_overhead`'s: it costs less per request than
httpx's default transport, so more of the machine is left to what is measured.

Two workloads, both closed loops (a session sends its next turn when its answer has come and its think time passed):
`synthetic` (the default) sends twelve-word questions back to back; `sharegpt` plays ShareGPT conversations
(`workloads.sharegpt_sessions`: the trace's user message lengths, answers cut to `--max-tokens`, an exponential
think time of mean `--think-time` between turns, as the trace replay draws them; a conversation that ends starts
again, in the same session, after a think time), the first turns spread over one mean think time. A turn the gateway's
admission refuses (`gateway/turn/admission.py`: 429 `fair_share_exceeded` or 503 `gateway_saturated`, with
`Retry-After`) is counted as shed, not as an error: the session waits as asked and sends it again. Any other error
status is an error. Reported as well: how fast shed turns were answered, the added latency's p99 / p50, each
session's share of the tokens and turns served against the fair share (`load_figures.fairness`; meaningful without
think time, when every session wants service all the time), the RSS per 1,000 sessions and its growth after the
warm-up (`--warmup`), and the client's own event-loop lag (what of the latencies it measures is its own).

    python -m sessiongate.benchmarks.load_test --sessions 1000 --duration 60
    python -m sessiongate.benchmarks.load_test --sessions 10000 --duration 120 --workload sharegpt --think-time 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sdk._retries import parse_retry_after
from sessiongate.sdk._sse import parse_events
from sessiongate.sessions import create_engine

from .load_figures import fairness, percentiles, queue_waits, rss_figures
from .load_report import LoadReport
from .processes import FakeWorkerProcess, GatewayServer
from .shed_probe import record_loop_lag
from .workloads import SessionTrace, sharegpt_sessions

__all__ = ["LoadConfig", "LoadReport", "run_load"]

ADMISSION_MAX_WAIT_S: float = GatewaySettings.model_fields["admission_max_wait_s"].default


@dataclass(frozen=True, slots=True)
class LoadConfig:
    sessions: int = 1000
    duration_s: float = 60.0
    workers: int = 2
    stream_share: float = 0.5
    max_tokens: int = 16
    database_url: str | None = None
    baseline_requests: int = 300
    seed: int = 0
    # The fake workers' prefix-cache model: its lookup cost grows with every prompt seen. With 1,000 sessions
    # resending long histories, at ~120 turns/s the two workers took ~80% of a core each, the gateway 25%, the
    # client 9% (top, on 2 cores): the test measured the workers. Off by default, as in `router_overhead`.
    worker_prefix_cache: bool = False
    # Run the gateway from this source tree (its PYTHONPATH) instead of the installed one: two trees under the
    # same client, e.g. a `git archive` export of an older commit.
    gateway_source: str | None = None
    # "synthetic" (twelve-word questions) or "sharegpt" (the trace's conversations); think time between turns
    # (exponential, this mean; 0: back to back); the RSS after this many seconds is the warmed-up figure (None: a
    # quarter of the duration).
    workload: str = "synthetic"
    think_time_s: float = 0.0
    warmup_s: float | None = None
    # More SESSIONGATE_* settings for the gateway (e.g. the admission's).
    gateway_env: tuple[tuple[str, str], ...] = ()
    # The first `heavy_sessions` sessions each keep `heavy_concurrency` turns in flight at once (as many loops on one
    # session id): a flood from a few sessions, against which the others' shares are read.
    heavy_sessions: int = 0
    heavy_concurrency: int = 1
    # New sessions' first turns a second from a process of their own, from the steady part on (`shed_probe`): how
    # fast refusals reach a client that is not itself late. 0: none.
    shed_probe_rate: float = 0.0


# The admission's refusals (gateway/turn/admission.py); any other error status (a 503 `store_unavailable`, say)
# is an error.
_SHED_CODES = frozenset({"gateway_saturated", "fair_share_exceeded"})


def _error_code(payload: bytes) -> str:
    try:
        error = orjson.loads(payload).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return str(error.get("code") or "") if isinstance(error, dict) else ""


class _Shed(Exception):
    def __init__(self, status: int, retry_after_s: float) -> None:
        super().__init__(f"status_{status}")
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass
class _Tally:
    """What the sessions record as they go; times are seconds from the run's start (`started`)."""

    sessions: int
    started: float
    # Each refusal: (sent at, latency ms).
    sheds: list[tuple[float, float]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    details: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    # Each turn answered: (sent at, latency ms, session index, tokens served).
    answered: list[tuple[float, float, int, int]] = field(default_factory=list)
    first_answer_at: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.first_answer_at = [None] * self.sessions

    def steady_from(self, warmup_s: float) -> float:
        """When the run is steady: after the warm-up, and once 99% of the sessions have had their first answer (a
        session's first turn opens its connection: 1,000 at once wait on the gateway's accepts)."""
        firsts = sorted(at for at in self.first_answer_at if at is not None)
        return max(warmup_s, firsts[int(0.99 * (len(firsts) - 1))] if firsts else 0.0)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _turn(
    client: aiohttp.ClientSession,
    url: str,
    messages: list[dict[str, Any]],
    *,
    stream: bool,
    max_tokens: int,
    headers: dict[str, str],
) -> tuple[str, int]:
    """One chat request; the assistant's text and the tokens served (usage.total_tokens). Raises `_Shed` when the
    admission refused it, RuntimeError on any other error status or error event."""
    request: dict[str, Any] = {"model": "fake-model", "messages": messages, "stream": stream, "max_tokens": max_tokens}
    if stream:
        request["stream_options"] = {"include_usage": True}
    body = orjson.dumps(request)
    async with client.post(url, data=body, headers={**headers, "content-type": "application/json"}) as response:
        payload = await response.read()
        if response.status != 200:
            code = _error_code(payload)
            retry_after = parse_retry_after(response.headers)
            if code in _SHED_CODES and retry_after is not None:
                raise _Shed(response.status, retry_after)
            raise RuntimeError(f"status_{response.status}" + (f"_{code}" if code else ""))
    if not stream:
        answer = orjson.loads(payload)
        usage = answer.get("usage") or {}
        return str(answer["choices"][0]["message"]["content"] or ""), int(usage.get("total_tokens") or 0)
    parts: list[str] = []
    tokens = 0
    done = False
    for event in parse_events(payload):
        if event.done:
            done = True
            continue
        chunk = event.json()
        if "error" in chunk:
            raise RuntimeError("error_event")
        if chunk.get("usage"):
            tokens = int(chunk["usage"].get("total_tokens") or 0)
        for choice in chunk.get("choices") or ():
            parts.append(choice.get("delta", {}).get("content") or "")
    if not done:
        raise RuntimeError("stream_cut")
    return "".join(parts), tokens


@dataclass(frozen=True, slots=True)
class _Step:
    words: int  # the user's message
    max_tokens: int
    think_s: float  # before it is sent


def _steps(config: LoadConfig, plan: SessionTrace | None, rng: random.Random) -> list[_Step]:
    """One conversation's turns: the trace's (user message lengths, answers cut to max_tokens, think times), or
    twenty synthetic twelve-word questions (the context then starts over, as the test always did)."""
    if plan is None:
        think = config.think_time_s
        return [_Step(12, config.max_tokens, rng.expovariate(1 / think) if think else 0.0) for _ in range(20)]
    return [
        _Step(min(max(turn.append_tokens, 1), 512), min(turn.output_tokens, config.max_tokens), turn.gap_s)
        for turn in plan.turns
    ]


async def _session(
    index: int,
    client: aiohttp.ClientSession,
    url: str,
    config: LoadConfig,
    deadline: float,
    tally: _Tally,
    plan: SessionTrace | None,
    lane: int = 0,
) -> None:
    rng = random.Random((config.seed * 1_000_003 + index) * 101 + lane)
    # Spread the first requests: over half a second, or one mean think time.
    await asyncio.sleep(rng.random() * max(0.5, config.think_time_s))
    session_id = f"load-{config.seed}-{index}"
    first = True
    while time.monotonic() < deadline:
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are session {index}."}]
        for k, step in enumerate(_steps(config, plan, rng)):
            if first:
                think = 0.0
            elif k or plan is None:
                think = step.think_s
            else:  # a conversation that starts over waits a think time too (the trace's first turn has none)
                think = rng.expovariate(1 / config.think_time_s) if config.think_time_s else 0.0
            first = False
            if think > 0:  # not past the deadline: the run ends on time
                await asyncio.sleep(min(think, max(deadline - time.monotonic(), 0.0)))
            if time.monotonic() >= deadline:
                return
            messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(step.words))})
            if not await _one_turn(index, client, url, messages, step, session_id, rng, config, deadline, tally):
                messages.pop()


async def _one_turn(
    index: int,
    client: aiohttp.ClientSession,
    url: str,
    messages: list[dict[str, Any]],
    step: _Step,
    session_id: str,
    rng: random.Random,
    config: LoadConfig,
    deadline: float,
    tally: _Tally,
) -> bool:
    """Send the turn until it is answered (a shed turn again after its Retry-After); whether it was."""
    stream = rng.random() < config.stream_share
    while True:
        started = time.perf_counter()
        tally.counts["sent"] += 1
        try:
            text, tokens = await _turn(
                client, url, messages, stream=stream, max_tokens=step.max_tokens, headers={"x-session-id": session_id}
            )
        except _Shed as shed:
            tally.sheds.append((started - tally.started, (time.perf_counter() - started) * 1000))
            tally.counts[f"shed_{shed.status}"] += 1
            await asyncio.sleep(min(shed.retry_after_s, max(deadline - time.monotonic(), 0.0)))
            if time.monotonic() >= deadline:
                return False
            continue
        except (TimeoutError, RuntimeError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            tally.errors[str(exc) if isinstance(exc, RuntimeError) else type(exc).__name__] += 1
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                tally.details[f"{type(exc).__name__}: {exc}"] += 1
            await asyncio.sleep(0.1)
            return False
        ended = time.perf_counter()
        tally.answered.append((started - tally.started, (ended - started) * 1000, index, tokens))
        if tally.first_answer_at[index] is None:
            tally.first_answer_at[index] = ended - tally.started
        tally.counts["ok"] += 1
        messages.append({"role": "assistant", "content": text})
        return True


WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
]


async def _direct_baseline(worker_url: str, config: LoadConfig) -> list[float]:
    """The same kind of requests straight to a worker, at a modest concurrency: what the gateway adds to."""
    latencies: list[float] = []
    rng = random.Random(config.seed)
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def one(i: int) -> None:
            messages = [{"role": "system", "content": f"You are session {i}."}]
            messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(12))})
            started = time.perf_counter()
            await _turn(
                client,
                f"{worker_url}/v1/chat/completions",
                messages,
                stream=rng.random() < config.stream_share,
                max_tokens=config.max_tokens,
                headers={},
            )
            latencies.append((time.perf_counter() - started) * 1000)

        for start in range(0, config.baseline_requests, 32):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 32, config.baseline_requests))))
    return latencies


# Each answered turn's wait from the gateway's handler to the worker (the admission's queue, the store's begin_turn,
# routing), as the store recorded it; SQLite's date arithmetic (the default store).
_DISPATCH_WAITS = text(
    "SELECT (julianday(dispatched_at) - julianday(received_at)) * 86400000.0 FROM turns"
    " WHERE status = 'ok' AND dispatched_at IS NOT NULL"
)


async def _queue_waits(client: aiohttp.ClientSession, gateway_url: str, *, after_s: float) -> dict[float, float]:
    """The gateway's queue-wait histogram ({upper bound: turns, cumulative}) read from `/metrics` after `after_s`."""
    await asyncio.sleep(after_s)
    async with client.get(f"{gateway_url}/metrics") as response:
        exposition = await response.text()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name == "sessiongate_admission_wait_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }


def _start_probe(gateway_url: str, config: LoadConfig, *, start_after_s: float) -> tuple[subprocess.Popen[bytes], Path]:
    """The shed probe in its own process, over the steady part (it stops two seconds before the run, so that a turn
    it had admitted is answered before the gateway stops)."""
    out = Path(tempfile.mkdtemp(prefix="sessiongate-probe-")) / "probe.json"
    command = [sys.executable, "-m", "sessiongate.benchmarks.shed_probe", "--url", gateway_url]
    command += ["--rate", str(config.shed_probe_rate), "--start-after", str(start_after_s)]
    command += ["--duration", str(max(config.duration_s - start_after_s - 2.0, 1.0)), "--out", str(out)]
    return subprocess.Popen(command), out


def _probe_figures(process: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return {"error": "the probe did not finish"}
    if process.returncode or not out.exists():
        return {"error": f"the probe exited with {process.returncode}"}
    figures: dict[str, Any] = orjson.loads(out.read_bytes())
    return figures


async def _count_rows(database_url: str, report: LoadReport) -> None:
    """Turns by status and sessions, as the store holds them after the run (SQLite or PostgreSQL), and on SQLite the
    waits from the handler to the worker."""
    engine = create_engine(database_url)
    try:
        async with engine.connect() as db:
            rows = (await db.execute(text("SELECT status, count(*) FROM turns GROUP BY status"))).all()
            sessions = (await db.execute(text("SELECT count(*) FROM sessions"))).scalar_one()
            if database_url.startswith("sqlite"):
                waits = (await db.execute(_DISPATCH_WAITS)).scalars().all()
                report.store_dispatch_wait_ms = percentiles([float(w) for w in waits])
    finally:
        await engine.dispose()
    report.rows = {**{f"turns_{status}": int(n) for status, n in rows}, "sessions": int(sessions)}


async def _drive(gateway: GatewayServer, config: LoadConfig, report: LoadReport) -> None:
    tally = _Tally(config.sessions, time.perf_counter())
    plans: list[SessionTrace | None] = (
        list(sharegpt_sessions(count=config.sessions, seed=config.seed, think_time_s=config.think_time_s))
        if config.workload == "sharegpt"
        else [None] * config.sessions
    )
    url = f"{gateway.url}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=config.sessions + 10)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        started = time.monotonic()
        deadline = started + config.duration_s

        async def sample_rss() -> None:
            while time.monotonic() < deadline:
                report.rss_mb.append((round(time.monotonic() - started, 1), round(_rss_mb(gateway.pid), 1)))
                await asyncio.sleep(1.0)

        lags: list[float] = []
        warmup = config.warmup_s if config.warmup_s is not None else config.duration_s / 4
        probe = _start_probe(gateway.url, config, start_after_s=warmup) if config.shed_probe_rate else None
        waits_before: asyncio.Task[dict[float, float]] = asyncio.create_task(
            _queue_waits(client, gateway.url, after_s=warmup)
        )
        tally.started = time.perf_counter()
        sampler = asyncio.create_task(sample_rss())
        prober = asyncio.create_task(record_loop_lag(deadline, lags))
        await asyncio.gather(
            *(_session(i, client, url, config, deadline, tally, plans[i]) for i in range(config.sessions)),
            *(
                _session(i, client, url, config, deadline, tally, plans[i], lane)
                for i in range(min(config.heavy_sessions, config.sessions))
                for lane in range(1, config.heavy_concurrency)
            ),
        )
        elapsed = time.monotonic() - started
        sampler.cancel()
        prober.cancel()
        if probe is not None:
            report.shed_probe = _probe_figures(*probe)
        if waits_before.done() and not waits_before.exception():
            bound = float(dict(config.gateway_env).get("SESSIONGATE_ADMISSION_MAX_WAIT_S", ADMISSION_MAX_WAIT_S))
            after = await _queue_waits(client, gateway.url, after_s=0.0)
            report.queue_wait = queue_waits(waits_before.result(), after, bound)
        waits_before.cancel()
    report.rss_mb.append((round(elapsed, 1), round(_rss_mb(gateway.pid), 1)))
    counts = tally.counts
    report.turns_sent, report.turns_ok = counts["sent"], counts["ok"]
    report.errors = dict(tally.errors)
    report.error_details = dict(tally.details)
    report.shed = {key: n for key, n in counts.items() if key.startswith("shed_")}
    report.shed_latency_ms = percentiles([latency for _, latency in tally.sheds])
    report.throughput_turns_per_s = counts["ok"] / elapsed
    report.latency_ms = percentiles([latency for _, latency, _, _ in tally.answered])
    report.client_lag_ms = percentiles(lags)
    steady_from = tally.steady_from(warmup)
    steady = [turn for turn in tally.answered if turn[0] >= steady_from]
    report.steady_from_s = steady_from
    report.steady_throughput_turns_per_s = len(steady) / max(elapsed - steady_from, 1e-9)
    report.steady_latency_ms = percentiles([latency for _, latency, _, _ in steady])
    report.steady_shed_latency_ms = percentiles([latency for sent, latency in tally.sheds if sent >= steady_from])
    tokens, turns = [0] * config.sessions, [0] * config.sessions
    for _, _, index, served in steady:
        tokens[index] += served
        turns[index] += 1
    heavy = min(config.heavy_sessions, config.sessions)
    # The shares of the sessions served all through the steady part (the 1% whose first answer came later joined late).
    present = [i for i in range(heavy, config.sessions) if (tally.first_answer_at[i] or math.inf) <= steady_from]
    report.fairness_sessions = len(present)
    report.fairness_tokens = fairness([tokens[i] for i in present])
    report.fairness_turns = fairness([turns[i] for i in present])
    if heavy and report.fairness_tokens.get("fair_share"):
        report.heavy_share_of_fair = sum(tokens[:heavy]) / heavy / report.fairness_tokens["fair_share"]
    report.rss = rss_figures(report.rss_mb, sessions=config.sessions, warmup_s=warmup)


def run_load(config: LoadConfig, *, work_dir: Path | None = None) -> LoadReport:
    """Start the stack, run the load, stop everything (by pid), and return the report."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="sessiongate-load-"))
    database_url = config.database_url or f"sqlite+aiosqlite:///{work / 'gateway.db'}"
    report = LoadReport(config=asdict(config))
    workers = [FakeWorkerProcess(work, prefix_cache=config.worker_prefix_cache) for _ in range(config.workers)]
    gateway: GatewayServer | None = None
    try:
        for worker in workers:
            worker.wait_ready()
        env = {
            "SESSIONGATE_DATABASE_URL": database_url,
            "SESSIONGATE_ALLOW_UNAUTHENTICATED": "true",
            "SESSIONGATE_LOG_LEVEL": "warning",
            **dict(config.gateway_env),
        }
        source = Path(config.gateway_source).resolve() if config.gateway_source is not None else None
        if source is not None:
            env["PYTHONPATH"] = str(source)
        # Run in the source tree: `python -m` would otherwise put this process's directory ahead of PYTHONPATH.
        gateway = GatewayServer(work, workers=[w.url for w in workers], env=env, cwd=source)
        gateway.wait_ready()
        report.direct_latency_ms = percentiles(asyncio.run(_direct_baseline(workers[0].url, config)))
        asyncio.run(_drive(gateway, config, report))
        for key in ("p50", "p99"):
            if key in report.latency_ms and key in report.direct_latency_ms:
                report.added_latency_ms[key] = report.latency_ms[key] - report.direct_latency_ms[key]
            if key in report.steady_latency_ms and key in report.direct_latency_ms:
                report.steady_added_latency_ms[key] = report.steady_latency_ms[key] - report.direct_latency_ms[key]
        if report.added_latency_ms.get("p50", 0) > 0:
            report.added_p99_over_p50 = report.added_latency_ms["p99"] / report.added_latency_ms["p50"]
        if report.steady_added_latency_ms.get("p50", 0) > 0:
            steady = report.steady_added_latency_ms
            report.steady_added_p99_over_p50 = steady["p99"] / steady["p50"]
    finally:
        if gateway is not None:
            gateway.stop()
        for worker in workers:
            worker.stop()
    asyncio.run(_count_rows(database_url, report))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--database-url", help="default: a fresh SQLite file in a temp dir")
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument(
        "--worker-prefix-cache", action="store_true", help="turn on the fake workers' prefix-cache model (costly)"
    )
    parser.add_argument(
        "--gateway-source", help="run the gateway from this source tree (e.g. an export of another commit)"
    )
    parser.add_argument("--workload", choices=("synthetic", "sharegpt"), default="synthetic")
    parser.add_argument(
        "--think-time", type=float, default=None, help="mean think time, s (default: 0, or 20 with --workload sharegpt)"
    )
    parser.add_argument(
        "--warmup", type=float, help="s; the RSS after it is the warmed-up figure (default: duration/4)"
    )
    parser.add_argument(
        "--gateway-setting", action="append", default=[], metavar="NAME=VALUE", help="a SESSIONGATE_* setting"
    )
    parser.add_argument("--heavy-sessions", type=int, default=0, help="sessions that keep several turns in flight")
    parser.add_argument("--heavy-concurrency", type=int, default=1, help="turns in flight per heavy session")
    parser.add_argument(
        "--shed-probe", type=float, default=0.0, metavar="RATE", help="new sessions' turns a second from a quiet client"
    )
    args = parser.parse_args()
    think = args.think_time if args.think_time is not None else (20.0 if args.workload == "sharegpt" else 0.0)
    config = LoadConfig(
        sessions=args.sessions,
        duration_s=args.duration,
        workers=args.workers,
        stream_share=args.stream_share,
        max_tokens=args.max_tokens,
        database_url=args.database_url,
        gateway_source=args.gateway_source,
        worker_prefix_cache=args.worker_prefix_cache,
        workload=args.workload,
        think_time_s=think,
        warmup_s=args.warmup,
        gateway_env=tuple((name, value) for name, _, value in (s.partition("=") for s in args.gateway_setting)),
        heavy_sessions=args.heavy_sessions,
        heavy_concurrency=args.heavy_concurrency,
        shed_probe_rate=args.shed_probe,
    )
    report = run_load(config)
    print(report.summary())
    if args.out:
        Path(args.out).write_text(json.dumps(asdict(report), indent=2))


if __name__ == "__main__":
    main()

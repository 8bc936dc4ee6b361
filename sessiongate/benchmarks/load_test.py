"""Load and soak test: many concurrent sessions through a real gateway process in front of fast fake workers.

Starts `--workers` fake SGLang workers (`python -m sessiongate.benchmarks.fake_worker`, instant: no prefix-cache
model unless `--worker-prefix-cache`) and one gateway (`sessiongate serve`: uvicorn, uvloop, httptools) on a fresh
SQLite store (or `--database-url`), then runs `--sessions` concurrent sessions for `--duration` seconds, each sending
turns back to back (a share of them streamed), resending its conversation as a client of an OpenAI-compatible API
does. It reports throughput, latency (p50/p99) and the latency the gateway adds (against the same requests sent
straight to a worker), errors, the turns the store recorded against the turns answered, and the gateway's RSS over
time. The client is aiohttp, reading each answer whole, as `router_overhead`'s: it costs less per request than
httpx's default transport, so more of the machine is left to what is measured.

    python -m sessiongate.benchmarks.load_test --sessions 1000 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from sqlalchemy import text

from sessiongate.sdk._sse import parse_events
from sessiongate.sessions import create_engine

from .processes import FakeWorkerProcess, GatewayServer

__all__ = ["LoadConfig", "LoadReport", "run_load"]


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


@dataclass
class LoadReport:
    config: dict[str, Any]
    turns_sent: int = 0
    turns_ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # Each transport error as "<exception>: <message>".
    error_details: dict[str, int] = field(default_factory=dict)
    throughput_turns_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    direct_latency_ms: dict[str, float] = field(default_factory=dict)
    added_latency_ms: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    rss_mb: list[tuple[float, float]] = field(default_factory=list)

    def summary(self) -> str:
        rss = [mb for _, mb in self.rss_mb]
        lat, direct, added = self.latency_ms, self.direct_latency_ms, self.added_latency_ms
        lines = [
            f"sessions {self.config['sessions']}, {self.config['duration_s']} s, {self.config['workers']} fake workers",
            f"turns sent {self.turns_sent}, ok {self.turns_ok}, errors {self.errors or 0}",
            *([f"error details {self.error_details}"] if self.error_details else []),
            f"throughput {self.throughput_turns_per_s:.1f} turns/s",
            f"latency ms through the gateway p50 {lat.get('p50', 0):.1f} p99 {lat.get('p99', 0):.1f}",
            f"latency ms straight to a worker p50 {direct.get('p50', 0):.1f} p99 {direct.get('p99', 0):.1f}",
            f"added by the gateway p50 {added.get('p50', 0):.1f} p99 {added.get('p99', 0):.1f}",
            f"store rows: {self.rows} (turns answered ok: {self.turns_ok})",
            f"gateway RSS MB: start {rss[0] if rss else 0:.0f}, max {max(rss) if rss else 0:.0f},"
            f" end {rss[-1] if rss else 0:.0f}",
        ]
        return "\n".join(lines)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "mean": statistics.fmean(ordered), "n": len(ordered)}


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
) -> str:
    """One chat request; the assistant's text. Raises on any error status or error event."""
    body = orjson.dumps({"model": "fake-model", "messages": messages, "stream": stream, "max_tokens": max_tokens})
    async with client.post(url, data=body, headers={**headers, "content-type": "application/json"}) as response:
        payload = await response.read()
        if response.status != 200:
            raise RuntimeError(f"status_{response.status}")
    if not stream:
        return str(orjson.loads(payload)["choices"][0]["message"]["content"] or "")
    parts: list[str] = []
    done = False
    for event in parse_events(payload):
        if event.done:
            done = True
            continue
        chunk = event.json()
        if "error" in chunk:
            raise RuntimeError("error_event")
        for choice in chunk.get("choices") or ():
            parts.append(choice.get("delta", {}).get("content") or "")
    if not done:
        raise RuntimeError("stream_cut")
    return "".join(parts)


async def _session(
    index: int,
    client: aiohttp.ClientSession,
    url: str,
    config: LoadConfig,
    deadline: float,
    latencies: list[float],
    errors: Counter[str],
    details: Counter[str],
    counts: Counter[str],
) -> None:
    rng = random.Random(config.seed * 1_000_003 + index)
    session_id = f"load-{config.seed}-{index}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are session {index}."}]
    await asyncio.sleep(rng.random() * 0.5)  # spread the first requests
    while time.monotonic() < deadline:
        messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(12))})
        stream = rng.random() < config.stream_share
        started = time.perf_counter()
        counts["sent"] += 1
        try:
            text = await _turn(
                client, url, messages, stream=stream, max_tokens=config.max_tokens, headers={"x-session-id": session_id}
            )
        except (TimeoutError, RuntimeError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            errors[str(exc) if isinstance(exc, RuntimeError) else type(exc).__name__] += 1
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                details[f"{type(exc).__name__}: {exc}"] += 1
            messages.pop()
            await asyncio.sleep(0.1)
            continue
        latencies.append((time.perf_counter() - started) * 1000)
        counts["ok"] += 1
        messages.append({"role": "assistant", "content": text})
        if len(messages) > 41:  # keep conversations bounded: start over as a new context
            del messages[1:]


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


async def _count_rows(database_url: str) -> dict[str, int]:
    """Turns by status and sessions, as the store holds them after the run (SQLite or PostgreSQL)."""
    engine = create_engine(database_url)
    try:
        async with engine.connect() as db:
            rows = (await db.execute(text("SELECT status, count(*) FROM turns GROUP BY status"))).all()
            sessions = (await db.execute(text("SELECT count(*) FROM sessions"))).scalar_one()
    finally:
        await engine.dispose()
    return {**{f"turns_{status}": int(n) for status, n in rows}, "sessions": int(sessions)}


async def _drive(gateway: GatewayServer, config: LoadConfig, report: LoadReport) -> None:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    details: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    url = f"{gateway.url}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=config.sessions + 10)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as client:
        started = time.monotonic()
        deadline = started + config.duration_s

        async def sample_rss() -> None:
            while time.monotonic() < deadline:
                report.rss_mb.append((round(time.monotonic() - started, 1), round(_rss_mb(gateway.pid), 1)))
                await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample_rss())
        await asyncio.gather(
            *(
                _session(i, client, url, config, deadline, latencies, errors, details, counts)
                for i in range(config.sessions)
            )
        )
        elapsed = time.monotonic() - started
        sampler.cancel()
    report.rss_mb.append((round(elapsed, 1), round(_rss_mb(gateway.pid), 1)))
    report.turns_sent, report.turns_ok = counts["sent"], counts["ok"]
    report.errors = dict(errors)
    report.error_details = dict(details)
    report.throughput_turns_per_s = counts["ok"] / elapsed
    report.latency_ms = _percentiles(latencies)


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
        }
        if config.gateway_source is not None:
            env["PYTHONPATH"] = str(Path(config.gateway_source).resolve())
        gateway = GatewayServer(work, workers=[w.url for w in workers], env=env)
        gateway.wait_ready()
        report.direct_latency_ms = _percentiles(asyncio.run(_direct_baseline(workers[0].url, config)))
        asyncio.run(_drive(gateway, config, report))
        for key in ("p50", "p99"):
            if key in report.latency_ms and key in report.direct_latency_ms:
                report.added_latency_ms[key] = report.latency_ms[key] - report.direct_latency_ms[key]
    finally:
        if gateway is not None:
            gateway.stop()
        for worker in workers:
            worker.stop()
    report.rows = asyncio.run(_count_rows(database_url))
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
    args = parser.parse_args()
    config = LoadConfig(
        sessions=args.sessions,
        duration_s=args.duration,
        workers=args.workers,
        stream_share=args.stream_share,
        max_tokens=args.max_tokens,
        database_url=args.database_url,
        gateway_source=args.gateway_source,
        worker_prefix_cache=args.worker_prefix_cache,
    )
    report = run_load(config)
    print(report.summary())
    if args.out:
        Path(args.out).write_text(json.dumps(asdict(report), indent=2))


if __name__ == "__main__":
    main()

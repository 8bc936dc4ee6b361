"""What the session store costs per chat turn, called as the gateway calls it, over growing agent sessions.

Each session is an agent loop of `--turns` requests that resend the whole history, alternating a user question
answered with a tool call and the tool's result answered with text. Every turn is timed as the gateway does it:
`get_or_create_session`, `begin_turn` before the worker, `complete_turn` after. Where the store supports it, a
second flow drops the get-or-create call and passes `begin_turn(create_session=True)` instead. Sessions run one
after the other (concurrency 1), after an untimed warm-up session, so the numbers are the store's own latency.
`--concurrency N` adds a second measurement: N sessions at once, as a busy gateway writes them, reporting turns
per second, the per-turn latency and how many store calls failed (SQLite allows one writer at a time).

    python -m sessiongate.benchmarks.store_costs  # a temp SQLite file, and the local PostgreSQL if it answers
    python -m sessiongate.benchmarks.store_costs --turns 40 --sessions 5
    python -m sessiongate.benchmarks.store_costs --concurrency 32 --sessions 64 --turns 10
    python -m sessiongate.benchmarks.store_costs --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/postgres

A PostgreSQL URL names a server: a temporary database is created there, migrated, and dropped at the end.
A SQLite URL is used as it is (migrated first).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from sessiongate.sessions import SqlSessionStore, StoreUnavailable, create_engine, upgrade

__all__ = ["main"]

LOCAL_POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
TENANT = "bench"
SYSTEM_PROMPT = "You are a coding agent. " + "Follow the repository's conventions and explain nothing. " * 30
OPERATIONS = ("get_or_create", "begin_turn", "complete_turn", "per turn")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Timings:
    """Per operation: wall-clock milliseconds in the order measured, the same per turn number (1-based), and the
    milliseconds of CPU this process spent (all its threads: the event loop and aiosqlite's), which the load of
    other processes on the machine disturbs less than the wall clock."""

    wall: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPERATIONS})
    by_turn: dict[str, dict[int, list[float]]] = field(default_factory=lambda: {op: {} for op in OPERATIONS})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPERATIONS})

    def add(self, op: str, turn: int, wall_ms: float, cpu_ms: float) -> None:
        self.wall[op].append(wall_ms)
        self.by_turn[op].setdefault(turn, []).append(wall_ms)
        self.cpu[op].append(cpu_ms)

    def merge(self, other: Timings) -> None:
        for op in OPERATIONS:
            self.wall[op].extend(other.wall[op])
            self.cpu[op].extend(other.cpu[op])
            for turn, values in other.by_turn[op].items():
                self.by_turn[op].setdefault(turn, []).extend(values)


class _Clock:
    """Wall and process CPU time, in ms, since the last `lap`."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        lap = ((wall - self.wall) * 1000, (cpu - self.cpu) * 1000)
        self.wall, self.cpu = wall, cpu
        return lap


def _reply(session: int, turn: int) -> dict[str, Any]:
    """The worker's answer to turn `turn` (0-based): a tool call on even turns, text on odd ones."""
    if turn % 2 == 0:
        arguments = f'{{"path": "src/module_{turn}.py", "pattern": "def handler_{session}", "context": 20}}'
        call = {
            "id": f"call_{session}_{turn}",
            "type": "function",
            "function": {"name": "grep", "arguments": arguments},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": f"Step {turn} done. " + "The change compiles and the tests pass. " * 15}


def _next_message(session: int, turn: int) -> dict[str, Any]:
    """What the client appends before turn `turn`: a question, or the result of the previous turn's tool call."""
    if turn % 2 == 0:
        return {"role": "user", "content": f"Task {turn} of session {session}: " + "refactor the handler. " * 12}
    output = "".join(f"src/module_{turn}.py:{line}: def handler_{session}_{line}(request): ...\n" for line in range(30))
    return {"role": "tool", "tool_call_id": f"call_{session}_{turn - 1}", "content": output}


async def _session(store: SqlSessionStore, session_id: str, number: int, turns: int, fused: bool) -> Timings:
    timings = Timings()
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    begin_options: dict[str, Any] = {"create_session": True} if fused else {}
    for t in range(turns):
        history.append(_next_message(number, t))
        clock = _Clock()
        if not fused:
            await store.get_or_create_session(session_id, tenant_id=TENANT)
            timings.add("get_or_create", t + 1, *clock.lap())
        turn = await store.begin_turn(
            session_id,
            tenant_id=TENANT,
            messages=history,
            request={"model": "bench", "temperature": 0, "max_tokens": 256},
            received_at=_now(),
            **begin_options,
        )
        timings.add("begin_turn", t + 1, *clock.lap())
        reply = _reply(number, t)
        await store.complete_turn(
            turn.id,
            output_message=reply,
            finish_reason="tool_calls" if "tool_calls" in reply else "stop",
            model="bench",
            usage={
                "prompt_tokens": 900 * (t + 1),
                "completion_tokens": 60,
                "prompt_tokens_details": {"cached_tokens": 800 * t},
            },
            cached_tokens_details={"device": 800 * t, "host": 0, "storage": 0},
            first_token_at=_now(),
            ended_at=_now(),
            worker="w1",
            dispatched_at=_now(),
        )
        timings.add("complete_turn", t + 1, *clock.lap())
        history.append(reply)
        ops = OPERATIONS[1:3] if fused else OPERATIONS[:3]
        timings.add(
            "per turn",
            t + 1,
            sum(timings.wall[op][-1] for op in ops),
            sum(timings.cpu[op][-1] for op in ops),
        )
    return timings


def _supports_create_session(store: SqlSessionStore) -> bool:
    return "create_session" in inspect.signature(store.begin_turn).parameters


async def measure(url: URL, *, turns: int, sessions: int) -> dict[str, Timings]:
    """Timings per flow ("gateway": three calls a turn; "fused": begin_turn creates the session)."""
    await upgrade(url)
    store = SqlSessionStore(create_engine(url))
    try:
        flows = ["gateway", "fused"] if _supports_create_session(store) else ["gateway"]
        run = secrets.token_hex(4)
        for flow in flows:  # compiles the statements, opens the connection
            await _session(store, f"warmup-{flow}-{run}", 0, min(turns, 6), fused=flow == "fused")
        results = {flow: Timings() for flow in flows}
        for number in range(1, sessions + 1):
            for flow in flows:
                results[flow].merge(
                    await _session(store, f"{flow}-{run}-{number}", number, turns, fused=flow == "fused")
                )
        return results
    finally:
        await store.close()


@dataclass
class Concurrent:
    concurrency: int
    turns_ok: int
    failures: int
    wall_s: float
    per_turn_ms: list[float]


async def measure_concurrent(url: URL, *, turns: int, sessions: int, concurrency: int) -> Concurrent:
    """`sessions` sessions of `turns` turns, `concurrency` of them at once (begin_turn creates the session)."""
    await upgrade(url)
    store = SqlSessionStore(create_engine(url))
    run = secrets.token_hex(4)
    gate = asyncio.Semaphore(concurrency)
    failures = 0
    per_turn: list[float] = []

    async def one(number: int) -> None:
        nonlocal failures
        async with gate:
            try:
                timings = await _session(store, f"concurrent-{run}-{number}", number, turns, fused=True)
            except StoreUnavailable:
                failures += 1
                return
            per_turn.extend(timings.wall["per turn"])

    try:
        await _session(store, f"warmup-{run}", 0, min(turns, 6), fused=True)
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(1, sessions + 1)))
        return Concurrent(concurrency, len(per_turn), failures, time.perf_counter() - started, per_turn)
    finally:
        await store.close()


def report_concurrent(name: str, result: Concurrent) -> str:
    values = result.per_turn_ms or [float("nan")]
    return (
        f"{name}: concurrency {result.concurrency}: {result.turns_ok} turns in {result.wall_s:.1f} s"
        f" ({result.turns_ok / result.wall_s:.0f} turns/s), per turn p50 {statistics.median(values):.1f} ms"
        f" p99 {_percentile(values, 0.99):.1f} ms, sessions failed (store unavailable): {result.failures}"
    )


def report(name: str, results: dict[str, Timings], turns: int, sessions: int) -> str:
    lines = [
        f"{name}: {sessions} sessions x {turns} turns, concurrency 1; wall-clock ms, and turn 1 / turn {turns} as"
        " medians; cpu: this process's CPU ms, median"
    ]
    header = f"  {'flow':<8}{'operation':<15}{'n':>5}{'p50':>8}{'p99':>8}{'mean':>8}{'turn 1':>8}{f'turn {turns}':>9}"
    lines.append(header + f"{'cpu':>7}")
    for flow, timings in results.items():
        for op in OPERATIONS:
            values = timings.wall[op]
            if not values:
                continue
            first = statistics.median(timings.by_turn[op][1])
            last = statistics.median(timings.by_turn[op][turns])
            lines.append(
                f"  {flow:<8}{op:<15}{len(values):>5}{statistics.median(values):>8.2f}{_percentile(values, 0.99):>8.2f}"
                f"{statistics.fmean(values):>8.2f}{first:>8.2f}{last:>9.2f}{statistics.median(timings.cpu[op]):>7.2f}"
            )
    return "\n".join(lines)


async def _admin(server: URL, statement: str) -> None:
    engine = create_async_engine(server, isolation_level="AUTOCOMMIT", connect_args={"timeout": 3})
    try:
        async with engine.connect() as connection:
            await connection.execute(text(statement))
    finally:
        await engine.dispose()


@asynccontextmanager
async def _postgres_database(server: URL) -> AsyncIterator[URL]:
    name = f"sessiongate_bench_{secrets.token_hex(4)}"
    await _admin(server, f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name)
    finally:
        await _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _measure_and_report(name: str, url: URL, *, turns: int, sessions: int, concurrency: int) -> None:
    print(report(name, await measure(url, turns=turns, sessions=sessions), turns, sessions))
    if concurrency > 1:
        result = await measure_concurrent(url, turns=turns, sessions=sessions, concurrency=concurrency)
        print(report_concurrent(name, result))


async def _run(urls: list[tuple[str, URL]], *, turns: int, sessions: int, concurrency: int, required: bool) -> int:
    for name, url in urls:
        if url.get_backend_name() == "postgresql":
            try:
                await _admin(url, "SELECT 1")
            except Exception as exc:  # any failure to reach the server: report it and go on
                print(f"{name}: not reachable at {url.render_as_string()} ({type(exc).__name__}), skipped")
                if required:
                    return 1
                continue
            async with _postgres_database(url) as database:
                await _measure_and_report(name, database, turns=turns, sessions=sessions, concurrency=concurrency)
        else:
            await _measure_and_report(name, url, turns=turns, sessions=sessions, concurrency=concurrency)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="measure only this database (default: temp SQLite + local PostgreSQL)")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=1, help="also run --sessions sessions this many at once")
    args = parser.parse_args(argv)
    if args.turns < 1 or args.sessions < 1 or args.concurrency < 1:
        parser.error("--turns, --sessions and --concurrency must be at least 1")

    with tempfile.TemporaryDirectory(prefix="sessiongate-store-costs-") as tmp:
        if args.database_url is not None:
            url = make_url(args.database_url)
            urls = [(url.get_backend_name(), url)]
        else:
            urls = [
                ("sqlite", make_url(f"sqlite+aiosqlite:///{Path(tmp) / 'sessions.db'}")),
                ("postgresql", make_url(LOCAL_POSTGRES)),
            ]
        required = args.database_url is not None
        return asyncio.run(
            _run(urls, turns=args.turns, sessions=args.sessions, concurrency=args.concurrency, required=required)
        )


if __name__ == "__main__":
    sys.exit(main())

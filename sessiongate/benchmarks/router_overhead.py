"""Gateway overhead against SGLang's own gateway: all in front of the same fast workers, driven the same way.

Starts N instant fake workers (`benchmarks.fake_worker`, each its own process), a real `sessiongate serve` process
(SQLite store: every turn is recorded, sessions persist), SGLang's model gateway (`smg` 1.13, Rust; `manual`
policy by default, which pins each `x-smg-routing-key` to one worker: its session persistence) and, when its wheel
is installed, its predecessor `sglang-router` 0.3.2 as a second row, in front of the same workers; and the Python
floor (`benchmarks.floor_proxy`: a bare proxy on the gateway's own server and HTTP client, recording nothing), which
shows how much of sessiongate's cost is its work per turn and how much the language and server, and the stored
floor (the same proxy recording every turn through sessiongate's own store on SQLite, and nothing else), which shows
how much of it is persisting the turn. One
bounded-concurrency asyncio client drives the workers directly and through each proxy with the same multi-turn
conversations (each request resends the growing history and names its session in
`x-session-id` and `x-smg-routing-key`), streamed and not.

The systems take turns in short phases (the order rotating every round), so machine noise lands on all of them.
For each system and mode: requests/s over its phases, latency p50/p99, the latency it adds (its percentile minus
the direct requests' percentile, from the same run), and the proxy process's CPU time per request (user + system
from /proc, all threads, counted over its own phases only). Then the ratios sessiongate / smg (and / sglang-router),
python-floor / smg, stored-floor / smg, sessiongate / python-floor and sessiongate / stored-floor, as Markdown.

    python -m sessiongate.benchmarks.router_overhead  # 2 workers, concurrency 16, 5 rounds x 400 requests
    python -m sessiongate.benchmarks.router_overhead --workers 1 --concurrency 1 --rounds 3 --phase-requests 200

Exits 1 if any request failed (the table counts them).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson

from sessiongate.sdk._sse import parse_events

from .gateway_overhead import percentile
from .processes import (
    FakeWorkerProcess,
    FloorProxyProcess,
    GatewayServer,
    ManagedProcess,
    SglangRouterProcess,
    SmgProcess,
    local_gateway_env,
    sglang_router_installed,
    smg_installed,
)

__all__ = ["BenchConfig", "main", "markdown", "run_benchmark", "streamed_content"]

DIRECT, SESSIONGATE, SMG, SGLANG_ROUTER = "direct", "sessiongate", "smg", "sglang-router"
PYTHON_FLOOR = "python-floor"
# The floor that also records every turn through sessiongate's store (SQLite): what persisting a turn costs alone.
STORED_FLOOR = "stored-floor"
# The floor recording every turn the least way (`least_store`: one INSERT, one UPDATE): a yardstick for the store.
LEAST_STORED_FLOOR = "least-stored-floor"
# The same sessiongate process driven through `/v1/responses` (`--api responses`): each turn names the previous
# response and sends only its new message; the gateway rebuilds the prompt from the stored turns.
SESSIONGATE_RESPONSES = "sessiongate-responses"
SYSTEMS = (
    DIRECT,
    SESSIONGATE,
    SMG,
    SGLANG_ROUTER,
    PYTHON_FLOOR,
    STORED_FLOOR,
    LEAST_STORED_FLOOR,
    SESSIONGATE_RESPONSES,
)
# The Rust gateways sessiongate is compared with, the current one first.
RUST_GATEWAYS = (SMG, SGLANG_ROUTER)
# The rows each table of ratios divides (numerator, denominator).
RATIOS = (
    (SESSIONGATE, SMG),
    (SESSIONGATE, SGLANG_ROUTER),
    (PYTHON_FLOOR, SMG),
    (STORED_FLOOR, SMG),
    (LEAST_STORED_FLOOR, SMG),
    (SESSIONGATE, PYTHON_FLOOR),
    (SESSIONGATE, STORED_FLOOR),
    (SESSIONGATE_RESPONSES, SESSIONGATE),
)
MODES = ("non-streamed", "streamed")
MODEL = "fake-model"
# About 1 KB, like an agent's system prompt, so bodies have a realistic size from the first turn.
_SYSTEM_PROMPT = "You are a careful coding agent. Read the files you are given and answer briefly. " * 13


@dataclass(frozen=True)
class BenchConfig:
    workers: int = 2
    concurrency: int = 16
    rounds: int = 5
    phase_requests: int = 400
    warmup_requests: int = 64
    turns_per_session: int = 8
    max_tokens: int = 8
    router_policy: str = "manual"
    # Also run sglang-router 0.3.2 (a second row) when its wheel is installed.
    with_sglang_router: bool = True
    # Also run the Python floor (`benchmarks.floor_proxy`): a bare proxy on sessiongate's server and HTTP client.
    with_floor: bool = True
    # Also the stored floor (the floor recording every turn through the gateway's store, on SQLite).
    with_stored_floor: bool = True
    # Also the least stored floor (`--least-stored-floor`).
    with_least_stored_floor: bool = False
    # "chat" (chat completions only) or "responses" (also a `sessiongate-responses` row: the same gateway through
    # `/v1/responses`, each turn chained by `previous_response_id`).
    api: str = "chat"


@dataclass
class Figures:
    """One system in one mode, over all of its measured phases."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    cpu_s: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies_ms) + sum(self.errors.values())

    @property
    def per_second(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0


class Conversation:
    """One slot's sessions against one system: a session of `turns` turns, then a fresh one."""

    path = "/v1/chat/completions"

    def __init__(self, label: str, turns: int) -> None:
        self._label, self._turns = label, turns
        self._number = 0
        self._start()

    def _start(self) -> None:
        self._number += 1
        self.session_id = f"{self._label}-{self._number}"
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM_PROMPT}]

    def next_request(self, *, stream: bool, max_tokens: int) -> tuple[bytes, dict[str, str]]:
        if len(self.messages) > 2 * self._turns:
            self._start()
        turn = len(self.messages) // 2
        self.messages.append({"role": "user", "content": f"Turn {turn}: open src/module_{turn}.py and go on."})
        body: dict[str, Any] = {"model": MODEL, "messages": self.messages, "max_tokens": max_tokens, "stream": stream}
        headers = {
            "content-type": "application/json",
            "x-session-id": self.session_id,
            "x-smg-routing-key": self.session_id,
        }
        return orjson.dumps(body), headers

    def answered(self, content: str) -> None:
        self.messages.append({"role": "assistant", "content": content})

    def failed(self) -> None:
        self.messages.pop()  # the unanswered user message; the next request asks again

    def read(self, payload: bytes, *, stream: bool) -> str:
        """The answer's text (`ValueError` if it is not a complete answer)."""
        return streamed_content(payload) if stream else orjson.loads(payload)["choices"][0]["message"]["content"]


class ResponsesConversation(Conversation):
    """The same conversations through `/v1/responses`: instructions, the new message, the previous response's id."""

    path = "/v1/responses"

    def _start(self) -> None:
        super()._start()
        self.previous: str | None = None
        self.pending: str | None = None

    def next_request(self, *, stream: bool, max_tokens: int) -> tuple[bytes, dict[str, str]]:
        if len(self.messages) > 2 * self._turns:
            self._start()
        turn = len(self.messages) // 2
        message = f"Turn {turn}: open src/module_{turn}.py and go on."
        self.messages.append({"role": "user", "content": message})
        body: dict[str, Any] = {
            "model": MODEL,
            "instructions": _SYSTEM_PROMPT,
            "input": message,
            "max_output_tokens": max_tokens,
            "stream": stream,
        }
        if self.previous is not None:
            body["previous_response_id"] = self.previous
        return orjson.dumps(body), {"content-type": "application/json"}

    def read(self, payload: bytes, *, stream: bool) -> str:
        if stream:
            events = [event.json() for event in parse_events(payload)]
            if not events or events[-1].get("type") != "response.completed":
                raise ValueError("stream ended without response.completed")
            response = events[-1]["response"]
        else:
            response = orjson.loads(payload)
        self.pending = str(response["id"])
        return "".join(
            part.get("text", "") for item in response["output"] for part in item.get("content") or () if part
        )

    def answered(self, content: str) -> None:
        super().answered(content)
        self.previous = self.pending


def streamed_content(payload: bytes) -> str:
    parts: list[str] = []
    events = parse_events(payload)
    if not events or not events[-1].done:
        raise ValueError("stream ended without [DONE]")
    for event in events[:-1]:
        for choice in event.json().get("choices") or ():
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def _request(
    session: aiohttp.ClientSession, url: str, conversation: Conversation, *, stream: bool, max_tokens: int
) -> float:
    body, headers = conversation.next_request(stream=stream, max_tokens=max_tokens)
    started = time.perf_counter()
    try:
        async with session.post(f"{url}{conversation.path}", data=body, headers=headers) as response:
            payload = await response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status} {payload[:200].decode(errors='replace')}")
        content = conversation.read(payload, stream=stream)
    except BaseException:
        conversation.failed()
        raise
    conversation.answered(content)
    return elapsed * 1000


def _cpu_seconds(proxy: ManagedProcess | None) -> float:
    return proxy.cpu_seconds() if proxy is not None else 0.0


async def _phase(
    session: aiohttp.ClientSession,
    url: str,
    conversations: list[Conversation],
    proxy: ManagedProcess | None,
    *,
    requests: int,
    stream: bool,
    max_tokens: int,
    into: Figures | None,
) -> None:
    """`requests` requests over `len(conversations)` concurrent slots; figures go `into` (None: warm-up)."""
    remaining = requests

    async def slot(conversation: Conversation) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            try:
                elapsed = await _request(session, url, conversation, stream=stream, max_tokens=max_tokens)
            except Exception as exc:  # counted and reported: one failure must not end the run
                if into is not None:
                    into.errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                continue
            if into is not None:
                into.latencies_ms.append(elapsed)

    cpu_before, started = _cpu_seconds(proxy), time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for conversation in conversations:
            group.create_task(slot(conversation))
    if into is not None:
        into.wall_s += time.perf_counter() - started
        into.cpu_s += _cpu_seconds(proxy) - cpu_before


async def _drive(targets: dict[str, tuple[str, ManagedProcess | None]], config: BenchConfig) -> dict[str, Figures]:
    figures = {f"{system}/{mode}": Figures() for system in targets for mode in MODES}
    sessions: dict[str, aiohttp.ClientSession] = {}
    conversations = {
        system: [
            (ResponsesConversation if system == SESSIONGATE_RESPONSES else Conversation)(
                f"ro-{system}-{slot}-{time.time_ns()}", config.turns_per_session
            )
            for slot in range(config.concurrency)
        ]
        for system in targets
    }
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        for system in targets:
            # One pool per system, as many connections as slots: no system waits on another's connections.
            connector = aiohttp.TCPConnector(limit=config.concurrency)
            sessions[system] = aiohttp.ClientSession(connector=connector, timeout=timeout)
        for system, (url, proxy) in targets.items():
            for mode in MODES:
                await _phase(
                    sessions[system],
                    url,
                    conversations[system],
                    proxy,
                    requests=config.warmup_requests,
                    stream=mode == "streamed",
                    max_tokens=config.max_tokens,
                    into=None,
                )
        order = list(targets)
        for round_number in range(config.rounds):
            rotated = order[round_number % len(order) :] + order[: round_number % len(order)]
            for mode in MODES if round_number % 2 == 0 else MODES[::-1]:
                for system in rotated:
                    url, proxy = targets[system]
                    await _phase(
                        sessions[system],
                        url,
                        conversations[system],
                        proxy,
                        requests=config.phase_requests,
                        stream=mode == "streamed",
                        max_tokens=config.max_tokens,
                        into=figures[f"{system}/{mode}"],
                    )
    finally:
        for session in sessions.values():
            await session.close()
    return figures


_Process = TypeVar("_Process", bound=ManagedProcess)


@contextmanager
def _started(config: BenchConfig, work_dir: Path) -> Iterator[dict[str, tuple[str, ManagedProcess | None]]]:
    """The workers and the proxies, running; stopped (by pid) on the way out."""
    with ExitStack() as stack:

        def start(process: _Process) -> _Process:
            stack.callback(process.stop)
            return process

        workers = [start(FakeWorkerProcess(work_dir, prefix_cache=False)) for _ in range(config.workers)]
        for worker in workers:
            worker.wait_ready()
        urls = [worker.url for worker in workers]
        gateway = start(GatewayServer(work_dir, workers=urls, env=local_gateway_env(work_dir / "gateway.db")))
        smg = start(SmgProcess(work_dir, workers=urls, policy=config.router_policy))
        router = None
        if config.with_sglang_router and sglang_router_installed():
            router = start(SglangRouterProcess(work_dir, workers=urls, policy=config.router_policy))
        gateway.wait_http(f"{gateway.url}/readyz", timeout_s=60)  # its workers are routable
        smg.wait_ready()
        # Direct requests all go to the first worker: the workers are identical and instant, so where a request
        # lands does not change its cost.
        targets: dict[str, tuple[str, ManagedProcess | None]] = {
            DIRECT: (urls[0], None),
            SESSIONGATE: (gateway.url, gateway),
            SMG: (smg.url, smg),
        }
        if config.api == "responses":
            targets[SESSIONGATE_RESPONSES] = (gateway.url, gateway)
        if router is not None:
            router.wait_ready()
            targets[SGLANG_ROUTER] = (router.url, router)
        if config.with_floor:
            floor = start(FloorProxyProcess(work_dir, workers=urls))
            floor.wait_ready()
            targets[PYTHON_FLOOR] = (floor.url, floor)
        if config.with_stored_floor:
            database_url = f"sqlite+aiosqlite:///{work_dir / 'stored-floor.db'}"
            stored = start(FloorProxyProcess(work_dir, workers=urls, database_url=database_url))
            stored.wait_ready()
            targets[STORED_FLOOR] = (stored.url, stored)
        if config.with_least_stored_floor:
            least = start(FloorProxyProcess(work_dir, workers=urls, least_store=work_dir / "least-stored-floor.db"))
            least.wait_ready()
            targets[LEAST_STORED_FLOOR] = (least.url, least)
        yield targets


def run_benchmark(config: BenchConfig, *, work_dir: Path | None = None) -> dict[str, Figures]:
    with (
        tempfile.TemporaryDirectory(prefix="sessiongate-router-bench-") as tmp,
        _started(config, work_dir or Path(tmp)) as targets,
    ):
        return asyncio.run(_drive(targets, config))


def summary(figures: dict[str, Figures]) -> dict[str, dict[str, Any]]:
    """Per `system/mode`: counts, rates and percentiles; `added_*` against the direct requests of that mode."""
    rows: dict[str, dict[str, Any]] = {}
    for key, f in figures.items():
        system, mode = key.split("/")
        row: dict[str, Any] = {
            "system": system,
            "mode": mode,
            "requests": f.requests,
            "errors": sum(f.errors.values()),
            "error_kinds": dict(f.errors),
            "requests_per_s": f.per_second,
            "p50_ms": statistics.median(f.latencies_ms) if f.latencies_ms else None,
            "p99_ms": percentile(f.latencies_ms, 0.99) if f.latencies_ms else None,
            "cpu_us_per_request": f.cpu_s / f.requests * 1e6 if system != DIRECT and f.requests else None,
        }
        rows[key] = row
    for row in rows.values():
        direct = rows[f"{DIRECT}/{row['mode']}"]
        for q in ("p50", "p99"):
            ours, base = row[f"{q}_ms"], direct[f"{q}_ms"]
            row[f"added_{q}_ms"] = ours - base if row["system"] != DIRECT and None not in (ours, base) else None
    return rows


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| system | mode | requests | errors | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | CPU us/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows.values():
        lines.append(
            f"| {row['system']} | {row['mode']} | {row['requests']} | {row['errors']} | "
            f"{_cell(row['requests_per_s'], 0)} | {_cell(row['p50_ms'])} | {_cell(row['p99_ms'])} | "
            f"{_cell(row['added_p50_ms'])} | {_cell(row['added_p99_ms'])} | {_cell(row['cpu_us_per_request'], 0)} |"
        )
    present = {row["system"] for row in rows.values()}
    for numerator, denominator in RATIOS:
        if numerator not in present or denominator not in present:
            continue
        lines += [
            "",
            f"| {numerator} / {denominator} | req/s | added p50 | added p99 | CPU per request |",
            "|---|---|---|---|---|",
        ]
        for mode in MODES:
            ours, theirs = rows.get(f"{numerator}/{mode}"), rows.get(f"{denominator}/{mode}")
            if ours is None or theirs is None:
                continue
            cells = [
                _ratio(ours[name], theirs[name])
                for name in ("requests_per_s", "added_p50_ms", "added_p99_ms", "cpu_us_per_request")
            ]
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = BenchConfig()
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--phase-requests", type=int, default=defaults.phase_requests)
    parser.add_argument("--warmup-requests", type=int, default=defaults.warmup_requests)
    parser.add_argument("--turns-per-session", type=int, default=defaults.turns_per_session)
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    parser.add_argument(
        "--router-policy",
        default=defaults.router_policy,
        choices=("manual", "cache_aware", "round_robin", "random", "power_of_two"),
        help="the Rust gateways' policy; manual pins each x-smg-routing-key to a worker (session persistence)",
    )
    parser.add_argument(
        "--no-sglang-router", action="store_true", help="leave out sglang-router 0.3.2 even when it is installed"
    )
    parser.add_argument("--no-floor", action="store_true", help="leave out the Python floor (benchmarks.floor_proxy)")
    parser.add_argument(
        "--no-stored-floor", action="store_true", help="leave out the stored floor (the floor recording every turn)"
    )
    parser.add_argument(
        "--least-stored-floor",
        action="store_true",
        help="also the floor recording every turn the least way (benchmarks.least_store: a yardstick for the store)",
    )
    parser.add_argument(
        "--api",
        default=defaults.api,
        choices=("chat", "responses"),
        help="responses: also drive sessiongate through /v1/responses (a sessiongate-responses row)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not smg_installed():
        print("smg is not installed: pip install smg==1.13.0 (the `bench` extra)", file=sys.stderr)
        return 2
    config = BenchConfig(
        workers=args.workers,
        concurrency=args.concurrency,
        rounds=args.rounds,
        phase_requests=args.phase_requests,
        warmup_requests=args.warmup_requests,
        turns_per_session=args.turns_per_session,
        max_tokens=args.max_tokens,
        router_policy=args.router_policy,
        with_sglang_router=not args.no_sglang_router,
        with_floor=not args.no_floor,
        with_stored_floor=not args.no_stored_floor,
        with_least_stored_floor=args.least_stored_floor,
        api=args.api,
    )
    rows = summary(run_benchmark(config))
    print(
        f"{config.workers} instant fake workers; concurrency {config.concurrency}; {config.rounds} rounds x "
        f"{config.phase_requests} requests per system and mode; {config.turns_per_session}-turn sessions; "
        f"Rust gateways' policy {config.router_policy}; sessiongate on SQLite"
    )
    print()
    print(markdown(rows))
    failures = {key: row["error_kinds"] for key, row in rows.items() if row["errors"]}
    if failures:
        print(f"\nfailed requests: {failures}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({"config": dataclasses.asdict(config), "rows": rows}, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

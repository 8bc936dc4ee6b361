"""Instructions per chat turn, counted by valgrind: what serving a turn costs the gateway, free of this machine's noise.

`router_overhead` measures CPU time over real sockets, side by side with the Rust gateways, and that is the figure
the goals are set in. On a shared VM its figures move by 10-30% from run to run, more than most single changes save;
this counts the instructions executed by the process that serves the turns (user space: syscalls and cache misses
are not in it), so a change is judged by a number that does not move. It runs in-process: a driver calls the ASGI app
directly (no client sockets), 16 conversations at once that resend their growing history as `router_overhead`'s do,
and the upstream is two instant fake workers in their own processes (not counted). Each system runs twice after the
same warm-up, for a short and a long count of turns: the difference over the extra turns is the cost per turn, so
start-up and imports cancel out.

Systems: `sessiongate` (the app as `sessiongate serve` builds it, SQLite store), `floor` (`benchmarks.floor_proxy`:
parse, add the gateway's fields, relay), `stored-floor` (the floor recording every turn through the gateway's store)
and `store` (the store alone, `begin_turn` + `complete_turn` as the chat route calls them). The floors' and
sessiongate's figures include the driver's own work, the same for all.

    python -m sessiongate.benchmarks.instructions                          # all three, non-streamed
    python -m sessiongate.benchmarks.instructions --stream --systems sessiongate floor

Needs valgrind (`apt-get install valgrind`); each system takes a few minutes. Under valgrind a turn takes ~50x its
wall time, so the gateway's time-driven work (load polls, health checks, the advisor's tick) is set to once a minute:
counted per second, it would otherwise be counted per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from .processes import FakeWorkerProcess
from .router_overhead import streamed_content

__all__ = ["SYSTEMS", "main", "serve_turns"]

SYSTEMS = ("sessiongate", "floor", "stored-floor", "store")
_CONVERSATIONS = 16
_TURNS_PER_SESSION = 8
_SYSTEM_PROMPT = "You are a careful coding agent. " * 8
_QUIET_GATEWAY = {  # once a minute, or as rarely as allowed: see the module's docstring
    "SESSIONGATE_LOAD_POLL_INTERVAL_S": "60",
    "SESSIONGATE_HEALTH_INTERVAL_S": "600",
    "SESSIONGATE_ADVISOR_TICK_S": "60",
}

Turn = Callable[[str, list[dict[str, Any]]], Any]  # (session id, messages) -> awaitable of the answer's text


# the inner process: serve turns, print how many


async def serve_turns(system: str, workers: Sequence[str], *, warm: int, turns: int, stream: bool) -> int:
    """Serve `warm` turns, then `turns` more, with `_CONVERSATIONS` conversations at once; the turns that failed."""
    async with _system(system, workers, stream=stream) as turn:
        failed = [0]
        await _conversations(turn, "warm", warm, failed)
        await _conversations(turn, "measured", turns, failed)
        return failed[0]


async def _conversations(turn: Turn, label: str, total: int, failed: list[int]) -> None:
    served = [0]

    async def conversation(slot: int) -> None:
        number = 0
        while served[0] < total:
            number += 1
            messages: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM_PROMPT}]
            for seq in range(_TURNS_PER_SESSION):
                if served[0] >= total:
                    return
                served[0] += 1
                messages.append({"role": "user", "content": f"Turn {seq}: open src/module_{seq}.py and go on."})
                answer = await turn(f"{label}-{slot}-{number}", messages)
                if answer is None:
                    failed[0] += 1
                    messages.pop()
                else:
                    messages.append({"role": "assistant", "content": answer})

    await asyncio.gather(*(conversation(slot) for slot in range(_CONVERSATIONS)))


@contextlib.asynccontextmanager
async def _system(system: str, workers: Sequence[str], *, stream: bool) -> AsyncIterator[Turn]:
    if system == "store":
        async with _store_turns() as turn:
            yield turn
        return
    async with contextlib.AsyncExitStack() as stack:
        if system in ("floor", "stored-floor"):
            from .floor_proxy import FloorProxy

            work_dir = stack.enter_context(tempfile.TemporaryDirectory())
            database_url = f"sqlite+aiosqlite:///{work_dir}/floor.db" if system == "stored-floor" else None
            app: Any = FloorProxy(list(workers), database_url=database_url)
            await app.open()
            stack.push_async_callback(app.close)
            state: dict[str, Any] = {}
        else:
            app, state = await stack.enter_async_context(_gateway(workers))

        async def turn(session_id: str, messages: list[dict[str, Any]]) -> str | None:
            body = orjson.dumps({"model": "fake", "messages": messages, "max_tokens": 16, "stream": stream})
            status, payload = await _call(app, state, body, session_id)
            if status != 200:
                return None
            return _streamed_text(payload) if stream else orjson.loads(payload)["choices"][0]["message"]["content"]

        yield turn


@contextlib.asynccontextmanager
async def _gateway(workers: Sequence[str]) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    from sessiongate import sessions
    from sessiongate.gateway.app import create_app
    from sessiongate.gateway.observability.logs import configure
    from sessiongate.gateway.settings import GatewaySettings

    with tempfile.TemporaryDirectory() as work_dir:
        env = {
            "SESSIONGATE_ALLOW_UNAUTHENTICATED": "1",
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{work_dir}/gateway.db",
            "SESSIONGATE_LOG_LEVEL": "warning",
            "SESSIONGATE_WORKERS": ",".join(workers),
            "SESSIONGATE_CACHE_SALT_SECRET": "instructions-benchmark",
            **_QUIET_GATEWAY,
        }
        settings = GatewaySettings.from_env(env)
        configure(level=settings.log_level)
        await sessions.upgrade(settings.database_url)
        app = create_app(settings)
        async with app.router.lifespan_context(app) as state:
            yield app, dict(state or {})


@contextlib.asynccontextmanager
async def _store_turns() -> AsyncIterator[Turn]:
    from sessiongate import sessions

    with tempfile.TemporaryDirectory() as work_dir:
        url = f"sqlite+aiosqlite:///{work_dir}/store.db"
        await sessions.upgrade(url)
        store = sessions.SqlSessionStore(sessions.create_engine(url))

        async def turn(session_id: str, messages: list[dict[str, Any]]) -> str:
            received = datetime.now(UTC)
            begun = await store.begin_turn(
                session_id,
                tenant_id="default",
                create_session=True,
                messages=messages,
                request={"model": "fake", "max_tokens": 16},
                received_at=received,
            )
            await asyncio.sleep(0)  # the worker's answer comes in a later turn of the event loop
            answer = "ok " * 10
            await store.complete_turn(
                begun.id,
                output_message={"role": "assistant", "content": answer},
                finish_reason="stop",
                model="fake",
                usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
                first_token_at=received,
                ended_at=datetime.now(UTC),
                worker="w1",
                dispatched_at=received,
            )
            return answer

        try:
            yield turn
        finally:
            await store.close()


async def _call(app: Any, state: dict[str, Any], body: bytes, session_id: str) -> tuple[int, bytes]:
    """One POST /v1/chat/completions straight into the ASGI app, as uvicorn would deliver it."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await never.wait()  # the client never leaves: the app's disconnect watcher waits here until cancelled
        raise AssertionError("unreachable")

    status, chunks = 0, []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    headers = [
        (b"host", b"gateway"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-session-id", session_id.encode()),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": dict(state),
    }
    await app(scope, receive, send)
    return status, b"".join(chunks)


def _streamed_text(payload: bytes) -> str | None:
    """The streamed answer's text; None for a stream that did not end with [DONE] (an error event)."""
    try:
        return streamed_content(payload)
    except ValueError:
        return None


# the outer process: valgrind runs the inner one


@dataclass(frozen=True)
class Count:
    system: str
    stream: bool
    instructions_per_turn: int


_COLLECTED = re.compile(r"Collected : (\d+)")


def count(system: str, workers: Sequence[str], *, warm: int, short: int, long: int, stream: bool) -> Count:
    totals = []
    for turns in (short, long):
        command = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "sessiongate.benchmarks.instructions",
            "--inner",
            system,
            "--warm",
            str(warm),
            "--turns",
            str(turns),
            "--workers",
            *workers,
            *(["--stream"] if stream else []),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same hashing in every run: dicts and sets as alike as can be
        run = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        found = _COLLECTED.search(run.stderr)
        if run.returncode != 0 or found is None:
            raise RuntimeError(f"{system}: valgrind run failed ({run.returncode}):\n{run.stdout}\n{run.stderr[-3000:]}")
        totals.append(int(found.group(1)))
    return Count(system, stream, (totals[1] - totals[0]) // (long - short))


def report(counts: Sequence[Count]) -> str:
    floors = {c.stream: c.instructions_per_turn for c in counts if c.system == "floor"}
    lines = ["| system | mode | instructions per turn | / floor |", "|---|---|---|---|"]
    for c in counts:
        floor = floors.get(c.stream)
        ratio = f"{c.instructions_per_turn / floor:.2f}x" if floor and c.system != "floor" else "-"
        mode = "streamed" if c.stream else "non-streamed"
        lines.append(f"| {c.system} | {mode} | {c.instructions_per_turn:,} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--stream", action="store_true", help="streamed turns (the store has no streamed mode)")
    parser.add_argument("--warm", type=int, default=64)
    parser.add_argument("--short", type=int, default=200)
    parser.add_argument("--long", type=int, default=600)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--inner", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workers", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        failed = asyncio.run(
            serve_turns(args.inner, args.workers, warm=args.warm, turns=args.turns, stream=args.stream)
        )
        print(f"failed turns: {failed}")
        sys.exit(1 if failed else 0)
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    if args.long <= args.short:
        sys.exit("--long must be more than --short")
    with tempfile.TemporaryDirectory() as work_dir, contextlib.ExitStack() as stack:
        workers = []
        for _ in range(2):
            worker = FakeWorkerProcess(Path(work_dir), prefix_cache=False)
            stack.callback(worker.stop)
            workers.append(worker)
        for worker in workers:
            worker.wait_ready()
        systems = [s for s in args.systems if not (args.stream and s == "store")]
        counts = [
            count(s, [w.url for w in workers], warm=args.warm, short=args.short, long=args.long, stream=args.stream)
            for s in systems
        ]
    print(f"{_CONVERSATIONS} conversations at once, {args.long - args.short} turns counted per system (valgrind)\n")
    print(report(counts))
    if args.json:
        args.json.write_text(orjson.dumps([c.__dict__ for c in counts], option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()

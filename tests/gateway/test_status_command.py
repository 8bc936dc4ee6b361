"""`sessiongate status` against a real gateway on a real port: printed once, and live in a real terminal (tmux).

The gateway and two fake workers run behind uvicorn; the command runs as its own process, as an operator runs it.
The terminal test starts it inside a detached tmux session (160x50, on a tmux server of the test's own) and reads
the screen with `capture-pane`: the workers, a session and its turns, and a turn made later appearing after a
redraw. Without tmux that test is skipped, saying why, unless SESSIONGATE_REQUIRE_TMUX=1 (CI), where it fails;
`scripts/ensure-tmux.sh` installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.gateway.app import create_app
from sessiongate.gateway.server_protocol import HttpProtocol
from sessiongate.gateway.settings import GatewaySettings

from .conftest import served

pytestmark = pytest.mark.anyio

ADMIN_KEY = "status-admin-key"
ROOT = Path(__file__).resolve().parents[2]
USER = {"role": "user", "content": "one two three four five six seven eight nine ten"}


@dataclass
class Stack:
    url: str
    workers: tuple[str, str]


@contextlib.asynccontextmanager
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    pool: list[tuple[str, ...]] = []
    behaviours = [FakeWorkerBehaviour(pool=pool), FakeWorkerBehaviour(pool=pool)]
    async with (
        served(create_fake_worker(behaviours[0]), http=HttpProtocol, lifespan="on") as a,
        served(create_fake_worker(behaviours[1]), http=HttpProtocol, lifespan="on") as b,
    ):
        settings = GatewaySettings(
            allow_unauthenticated=True,
            admin_key=ADMIN_KEY,
            workers=(a, b),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
            load_poll_interval_s=0.05,
        )
        async with served(create_app(settings), http=HttpProtocol, lifespan="on") as url:
            yield Stack(url, (a.removeprefix("http://"), b.removeprefix("http://")))


async def _turns(client: httpx.AsyncClient, session_id: str, count: int) -> None:
    messages: list[dict[str, object]] = []
    for n in range(count):
        messages.append({**USER, "content": f"{USER['content']} {n}"})
        answer = await client.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": session_id},
            json={"messages": messages, "max_tokens": 4, "stream": n % 2 == 1},
        )
        assert answer.status_code == 200
        if n % 2 == 0:
            messages.append(answer.json()["choices"][0]["message"])
        else:
            messages.append({"role": "assistant", "content": "ok"})


def _command(url: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "sessiongate.cli", "status", "--url", url, *flags]


def _env(admin_key: str = ADMIN_KEY) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "SESSIONGATE_ADMIN_KEY": admin_key}


async def _run(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _turn_lines(screen: str, session_id: str) -> list[list[str]]:
    """The LAST TURNS rows of a session, split into their columns' words."""
    if "LAST TURNS" not in screen:
        return []  # not drawn yet
    section = screen.split("LAST TURNS", 1)[1]
    return [line.split() for line in section.splitlines() if f" {session_id} " in f" {line} "]


async def test_status_once_prints_workers_sessions_advisories_and_turns(tmp_path: Path) -> None:
    async with stack(tmp_path) as s, httpx.AsyncClient(base_url=s.url, timeout=30) as client:
        await _turns(client, "printed", 2)
        # The user types: an advisory in flight until the next turn claims it (or it expires).
        assert (await client.post("/v1/sessions/printed/typing", json={"state": "started"})).status_code == 202
        code, out, err = await _run(_command(s.url, "--once"), _env())
        assert code == 0, err
        for worker in s.workers:
            assert worker in out
        sessions = out.split("LIVE SESSIONS", 1)[1].split("ADVISORIES", 1)[0]
        assert ["printed", "default", "2"] in [line.split()[:3] for line in sessions.splitlines()]
        advisories = out.split("ADVISORIES (1 in flight)", 1)[1].split("LAST TURNS", 1)[0]
        assert "in flight: typing for printed on " in advisories
        rows = _turn_lines(out, "printed")
        assert sorted(row[3] for row in rows) == ["1", "2"]  # "when" is two words ("3s ago"): seq is column 3
        assert all(row[4] == "ok" for row in rows)
        assert {row[5] for row in rows} <= set(s.workers)

        code, _, err = await _run(_command(s.url, "--once"), _env("not-the-admin-key"))
        assert code == 1
        assert "cannot read" in err


def _tmux() -> str:
    binary = shutil.which("tmux")
    if binary is None:
        reason = "tmux is not installed: run scripts/ensure-tmux.sh (apt-get install tmux)"
        if os.environ.get("SESSIONGATE_REQUIRE_TMUX") == "1":
            pytest.fail(f"{reason}; SESSIONGATE_REQUIRE_TMUX=1 requires it")
        pytest.skip(reason)
    return binary


async def _screen(tmux: list[str]) -> str:
    code, out, err = await _run([*tmux, "capture-pane", "-p", "-t", "status"], dict(os.environ))
    assert code == 0, err
    return out


async def _until(tmux: list[str], check: str, predicate: object, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = await _screen(tmux)
        if callable(predicate) and predicate(screen):
            return screen
        await asyncio.sleep(0.2)
    raise AssertionError(f"the screen never showed {check}:\n{screen}")


async def test_status_redraws_in_a_real_terminal(tmp_path: Path) -> None:
    binary = _tmux()
    # A tmux server of this test's own (its socket in the test's directory), so no one's sessions are touched.
    tmux = [binary, "-S", str(tmp_path / "tmux.sock"), "-f", "/dev/null"]
    async with stack(tmp_path) as s, httpx.AsyncClient(base_url=s.url, timeout=30) as client:
        await _turns(client, "watched", 2)
        # The tmux server does not pass this process's environment on: the command sets what it needs.
        env = {"PYTHONPATH": str(ROOT), "SESSIONGATE_ADMIN_KEY": ADMIN_KEY}
        command = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *_command(s.url, "--interval", "0.5")])
        terminal = ["new-session", "-d", "-x", "160", "-y", "50", "-s", "status", command]
        code, _, err = await _run([*tmux, *terminal], _env())
        assert code == 0, err
        try:
            screen = await _until(
                tmux, "the workers and the session's two turns", lambda text: len(_turn_lines(text, "watched")) == 2
            )
            assert "WORKERS (2 of 2 routable)" in screen
            for worker in s.workers:
                assert worker in screen
            assert "watched" in screen.split("LIVE SESSIONS", 1)[1].split("ADVISORIES", 1)[0]

            await _turns(client, "later", 1)
            screen = await _until(tmux, "the later turn", lambda text: len(_turn_lines(text, "later")) == 1)
            (row,) = _turn_lines(screen, "later")
            assert row[3:5] == ["1", "ok"]
            assert screen.count("sessiongate status") == 1  # redrawn in place, not scrolled
        finally:
            await _run([*tmux, "kill-server"], dict(os.environ))

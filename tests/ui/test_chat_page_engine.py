"""The chat page in a real browser, in front of a real model: headless Chromium, the gateway as `sessiongate serve`,
one real SGLang CPU worker serving SmolLM2-135M-Instruct.

- Keyless, as `sessiongate up` runs it: a user opens /ui, types a question with real key events and presses
  Enter, then a follow-up. Each answer streams into the page (in more than one piece) and is the text the gateway
  recorded for its turn; the typing hints reached the gateway (the session has advisories of kind `typing`); the
  page's turns table shows each turn as recorded: worker, cached tokens by tier (the follow-up finds the first
  turn's KV on the device). The page logs no error. A screenshot is kept in test-artifacts/ui-chat.png.
- A gateway that requires keys: the page says so, works once the key is entered, and keeps the key and the
  session across a reload of the tab.

Chromium comes from scripts/ensure-chromium.sh; without it the module is skipped, unless
SESSIONGATE_REQUIRE_BROWSER=1 (CI), where a missing browser fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.benchmarks.processes import GatewayServer
from sessiongate.gateway.workers.pool import worker_id_for
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess
from tests.conftest import running_worker

from .browser import Page, find_chromium, open_page

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ADMIN_KEY = "ui-test-admin"
QUESTION = "What is the capital of France? Answer in one sentence."
FOLLOW_UP = "And what is the capital of Italy? Answer in one sentence."
DASH = "\u2014"  # what the page shows for a value it does not have
SCREENSHOT = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui-chat.png"


# Session-scoped, like `smollm2_model_dir`: pytest sets up wider scopes first, and a module without a browser must
# be skipped before the model is converted or a worker started.
@pytest.fixture(scope="session")
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        reason = "chromium is not installed: run scripts/ensure-chromium.sh (apt-get install chromium)"
        if os.environ.get("SESSIONGATE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}; SESSIONGATE_REQUIRE_BROWSER=1 requires it")
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="module")
def smollm2_worker(
    chromium: str, smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]
) -> Iterator[WorkerProcess]:
    config = WorkerConfig(
        model_path=smollm2_model_dir,
        state_dir=tmp_path_factory.mktemp("ui-worker"),
        port=free_port(),
        max_total_tokens=2048,
        # Small pages, so that a short conversation's second turn finds the first one's KV (64-token pages: none).
        page_size=16,
    )
    with running_worker(config) as process:
        yield process


@pytest.fixture
def start_gateway(smollm2_worker: WorkerProcess, tmp_path: Path) -> Iterator[Callable[..., GatewayServer]]:
    """`start_gateway(workers=None, **env)`: `sessiongate serve` in front of `workers` (None: the SmolLM2 worker),
    with the admin key and `env` added."""
    started: list[GatewayServer] = []

    def start(workers: list[str] | None = None, **env: str) -> GatewayServer:
        folder = tmp_path / f"gateway-{len(started)}"
        folder.mkdir()
        settings = {
            "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{folder / 'gateway.db'}",
            "SESSIONGATE_LOG_LEVEL": "warning",
            **env,
        }
        server = GatewayServer(folder, workers=workers or [smollm2_worker.url], env=settings)
        started.append(server)
        server.wait_ready(60)
        return server

    yield start
    for server in started:
        server.stop()


def _js(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)})"


def _cell(value: object) -> str:
    return DASH if value is None or value == "" else str(value)


def _expected_row(turn: dict[str, Any]) -> list[str]:
    """The first seven cells of the page's row for `turn`, as the page writes them (the advisory and TTFT cells
    are checked apart: an advisory's outcome settles after its turn)."""
    usage = turn["usage"] or {}
    tiers = usage.get("cached_tokens_details") or {}
    return [
        _cell(turn["seq"]),
        _cell(turn["status"]),
        _cell(turn["worker"]),
        _cell(usage.get("cached_tokens")),
        *(_cell(tiers.get(tier)) for tier in ("device", "host", "storage")),
    ]


async def _rows_once_they_show(page: Page, expected: list[list[str]], timeout_s: float = 30.0) -> list[list[str]]:
    """The page's turns table once its rows begin with `expected` (the page reads the turns again a few times
    after each answer: the turn is recorded as the stream ends)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows: list[list[str]] = await page.evaluate(
            "Array.from(document.querySelectorAll('#turns tbody tr'), r => Array.from(r.cells, c => c.textContent))"
        )
        if [row[: len(expected[0])] for row in rows] == expected:
            return rows
        assert time.monotonic() < deadline, f"the page shows {rows}, the gateway recorded {expected}"
        await asyncio.sleep(0.2)


async def _ask(page: Page, question: str, turn: int) -> tuple[str, int, str]:
    """Type `question` into the page with real key events, press Enter, wait for the streamed answer to end:
    (the answer's text, how many pieces it arrived in, the worker the gateway named)."""
    await page.click("#prompt")
    await page.type_text(question)
    await page.wait_for(f"document.body.dataset.typingStarted === '{turn}'", f"turn {turn}'s typing hint was sent")
    assert await page.evaluate(_js("#prompt") + ".value") == question
    await page.press("Enter")
    answer = f"document.querySelectorAll('.message.assistant[data-done=\"true\"]')[{turn - 1}]"
    await page.wait_for(f"{answer} !== undefined", f"turn {turn}'s streamed answer ended", timeout_s=120)
    return (
        await page.evaluate(f"{answer}.querySelector('.text').textContent"),
        int(await page.evaluate(f"{answer}.dataset.chunks")),
        await page.evaluate(f"{answer}.dataset.worker"),
    )


async def test_questions_typed_in_the_page_are_answered_and_shown_with_their_turns(
    chromium: str, smollm2_worker: WorkerProcess, start_gateway: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    gateway = start_gateway(SESSIONGATE_ALLOW_UNAUTHENTICATED="1")  # what `sessiongate up` runs
    async with open_page(chromium, tmp_path) as page:
        await page.send("Page.navigate", url=f"{gateway.url}/ui")
        await page.wait_for("document.body && document.body.dataset.ready === 'true'", "the page started")
        session_id = await page.evaluate("document.body.dataset.session")
        assert session_id, f"no session; status: {await page.evaluate(_js('#status') + '.textContent')}"
        # Greedy and short, so the answer is the model's best and the CPU model is quick: the page's own fields.
        await page.evaluate(f"{_js('#max-tokens')}.value = '48'; {_js('#temperature')}.value = '0'")

        first, chunks, worker = await _ask(page, QUESTION, 1)
        second, _, _ = await _ask(page, FOLLOW_UP, 2)

        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as api:
            turns = (await api.get(f"/v1/sessions/{session_id}/turns")).json()["data"]
            # The typing hints reached the gateway: the advisor made advisories of kind `typing` for the session.
            admin = await api.get(f"/v1/admin/sessions/{session_id}", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert [t["status"] for t in turns] == ["ok", "ok"]
        # The turns table shows each turn as the gateway recorded it: worker, cached tokens by tier.
        rows = await _rows_once_they_show(page, [_expected_row(t) for t in turns])
        await page.screenshot(SCREENSHOT)
        assert page.errors == []

    # Real text, streamed in pieces, and exactly what the gateway recorded for the turns.
    assert re.search(r"[A-Za-z]{3,}", first), first
    assert "Paris" in first, first
    assert "Rome" in second, second
    assert chunks > 1, f"the answer arrived in {chunks} piece(s): not streamed"
    assert [t["input_messages"][-1]["content"] for t in turns] == [QUESTION, FOLLOW_UP]
    assert [t["output_message"]["content"] for t in turns] == [first, second]
    assert turns[0]["worker"] == worker == worker_id_for(smollm2_worker.url)
    assert [row[2] for row in rows] == [worker, worker]
    # The second turn reuses the first one's KV (its prompt starts with the whole first turn), and the row says so.
    assert turns[1]["usage"]["cached_tokens"] > 0
    assert int(rows[1][3]) == turns[1]["usage"]["cached_tokens"]
    assert all(re.fullmatch(rf"{DASH}|\w+: \w+", row[7]) for row in rows), rows  # kind: outcome, or none
    assert all(re.fullmatch(r"\d+ ms", row[8]) for row in rows), rows  # time to first token

    assert admin.status_code == 200, admin.text
    kinds = [a["kind"] for a in admin.json()["advisories"]]
    assert kinds.count("typing") >= 1, admin.json()["advisories"]
    assert SCREENSHOT.stat().st_size > 10_000


async def test_a_turn_that_fails_is_shown_failed_and_its_message_kept(
    chromium: str, start_gateway: Callable[..., GatewayServer], free_port: Callable[[], int], tmp_path: Path
) -> None:
    # A gateway whose only worker does not answer: the turn is refused (503) after it was recorded.
    gateway = start_gateway([f"http://127.0.0.1:{free_port()}"], SESSIONGATE_ALLOW_UNAUTHENTICATED="1")
    async with open_page(chromium, tmp_path) as page:
        await page.send("Page.navigate", url=f"{gateway.url}/ui")
        await page.wait_for("document.body && document.body.dataset.ready === 'true'", "the page started")
        await page.click("#prompt")
        await page.type_text("Is anyone there?", delay_s=0)
        await page.press("Enter")
        await page.wait_for("document.body.dataset.busy === 'false'", "the turn ended")
        status = await page.evaluate(_js("#status") + ".textContent")
        assert await page.evaluate(_js("#status") + ".dataset.kind") == "error", status
        assert await page.evaluate(_js("#prompt") + ".value") == "Is anyone there?"  # back in the box
        assert await page.evaluate(_js(".message.user") + ".classList.contains('failed')")
        assert await page.evaluate("document.querySelectorAll('.message.assistant').length") == 0
        rows = await _rows_once_they_show(page, [["1", "failed"]])
        assert rows[0][2] == DASH  # no worker served it
        session_id = await page.evaluate("document.body.dataset.session")
        [refused] = page.errors  # the browser logs the refused request, and nothing else
        assert "503" in refused, refused
        assert refused.endswith(f"{gateway.url}/v1/chat/completions"), refused

    # What the page said is the gateway's own explanation, and the user's message was recorded with the failure.
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as api:
        [turn] = (await api.get(f"/v1/sessions/{session_id}/turns")).json()["data"]
    assert turn["status"] == "failed"
    assert turn["input_messages"] == [{"role": "user", "content": "Is anyone there?"}]
    assert turn["error"]["message"] in status, (turn["error"], status)


async def test_a_gateway_that_needs_a_key_gets_it_from_the_page_which_keeps_it_for_the_tab(
    chromium: str, start_gateway: Callable[..., GatewayServer], tmp_path: Path
) -> None:
    key = "ui-test-tenant-key"
    gateway = start_gateway(SESSIONGATE_API_KEY=key)  # no keyless access: every API call needs the key
    async with open_page(chromium, tmp_path) as page:
        await page.send("Page.navigate", url=f"{gateway.url}/ui")
        await page.wait_for("document.body && document.body.dataset.ready === 'true'", "the page started")
        status = await page.evaluate(_js("#status") + ".textContent")
        assert "API key" in status, status
        assert await page.evaluate("document.body.dataset.session") == ""

        await page.click("#api-key")
        await page.type_text(key, delay_s=0)
        await page.evaluate("document.body.dataset.ready = 'false'")
        await page.click("#key-form button")
        await page.wait_for("document.body.dataset.ready === 'true'", "the page started again with the key")
        session_id = await page.evaluate("document.body.dataset.session")
        assert session_id
        await page.evaluate(f"{_js('#max-tokens')}.value = '24'; {_js('#temperature')}.value = '0'")
        # A keystroke, then the box cleared: a typing hint, then its end, each answered by the gateway's advisor.
        await page.click("#prompt")
        await page.type_text("x", delay_s=0)
        await page.wait_for("document.body.dataset.typingStarted === '1'", "the typing hint was sent")
        await page.press("Backspace")
        await page.wait_for("document.body.dataset.typingStopped === '1'", "the end of typing was sent")
        assert await page.evaluate(_js("#typing-state") + ".textContent") == "not typing (hint: stopping)"

        await page.type_text("Name one colour.", delay_s=0)
        await page.press("Enter")
        await page.wait_for(
            "document.querySelector('.message.assistant[data-done=\"true\"]') !== null", "the answer", timeout_s=120
        )
        answer = await page.evaluate(_js(".message.assistant .text") + ".textContent")
        await page.wait_for("document.querySelectorAll('#turns tbody tr').length === 1", "the turn's row")

        # A reload in the same tab keeps the key and the session, and shows the conversation again.
        await page.send("Page.reload")
        await page.wait_for("document.body && document.body.dataset.ready === 'true'", "the reloaded page started")
        assert await page.evaluate("document.body.dataset.session") == session_id
        shown = await page.evaluate("Array.from(document.querySelectorAll('.message .text'), m => m.textContent)")
        assert shown == ["Name one colour.", answer]
        await page.wait_for("document.querySelectorAll('#turns tbody tr').length === 1", "the turn's row again")
        # The browser logs the one refused call of the first start (no key yet), and nothing else.
        [refused] = page.errors
        assert "401" in refused, refused
        assert refused.endswith(f"{gateway.url}/v1/models"), refused

    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as api:
        assert (await api.get(f"/v1/sessions/{session_id}/turns")).status_code == 401
        turns = await api.get(f"/v1/sessions/{session_id}/turns", headers={"authorization": f"Bearer {key}"})
        assert [t["output_message"]["content"] for t in turns.json()["data"]] == [answer]

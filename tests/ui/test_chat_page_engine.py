"""The chat page in a real browser, in front of a real model: headless Chromium, the gateway as `sessiongate serve`
(keyless, as `sessiongate up` runs it), one real SGLang CPU worker serving SmolLM2-135M-Instruct.

A user opens /ui, types a question with real key events, and presses Enter. The answer streams into the page (in
more than one piece) and is the text the gateway recorded for the turn; the typing hint reached the gateway (the
session has an advisory of kind `typing`); the page's turns table shows the worker that served the turn. The page
logs no error. A screenshot of the page is kept in test-artifacts/ui-chat.png.

Chromium comes from scripts/ensure-chromium.sh; without it the module is skipped, unless
SESSIONGATE_REQUIRE_BROWSER=1 (CI), where a missing browser fails.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.processes import GatewayServer
from gateway.workers import worker_id_for
from sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker

from .browser import find_chromium, open_page

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ADMIN_KEY = "ui-test-admin"
QUESTION = "What is the capital of France? Answer in one sentence."
SCREENSHOT = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui-chat.png"


@pytest.fixture(scope="module")
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
    # After `chromium`: no worker is started for a module that is skipped.
    config = WorkerConfig(
        model_path=smollm2_model_dir,
        state_dir=tmp_path_factory.mktemp("ui-worker"),
        port=free_port(),
        max_total_tokens=2048,
    )
    process = start_worker(config)
    try:
        process.wait_ready(300)
        yield process
    finally:
        process.stop()


@pytest.fixture
def start_gateway(smollm2_worker: WorkerProcess, tmp_path: Path) -> Iterator[Callable[..., GatewayServer]]:
    """`start_gateway(**env)`: `sessiongate serve` in front of the worker, with the admin key and `env` added."""
    started: list[GatewayServer] = []

    def start(**env: str) -> GatewayServer:
        folder = tmp_path / f"gateway-{len(started)}"
        folder.mkdir()
        settings = {
            "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
            "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{folder / 'gateway.db'}",
            "SESSIONGATE_LOG_LEVEL": "warning",
            **env,
        }
        server = GatewayServer(folder, workers=[smollm2_worker.url], env=settings)
        started.append(server)
        server.wait_ready(60)
        return server

    yield start
    for server in started:
        server.stop()


def _js(selector: str) -> str:
    return f"document.querySelector({json.dumps(selector)})"


async def test_a_question_typed_in_the_page_is_answered_and_shown_with_its_turn(
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

        await page.click("#prompt")
        await page.type_text(QUESTION)
        await page.wait_for("document.body.dataset.typingStarted === '1'", "the typing hint was sent")
        assert await page.evaluate(_js("#prompt") + ".value") == QUESTION
        await page.press_enter()

        await page.wait_for(
            "document.querySelector('.message.assistant[data-done=\"true\"]') !== null",
            "the streamed answer ended",
            timeout_s=120,
        )
        answer = await page.evaluate(_js(".message.assistant .text") + ".textContent")
        chunks = int(await page.evaluate(_js(".message.assistant") + ".dataset.chunks"))
        worker = await page.evaluate(_js(".message.assistant") + ".dataset.worker")

        # The turns table shows the turn with the worker that served it (it is read after the stream ends).
        row = await page.wait_for(
            "(() => { const r = document.querySelector('#turns tbody tr');"
            " return r && r.querySelector('td.worker').textContent !== '\u2014' &&"
            " Array.from(r.cells, c => c.textContent); })()",
            "the turn's row with its worker",
        )
        await page.screenshot(SCREENSHOT)
        assert page.errors == []

    # Real text, streamed in pieces, and exactly what the gateway recorded for the turn.
    assert re.search(r"[A-Za-z]{3,}", answer), answer
    assert "Paris" in answer, answer
    assert chunks > 1, f"the answer arrived in {chunks} piece(s): not streamed"
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as api:
        turns = (await api.get(f"/v1/sessions/{session_id}/turns")).json()["data"]
        assert [t["status"] for t in turns] == ["ok"]
        assert turns[0]["input_messages"][-1]["content"] == QUESTION
        assert turns[0]["output_message"]["content"] == answer
        assert turns[0]["worker"] == worker == worker_id_for(smollm2_worker.url)
        assert row[1:3] == ["ok", worker]

        # The typing hint reached the gateway: the advisor made an advisory of kind `typing` for the session.
        admin = await api.get(f"/v1/admin/sessions/{session_id}", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert admin.status_code == 200, admin.text
        kinds = [a["kind"] for a in admin.json()["advisories"]]
        assert "typing" in kinds, admin.json()["advisories"]
    assert SCREENSHOT.stat().st_size > 10_000


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
        await page.click("#prompt")
        await page.type_text("Name one colour.", delay_s=0)
        await page.press_enter()
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

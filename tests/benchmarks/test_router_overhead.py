"""The gateway-vs-Rust-gateway benchmark at tiny scale (seconds): real processes, every request answered, and a
well-formed report (the Markdown tables, the JSON figures). The `bench` extra installs both Rust gateways (smg 1.13
and sglang-router 0.3.2), so the run has a row for each, and the Python floor (a bare proxy) and the stored floor (the
same proxy recording every turn) run beside them; the stored floor's records are checked against its answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sessiongate import sessions
from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.benchmarks.processes import (
    FakeWorkerProcess,
    FloorProxyProcess,
    sglang_router_installed,
    smg_installed,
)
from sessiongate.benchmarks.router_overhead import streamed_content

pytestmark = pytest.mark.anyio

ROUNDS, PHASE_REQUESTS = 2, 6
SYSTEMS = {"direct", "sessiongate", "smg", "sglang-router", "python-floor", "stored-floor"}
MODES = {"non-streamed", "streamed"}


def _table(lines: list[str]) -> list[list[str]]:
    """A Markdown table's body rows as cells; checks the header separator and that every row has as many cells."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    assert all(set(cell) <= set("-") for cell in rows[1]), lines[1]
    assert {len(row) for row in rows} == {len(rows[0])}, lines
    return rows[2:]


@pytest.mark.skipif(
    not (smg_installed() and sglang_router_installed()),
    reason="the Rust gateways are not installed (the `bench` extra: smg==1.13.0, sglang-router==0.3.2)",
)
def test_tiny_run_answers_everything_and_reports_every_proxy(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "sessiongate.benchmarks.router_overhead", "--workers", "2", "--concurrency", "2"]
    command += ["--rounds", str(ROUNDS), "--phase-requests", str(PHASE_REQUESTS), "--warmup-requests", "2"]
    command += ["--turns-per-session", "3", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

    tables = [block.splitlines() for block in done.stdout.split("\n\n") if block.startswith("|")]
    # Per system, then sessiongate against each Rust gateway, the floors against smg, sessiongate against the floors.
    assert len(tables) == 7, done.stdout
    per_system = _table(tables[0])
    assert {(row[0], row[1]) for row in per_system} == {(s, m) for s in SYSTEMS for m in MODES}
    for row in per_system:
        assert (row[2], row[3]) == (str(ROUNDS * PHASE_REQUESTS), "0"), row
    assert tables[1][0].startswith("| sessiongate / smg "), tables[1]
    assert tables[2][0].startswith("| sessiongate / sglang-router "), tables[2]
    assert tables[3][0].startswith("| python-floor / smg "), tables[3]
    assert tables[4][0].startswith("| stored-floor / smg "), tables[4]
    assert tables[5][0].startswith("| sessiongate / python-floor "), tables[5]
    assert tables[6][0].startswith("| sessiongate / stored-floor "), tables[6]
    for table in tables[1:]:
        ratios = _table(table)
        assert {row[0] for row in ratios} == MODES
        assert all(cell.endswith("x") for row in ratios for cell in row[1:]), ratios

    figures = json.loads(out.read_text())["rows"]
    for key, row in figures.items():
        assert row["errors"] == 0, key
        assert row["requests"] == ROUNDS * PHASE_REQUESTS, key
        assert row["p50_ms"] > 0
        if row["system"] != "direct":
            assert row["cpu_us_per_request"] > 0, key
            assert row["added_p50_ms"] is not None, key


async def test_the_stored_floor_records_every_turn_with_the_answer_its_client_got(tmp_path: Path) -> None:
    """Two turns of one session, the second streamed, through the stored floor: both are in its store, ok, each
    with the new messages it brought and the answer's text the client read."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'floor.db'}"
    worker = FakeWorkerProcess(tmp_path, prefix_cache=False)
    floor = None
    try:
        worker.wait_ready()
        floor = FloorProxyProcess(tmp_path, workers=[worker.url], database_url=url)
        floor.wait_ready()
        messages: list[dict[str, str]] = [{"role": "user", "content": "first question"}]
        answers = []
        async with httpx.AsyncClient(base_url=floor.url, headers={"x-session-id": "stored-1"}) as client:
            for stream in (False, True):
                body = {"model": "fake-model", "messages": messages, "max_tokens": 6, "stream": stream}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                text = (
                    streamed_content(response.content)
                    if stream
                    else response.json()["choices"][0]["message"]["content"]
                )
                answers.append(text)
                messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    finally:
        if floor is not None:
            floor.stop()
        worker.stop()
    store = sessions.SqlSessionStore(sessions.create_engine(url))
    try:
        turns = await store.list_turns("stored-1", tenant_id="default")
    finally:
        await store.close()
    assert [t.status for t in turns] == ["ok", "ok"]
    assert [t.output_message["content"] for t in turns] == answers
    assert turns[0].input_messages == [{"role": "user", "content": "first question"}]
    assert turns[1].input_messages == [{"role": "user", "content": "next"}]  # the resent history is not stored again


async def test_fake_worker_without_prefix_cache_reports_nothing_cached() -> None:
    behaviour = FakeWorkerBehaviour(prefix_cache=False)
    transport = httpx.ASGITransport(app=create_fake_worker(behaviour))
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "the same prompt twice"}],
        "return_cached_tokens_details": True,
    }
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        for _ in range(2):
            answer = (await client.post("/v1/chat/completions", json=body)).json()
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert "sglext" not in answer  # as SGLang: no cache report without hits
    assert behaviour.device == []  # nothing remembered: the cost per request stays flat


@pytest.mark.skipif(not smg_installed(), reason="smg is not installed (the `bench` extra: smg==1.13.0)")
def test_responses_api_row_chains_every_turn(tmp_path: Path) -> None:
    """`--api responses`: the same gateway through `/v1/responses`, every request answered, and its ratio to chat."""
    out = tmp_path / "figures.json"
    command = [sys.executable, "-m", "sessiongate.benchmarks.router_overhead", "--workers", "1", "--concurrency", "2"]
    command += ["--rounds", "2", "--phase-requests", "6", "--warmup-requests", "2", "--turns-per-session", "3"]
    command += ["--no-sglang-router", "--no-floor", "--api", "responses", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| sessiongate-responses / sessiongate |" in done.stdout, done.stdout
    figures = json.loads(out.read_text())["rows"]
    for mode in MODES:
        row = figures[f"sessiongate-responses/{mode}"]
        assert row["errors"] == 0, row["error_kinds"]
        assert row["requests"] == 12
        assert row["cpu_us_per_request"] > 0

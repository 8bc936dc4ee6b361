"""Every example (and `sessiongate demo`) runs as a user runs it: a subprocess against a real gateway (a
`sessiongate serve` process on SQLite) in front of one real SGLang CPU worker serving SmolLM2-135M-Instruct.

One worker and one gateway serve the whole module; each example's output is checked for what it claims to show
(a tool's correct result, the advisory outcome of each turn, the admin operations' effects). The module's last
tests use the same worker for what issue 29 asks of the real cache: a Responses chain's second turn, an inferred
session's turn and the prefix before a prefix break are cache hits.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess
from sessiongate.up import GatewayProcess
from tests.conftest import running_worker

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ADMIN_KEY = "examples-admin-key"
OUTCOME = r"(typing|tool_result|tool_call|explicit|none) -> (used|late|wasted|missed|cancelled)"
ARITHMETIC = re.compile(r"[0-9+*/() .-]+")


@pytest.fixture(scope="module")
def worker(
    smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]
) -> Iterator[WorkerProcess]:
    config = WorkerConfig(
        model_path=smollm2_model_dir,
        state_dir=tmp_path_factory.mktemp("examples-worker"),
        port=free_port(),
        max_total_tokens=4096,
        # Session KV operations (a closed fork's drop in fork_subagents.py, the admin example's) need the extension's
        # eviction order, which priority eviction installs (sglang_ext/internals/kv_ops.py).
        priority_eviction=True,
    )
    with running_worker(config) as process:
        yield process


@pytest.fixture(scope="module")
def gateway_url(
    worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]
) -> Iterator[str]:
    state = tmp_path_factory.mktemp("examples-gateway")
    gateway = GatewayProcess(
        port=free_port(),
        workers=[worker.url],
        database_url=f"sqlite+aiosqlite:///{state / 'gateway.db'}",
        log_path=state / "gateway.log",
        defaults={"SESSIONGATE_ADMIN_KEY": ADMIN_KEY},
    )
    try:
        gateway.wait_ready(timeout_s=60)
        yield gateway.url
    finally:
        gateway.stop()


def run(args: list[str], base_url: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
    }
    done = subprocess.run(
        [sys.executable, *args, "--base-url", base_url],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def arithmetic(expression: str) -> float:
    assert ARITHMETIC.fullmatch(expression), expression
    return float(eval(expression, {"__builtins__": {}}))  # the test's own check of the example's calculator


def test_agent_loop_runs_the_tools_and_prints_each_turns_advisory(gateway_url: str) -> None:
    out = run([str(EXAMPLES / "agent_loop.py")], gateway_url)

    calc = re.search(r"tool calculator\((\{.*?\})\) -> (\{.*\})", out)
    assert calc, out
    expression = json.loads(calc.group(1))["expression"]
    assert json.loads(calc.group(2))["result"] == arithmetic(expression)

    search = re.search(r"tool search_files\((\{.*?\})\) -> (\{.*\})", out)
    assert search, out
    query = json.loads(search.group(1))["query"]
    matches = json.loads(search.group(2))["matches"]
    for match in matches:
        name, _, line = match.split(":", 2)
        assert (EXAMPLES / "notes" / name).is_file()
        assert query.lower() in line.lower()
    if query.lower() == "lisbon":
        assert any(m.startswith("lisbon-trip.md:") for m in matches)

    outcomes = re.findall(
        rf"turn (\d+): worker \S+, cached device=(\d+) host=(\d+) pool=(\d+); advisory: {OUTCOME}", out
    )
    assert len(outcomes) >= 3, out
    assert "advisory: none (first turn)" in out
    # The turn after each tool result was foreseen: by the tool call itself or by the posted result.
    after_tools = re.findall(rf"\(result posted: advisory \w+\)\n    turn \d+: .*advisory: {OUTCOME}", out)
    assert after_tools, out
    assert all(kind in ("tool_call", "tool_result") for kind, _ in after_tools)
    assert any(outcome in ("used", "late") for _, outcome in after_tools)


def test_openai_sdk_example(gateway_url: str) -> None:
    out = run([str(EXAMPLES / "openai_sdk.py")], gateway_url)
    assert "Paris" in out
    assert "(typing hint: advisory fired)" in out
    second = re.search(rf"turn 2: worker \S+, cached by tier \{{'device': (\d+), .*advisory: {OUTCOME}", out)
    assert second, out
    assert second.group(2) == "typing"


def test_agents_sdk_example(gateway_url: str) -> None:
    """The OpenAI Agents SDK over `/v1/responses`: one chain, one session, its later turns cache hits."""
    out = run([str(EXAMPLES / "agents_sdk.py")], gateway_url)
    assert re.search(r"^\[1\] '.+'", out, re.MULTILINE), out
    assert re.search(r"^\[2\] '.+'  \(streamed in [1-9]\d* deltas", out, re.MULTILINE), out
    calc = re.search(r"^\[3\] calculator -> (\{.*\})  \(response", out, re.MULTILINE)
    assert calc, out
    result = json.loads(calc.group(1))
    assert result["result"] == arithmetic(result["expression"])
    turns = re.findall(r"turn (\d+): ok on \S+, prompt tokens (\d+), cached (\d+), context_reset (\w+)", out)
    assert [t[0] for t in turns] == ["1", "2", "3"], out
    assert all(t[3] == "False" for t in turns), out  # each response extends the one before: one context
    # The second turn of the chain finds the first one's prompt in the worker's cache (whole 64-token pages).
    assert int(turns[1][2]) >= 64, out
    assert int(turns[2][2]) >= 64, out


def test_fork_subagents_example(gateway_url: str) -> None:
    """Two forks of one context: each one's first turn finds the shared prefix in the real worker's cache; closing
    the sessions drops their KV (the worker reports what it freed)."""
    out = run([str(EXAMPLES / "fork_subagents.py")], gateway_url)
    firsts = re.findall(r"first turn: worker \S+, prompt tokens (\d+), cached (\d+)", out)
    assert len(firsts) == 2, out
    for prompt, cached in firsts:
        assert int(cached) >= 64, out  # at least a whole page of the shared context
        assert int(cached) < int(prompt)
    closed = re.findall(r"closed \S+ \(closed\): dropped (\d+) tokens of KV", out)
    assert len(closed) == 3, out
    assert "could not drop" not in out, out  # every worker answered the drops
    # Each fork's close frees the fork's own pages (its turn's KV, whose last page the chat template renders back
    # otherwise than the model generated it) and keeps the context it shares with the orchestrator, whose close
    # then frees that.
    assert all(int(tokens) > 0 for tokens in closed), out
    # The worker's load report shows the pages go: what it holds cached falls.
    reports = re.findall(r"load report \S+: device KV tokens cached (\d+) -> (\d+)", out)
    assert reports, out
    assert any(int(after) < int(before) for before, after in reports), out


def test_langchain_example(gateway_url: str) -> None:
    out = run([str(EXAMPLES / "langchain_chat.py")], gateway_url)
    call = re.search(r"calculator\((.*?)\) = (\{.*?\})  \(tool result posted: advisory (\w+)\)", out)
    assert call, out
    assert json.loads(call.group(2))["result"] == arithmetic(call.group(1))
    second = re.search(rf"turn 2: .*advisory: {OUTCOME}", out)
    assert second, out
    assert second.group(1) in ("tool_call", "tool_result")


def test_admin_example(gateway_url: str) -> None:
    out = run([str(EXAMPLES / "admin_session.py")], gateway_url)
    session = re.search(r"session (\S+): 2 turns", out)
    assert session, out
    assert session.group(1) in out.split("sessions (newest first):")[1]
    assert re.search(rf"turn 2: ok on \S+, cached device=\d+ host=\d+ pool=\d+; advisory: {OUTCOME}", out), out
    retained = re.search(r"retain on \S+: (\d+) tokens", out)
    assert retained, out
    assert int(retained.group(1)) > 0
    assert re.search(r"drop on \S+: \d+ tokens removed", out), out
    assert re.search(r"drained \S+: routable False", out), out
    assert re.search(r"undrained \S+: routable True", out), out
    assert "without the admin key: 401" in out


def test_demo(gateway_url: str) -> None:
    out = run(["-m", "sessiongate.cli", "demo"], gateway_url)
    assert "(typing hint: advisory fired" in out
    rows = re.findall(r"^  (\d)\s+ok\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)", out, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4], out
    assert rows[0][5:] == ("-", "-")  # a first turn has no advisory
    assert rows[1][5] == rows[2][5] == "typing"
    assert rows[3][5] in ("tool_call", "tool_result", "explicit")
    assert all(r[6] in ("used", "late", "wasted", "missed", "cancelled") for r in rows[1:])
    assert any(int(r[2]) + int(r[3]) > 0 for r in rows[1:])  # later turns found their context cached


# Sessions without client changes on the real worker (issue 29): not examples, but about the cache, so they share
# this module's one SmolLM2 worker and gateway.

LONG_SYSTEM = (
    "You are the geography assistant of a travel planning app. The user is planning a trip through Europe and asks "
    "short questions about countries, their capitals, languages and currencies. Answer every question in one short, "
    "factual sentence, without lists, without greetings and without repeating the question."
)


def test_responses_chain_second_turn_is_cached(gateway_url: str) -> None:
    import openai

    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="", max_retries=0) as client:
        model = client.models.list().data[0].id
        first = client.responses.create(
            model=model, instructions=LONG_SYSTEM, input="What is the capital of France?", max_output_tokens=16
        )
        second = client.responses.create(
            model=model,
            instructions=LONG_SYSTEM,
            input="And of Italy?",
            previous_response_id=first.id,
            max_output_tokens=16,
        )
    assert first.output_text
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= 64  # a whole page of the chain's prompt


def test_implicit_session_and_prefix_break_on_the_real_worker(gateway_url: str) -> None:
    import httpx

    with httpx.Client(base_url=gateway_url, timeout=120) as http:

        def chat(messages: list[dict[str, str]], **headers: str) -> tuple[str, dict[str, str]]:
            answer = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 16}, headers=headers)
            assert answer.status_code == 200, answer.text
            return answer.headers["x-session-id"], answer.json()["choices"][0]["message"]

        history = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Capital of Spain?"}]
        first, reply = chat(history)
        history += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "And Portugal?"}]
        second, reply = chat(history)  # no session header: inferred from the stored context
        assert second == first
        # The client rewrites the first answer and goes on in the same (named) session: a prefix break.
        edited = [*history[:2], {"role": "assistant", "content": "Madrid, of course."}, history[3]]
        chat([*edited, {"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "France?"}],
             **{"x-session-id": first})  # fmt: skip
        for _ in range(250):  # the break is examined beside the turn: recorded a moment after its answer
            turns = http.get(f"/v1/sessions/{first}/turns").json()["data"]
            if turns[2]["prefix_break"] is not None:
                break
            time.sleep(0.02)
    assert [t["session_source"] for t in turns] == ["new", "inferred", "header"]
    assert turns[1]["usage"]["cached_tokens"] >= 64  # routed with its KV in mind: the first turn's pages hit
    found = turns[2]["prefix_break"]
    assert (found["index"], found["kind"]) == (2, "assistant_edited")
    assert turns[2]["usage"]["cached_tokens"] >= 64  # the prefix before the break is still cached

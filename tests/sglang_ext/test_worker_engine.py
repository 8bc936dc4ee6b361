"""A real SGLang 0.5.23 server (tiny random-weight model) started by the launcher, plug-in loaded.

One server serves the whole module; a second, fresh one shares its KV pool directory for the
storage-hit test. Both are stopped (SIGTERM, then SIGKILL of the process group) at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessiongate.sdk._sse import iter_events
from sessiongate.sglang_ext.hardware import has_cuda
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.models import model_dir
from sessiongate.sglang_ext.protocol import INFO_PATH, WorkerInfo

pytestmark = pytest.mark.engine

READY_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def state_dir(worker_state_dir: Path) -> Path:
    return worker_state_dir


@pytest.fixture(scope="module")
def worker(state_dir: Path, free_ports: Callable[[], int]) -> Iterator[WorkerProcess]:
    process = start_worker(WorkerConfig(state_dir=state_dir, port=free_ports()))
    try:
        process.wait_ready(READY_TIMEOUT)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=120.0) as http:
        yield http


def long_system_prompt(tag: str, facts: int = 40) -> str:
    """A system prompt several pages long (page size 64), unique per `tag` so tests do not share KV."""
    lines = (f"Fact {i}: session {tag} keeps page {i * 7} of its cache on worker {i % 3}." for i in range(facts))
    return f"[{tag}] You are a helpful assistant.\n" + "\n".join(lines)


def chat(client: httpx.Client, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 8, **options}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_plugin_info_endpoint(client: httpx.Client, worker: WorkerProcess) -> None:
    response = client.get(INFO_PATH)
    assert response.status_code == 200
    info = WorkerInfo.model_validate(response.json())
    assert info.extension == "sessiongate"
    assert info.sglang_version == "0.5.23"
    assert info.cpu_compat is not has_cuda()
    assert info.page_size == worker.config.page_size
    assert info.model_path == str(model_dir(worker.config.state_dir, "tiny"))
    assert info.served_model_name == "tiny"  # the model's name where users see it, not this machine's path
    assert [model["id"] for model in client.get("/v1/models").json()["data"]] == ["tiny"]
    assert info.hierarchical_cache is True
    assert info.storage_backend == "file"


def test_health_answers_without_a_generation(client: httpx.Client) -> None:
    # SGLang's generating health check polls for the detokenizer's answer once a second, so it never answers in
    # under a second; without the generation it answers at once (the gateway polls it every few seconds).
    for _ in range(3):
        started = time.monotonic()
        response = client.get("/health")
        assert response.status_code == 200
        assert time.monotonic() - started < 0.9


def test_extending_a_conversation_reports_cached_tokens(client: httpx.Client) -> None:
    first = [
        {"role": "system", "content": long_system_prompt("extend")},
        {"role": "user", "content": "What is on page 21?"},
    ]
    cold = chat(client, first, return_cached_tokens_details=True)
    assert cold["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert "sglext" not in cold  # SGLang reports details only when something was cached

    second = [
        *first,
        {"role": "assistant", "content": cold["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And on page 28?"},
    ]
    warm = chat(client, second, return_cached_tokens_details=True)
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached % 64 == 0  # whole pages
    assert cached <= cold["usage"]["prompt_tokens"] < warm["usage"]["prompt_tokens"]
    assert warm["sglext"]["cached_tokens_details"] == {
        "device": cached,
        "host": 0,
        "storage": 0,
        "storage_backend": "CheckedFileStore",  # the default pool: every page verified
    }


def test_streamed_response_reports_cached_tokens(client: httpx.Client) -> None:
    messages = [{"role": "system", "content": long_system_prompt("stream")}, {"role": "user", "content": "Hi"}]
    chat(client, messages)  # make it cached
    body = {
        "model": "tiny",
        "messages": messages,
        "temperature": 0,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_cached_tokens_details": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        chunks = [event.json() for event in iter_events(response.iter_lines()) if not event.done]
    details = [chunk["sglext"]["cached_tokens_details"] for chunk in chunks if "sglext" in chunk]
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert len(details) == 1
    assert len(usage) == 1
    cached = usage[0]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert details[0]["device"] == cached


def test_greedy_output_of_a_repeated_request_is_identical(client: httpx.Client) -> None:
    messages = [{"role": "system", "content": long_system_prompt("repeat")}, {"role": "user", "content": "Go on."}]
    first = chat(client, messages, max_tokens=16)
    again = chat(client, messages, max_tokens=16)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the repeat runs on cached KV
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert again["usage"]["completion_tokens"] == first["usage"]["completion_tokens"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
# Enums only: a random-weight model fills a free-form string with anything the grammar admits, and
# XGrammar admits raw control characters in JSON strings, which SGLang's JSON parser then rejects
# (the call comes back as plain content, finish_reason "stop").
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_call_is_well_formed(client: httpx.Client, tool_choice: Any) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    result = chat(client, messages, tools=[WEATHER, CLOCK], tool_choice=tool_choice, max_tokens=64)
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["id"]
    arguments = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        assert arguments["city"] in ("Paris", "Tokyo")
        assert arguments["unit"] in ("c", "f")
    else:
        assert tool_choice == "required"
        assert call["function"]["name"] == "get_time"
        assert arguments["zone"] in ("UTC", "CET", "JST")
    if isinstance(tool_choice, dict):
        assert call["function"]["name"] == "get_weather"


def test_fresh_worker_gets_a_storage_hit_from_the_shared_pool(
    client: httpx.Client, worker: WorkerProcess, state_dir: Path, free_ports: Callable[[], int]
) -> None:
    messages = [{"role": "system", "content": long_system_prompt("pool", 60)}, {"role": "user", "content": "Hi"}]
    pool = worker.config.effective_pool_dir
    pages_before = len(list(pool.iterdir()))
    served = chat(client, messages)
    assert served["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # Write-through reaches the pool directory in the background (a file per page).
    deadline = time.monotonic() + 60
    while len(list(pool.iterdir())) <= pages_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(pool.iterdir())) > pages_before

    second = start_worker(WorkerConfig(state_dir=state_dir, port=free_ports(), log_file=state_dir / "second.log"))
    try:
        second.wait_ready(READY_TIMEOUT)
        with httpx.Client(base_url=second.url, timeout=120.0) as other:
            result = chat(other, messages, return_cached_tokens_details=True)
    finally:
        second.stop()
    details = result["sglext"]["cached_tokens_details"]
    assert details["storage"] > 0
    assert details["device"] == 0
    assert details["host"] == 0
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == details["storage"]
    # Same KV, same greedy output, whichever worker computed it.
    assert result["choices"][0]["message"]["content"] == served["choices"][0]["message"]["content"]

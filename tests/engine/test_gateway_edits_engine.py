"""What the gateway sends a real SGLang worker (CPU, tiny model), read from the worker's own request log.

One worker for the module, started with priority eviction (SGLang's `--enable-priority-scheduling`, so a
request's `priority` ranks its KV) and with SGLang's request log on (`--log-requests --log-requests-level 3`,
JSON lines): the log records each request as the worker's tokenizer manager received it (`GenerateReqInput`:
its token ids after the chat template, its `priority`, `rid` and `cache_salt`). The gateway runs in-process in
front of it (real ASGI app, real SQLite store, real HTTP transport).

- The admin API's KV operations reach the session's real pages: they carry the tenant's cache salt.
- The session's priority reaches the worker with each turn.
- The gateway never changes a prompt's prefix: whatever it edits (cache salt, priority, no-keep rid, tools),
  turn N+1's token ids start with turn N's.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from sessiongate.demo import WEATHER_TOOL
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sdk._sse import parse_events
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.protocol import KEEP_HEADER, NO_KEEP_RID_PREFIX

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

ADMIN = {"authorization": "Bearer admin-secret"}
SYSTEM = "You are a planner. " + " ".join(f"Step {i}: be brief and precise about item {i}." for i in range(40))
BASE = {"model": "tiny", "max_tokens": 6, "temperature": 0}


class LoggedWorker:
    def __init__(self, process: WorkerProcess, log_dir: Path) -> None:
        self.process, self.log_dir = process, log_dir

    def received(self) -> list[dict[str, Any]]:
        """Every generation request the worker received, oldest first (SGLang's `request.received` records)."""
        records = []
        for path in sorted(self.log_dir.glob("*.log*")):
            for line in path.read_text().splitlines():
                start = line.find("{")
                if start < 0:
                    continue
                record = orjson.loads(line[start:])
                if record.get("event") == "request.received":
                    records.append(record["obj"])
        return records


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, free_port: Callable[[], int]) -> Iterator[LoggedWorker]:
    log_dir = tmp_path_factory.mktemp("requests")
    config = WorkerConfig(
        state_dir=tmp_path_factory.mktemp("engine"),
        port=free_port(),
        priority_eviction=True,
        extra_args=(
            "--log-requests",
            "--log-requests-level",
            "3",
            "--log-requests-format",
            "json",
            "--log-requests-target",
            str(log_dir),
        ),
    )
    process = start_worker(config)
    try:
        process.wait_ready(300)
        yield LoggedWorker(process, log_dir)
    finally:
        process.stop()


@pytest.fixture
async def gateway(
    worker: LoggedWorker, tmp_path: Path, open_gateway: Callable[..., Any]
) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        allow_unauthenticated=True,
        admin_key="admin-secret",
        workers=(worker.process.url,),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        cache_salt_secret="engine-test-secret",
    )
    async with open_gateway(create_app(settings)) as client:
        yield client


async def _turn(
    client: httpx.AsyncClient,
    session: str,
    messages: list[dict[str, Any]],
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    answer = await client.post(
        "/v1/chat/completions",
        json={**BASE, "messages": messages, **extra},
        headers={"X-Session-Id": session, **(headers or {})},
    )
    assert answer.status_code == 200, answer.text
    if extra.get("stream"):
        assert parse_events(answer.text)[-1].done
        return {}
    body: dict[str, Any] = answer.json()
    return body


async def _received_since(worker: LoggedWorker, before: int, count: int) -> list[dict[str, Any]]:
    """The `count` requests logged after the first `before` (the log is written as requests arrive)."""
    with anyio.fail_after(10):
        while len(records := worker.received()) < before + count:  # noqa: ASYNC110 (a file, not an event)
            await anyio.sleep(0.05)
    return records[before : before + count]


def _prompt(record: dict[str, Any]) -> list[int] | str:
    ids = record.get("input_ids")
    if isinstance(ids, list) and ids:
        return ids
    text: str = record["text"]
    return text


async def test_admin_retain_and_drop_reach_the_sessions_pages(gateway: httpx.AsyncClient) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Plan a garden."}]
    first = await _turn(gateway, "admin-kv", messages)
    assert first["usage"]["prompt_tokens"] > 128

    retained = await gateway.post("/v1/admin/sessions/admin-kv/kv/retain", json={"ttl_ms": 60_000}, headers=ADMIN)
    assert retained.status_code == 200, retained.text
    (held,) = retained.json()["workers"]
    assert "error" not in held, held
    assert held["device_tokens"] + held["host_tokens"] + held["storage_tokens"] > 0  # the pages the turn left

    dropped = await gateway.post("/v1/admin/sessions/admin-kv/kv/drop", headers=ADMIN)
    (freed,) = dropped.json()["workers"]
    assert "error" not in freed, freed
    assert freed["device_tokens"] + freed["host_tokens"] + freed["storage_tokens"] > 0

    messages += [first["choices"][0]["message"], {"role": "user", "content": "And the pond?"}]
    second = await _turn(gateway, "admin-kv", messages, return_cached_tokens_details=True)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a miss: the pages are gone


async def test_the_sessions_priority_reaches_the_worker(gateway: httpx.AsyncClient, worker: LoggedWorker) -> None:
    created = await gateway.post("/v1/sessions", json={"session_id": "ranked", "priority": 7})
    assert created.status_code == 201, created.text
    before = len(worker.received())
    messages = [{"role": "user", "content": "Rank me."}]
    await _turn(gateway, "ranked", messages)
    await _turn(gateway, "plain", messages, stream=True)
    ranked, plain = await _received_since(worker, before, 2)
    assert ranked["priority"] == 7
    assert plain["priority"] == 0  # sent, so the worker's default (1) does not apply to a session's turns


async def test_no_gateway_edit_changes_a_prompts_prefix(gateway: httpx.AsyncClient, worker: LoggedWorker) -> None:
    """Turn N+1's token ids (as the worker's tokenizer produced them) start with turn N's, for a session whose
    turns exercise every request edit the gateway makes: the cache salt and the priority (every turn), a
    no-keep turn (the gateway's rid), a raised priority, and tools (every turn names them; the history holds a
    call and its result). A real worker, because only its chat template and tokenizer say what the token ids
    are; the fake worker's whitespace tokens would prove nothing about them."""
    await gateway.post("/v1/sessions", json={"session_id": "prefix", "priority": 3})
    before = len(worker.received())
    tools = {"tools": [WEATHER_TOOL]}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Lisbon?"},
    ]
    await _turn(gateway, "prefix", messages, **tools)
    # The history the client sends on: a call of the tool (written here: the tiny model's random weights need
    # not produce one) and its result.
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
    ]
    second = await _turn(gateway, "prefix", messages, headers={KEEP_HEADER: "false"}, **tools)
    await gateway.patch("/v1/sessions/prefix", json={"priority": 9})
    messages += [second["choices"][0]["message"], {"role": "user", "content": "And tomorrow?"}]
    third = await _turn(gateway, "prefix", messages, **tools)
    messages += [third["choices"][0]["message"], {"role": "user", "content": "Thanks."}]
    await _turn(gateway, "prefix", messages, **tools)

    records = await _received_since(worker, before, 4)
    assert [r["priority"] for r in records] == [3, 3, 9, 9]
    assert str(records[1]["rid"]).startswith(NO_KEEP_RID_PREFIX)
    assert len({r["cache_salt"] for r in records}) == 1
    prompts = [_prompt(r) for r in records]
    for earlier, later in itertools.pairwise(prompts):
        assert len(later) > len(earlier)
        assert later[: len(earlier)] == earlier

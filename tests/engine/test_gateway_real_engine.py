"""A session of several turns through the gateway to a real SGLang CPU worker (tiny model).

The gateway runs in-process (its real ASGI app, real SQLite store, real HTTP transport) in front of one real
SGLang 0.5.23 server started by the launcher with the sessiongate extension. The test reads back what the
store recorded, as a user of the session API would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sessiongate.demo import WEATHER_TOOL
from sessiongate.gateway.app import create_app
from sessiongate.gateway.settings import GatewaySettings
from sessiongate.sdk._sse import parse_events
from sessiongate.sglang_ext.launcher import WorkerProcess

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

SYSTEM = "You are a travel assistant. " + " ".join(
    f"Rule {i}: answer briefly and cite the city guide page {i}." for i in range(30)
)


@pytest.fixture
async def gateway(
    engine_worker: WorkerProcess, tmp_path: Path, open_gateway: Callable[..., Any]
) -> AsyncIterator[httpx.AsyncClient]:
    settings = GatewaySettings(
        allow_unauthenticated=True,
        workers=(engine_worker.url,),
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
    )
    app = create_app(settings)
    async with open_gateway(app) as client:
        yield client


def _events(text: str) -> list[dict[str, Any]]:
    events = parse_events(text)
    assert events[-1].done
    return [event.json() for event in events[:-1]]


async def test_multi_turn_session_with_a_tool_call(gateway: httpx.AsyncClient) -> None:
    headers = {"X-Session-Id": "engine-session"}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Three days in Lisbon: what first?"},
    ]
    base = {"model": "tiny", "max_tokens": 8, "temperature": 0}

    # Turn 1, not streamed.
    first = await gateway.post("/v1/chat/completions", json={**base, "messages": messages}, headers=headers)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "chat.completion"
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["prompt_tokens"] > 64
    messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

    # Turn 2, streamed, extending turn 1: its prefix comes from the worker's cache.
    messages.append({"role": "user", "content": "And what should I eat?"})
    second = await gateway.post(
        "/v1/chat/completions",
        headers=headers,
        json={**base, "messages": messages, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert second.status_code == 200
    chunks = _events(second.text)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    details = usage["prompt_tokens_details"]["cached_tokens_details"]
    assert (
        details["device"] + details["host"] + details.get("storage", 0)
        == usage["prompt_tokens_details"]["cached_tokens"]
    )
    messages.append({"role": "assistant", "content": content})

    # Turn 3 asks for the weather tool (forced: the tiny model's weights are random).
    messages.append({"role": "user", "content": "Weather in Lisbon?"})
    third = await gateway.post(
        "/v1/chat/completions",
        headers=headers,
        json={
            **base,
            "max_tokens": 64,
            "messages": messages,
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    )
    assert third.status_code == 200, third.text
    message = third.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"])["city"] in {"Lisbon", "Porto"}
    messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]})

    # Turn 4 returns the tool's result.
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "sunny", "celsius": 24}'})
    fourth = await gateway.post(
        "/v1/chat/completions", headers=headers, json={**base, "messages": messages, "tools": [WEATHER_TOOL]}
    )
    assert fourth.status_code == 200, fourth.text

    turns = (await gateway.get("/v1/sessions/engine-session/turns")).json()["data"]
    assert [t["status"] for t in turns] == ["ok", "ok", "ok", "ok"]
    assert [len(t["input_messages"]) for t in turns] == [2, 1, 1, 1]
    assert turns[1]["usage"]["cached_tokens"] > 0
    assert turns[1]["usage"]["cached_tokens_details"]["device"] > 0
    for turn in turns:
        timings = turn["timings"]
        assert timings["received_at"] <= timings["dispatched_at"] <= timings["ended_at"]
        assert turn["worker"]
        assert turn["usage"]["prompt_tokens"] > 0
    assert turns[1]["timings"]["first_token_at"] is not None
    (recorded,) = turns[2]["tool_calls"]
    assert recorded["id"] == call["id"]
    assert recorded["name"] == "get_weather"
    assert recorded["result"] == '{"sky": "sunny", "celsius": 24}'
    assert recorded["duration_ms"] >= 0
    context = (await gateway.get("/v1/sessions/engine-session/messages")).json()["data"]
    assert len(context) == len(messages) + 1  # everything sent, plus the last answer

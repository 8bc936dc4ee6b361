"""Chat completions through the gateway: answers, sessions, recording, streaming, tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sessiongate.sdk._sse import parse_events

from .conftest import Gateway

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "what is the capital of France"}


def _sse_events(text: str) -> list[str]:
    return [event.data for event in parse_events(text)]


async def test_non_streamed_turn_is_answered_and_recorded(gateway: Gateway) -> None:
    response = await gateway.client.post(
        "/v1/chat/completions", json={"model": "fake-model", "messages": [USER]}, headers={"X-Session-Id": "s-1"}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"].startswith("echo: what is")
    assert response.headers["x-session-id"] == "s-1"
    assert response.headers["x-sessiongate-worker"] in set(gateway.ids.values())
    assert body["sessiongate"]["turn_id"] == response.headers["x-sessiongate-turn-id"]
    assert "sglext" not in body  # only when the client asked SGLang for it

    turns = (await gateway.client.get("/v1/sessions/s-1/turns")).json()["data"]
    assert len(turns) == 1
    turn = turns[0]
    assert turn["status"] == "ok"
    assert turn["input_messages"] == [USER]
    assert turn["output_message"]["content"] == body["choices"][0]["message"]["content"]
    assert turn["worker"] == response.headers["x-sessiongate-worker"]
    assert turn["usage"]["prompt_tokens"] == body["usage"]["prompt_tokens"]
    timings = turn["timings"]
    assert timings["received_at"] <= timings["dispatched_at"] <= timings["ended_at"]


async def test_second_turn_records_only_new_messages_and_cached_tokens(make_gateway: Callable[..., Any]) -> None:
    async with make_gateway(routing_policy="round_robin") as gateway:
        await _second_turn_from_the_pool(gateway)


async def _second_turn_from_the_pool(gateway: Gateway) -> None:
    first = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": "s-2"}
    )
    reply = first.json()["choices"][0]["message"]
    follow_up = {"role": "user", "content": "and of Italy"}
    second = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER, reply, follow_up]}, headers={"X-Session-Id": "s-2"}
    )
    assert second.status_code == 200
    usage = second.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    # Round robin sent turn 2 to the other worker: its prefix came from the shared pool, not its device.
    details = usage["prompt_tokens_details"]["cached_tokens_details"]
    assert first.headers["x-sessiongate-worker"] != second.headers["x-sessiongate-worker"]
    assert details["storage"] == cached

    turns = (await gateway.client.get("/v1/sessions/s-2/turns")).json()["data"]
    assert [t["seq"] for t in turns] == [1, 2]
    assert turns[1]["input_messages"] == [follow_up]
    assert turns[1]["usage"]["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert turns[1]["usage"]["cached_tokens_details"]["storage"] == cached
    context = (await gateway.client.get("/v1/sessions/s-2/messages")).json()["data"]
    assert [m["role"] for m in context] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize(
    ("headers", "body_extra"),
    [
        ({"X-Session-Id": "via-header"}, {}),
        ({"x-session-affinity": "via-header"}, {}),
        ({"X-SMG-Routing-Key": "via-header"}, {}),
        ({}, {"session_id": "via-header"}),
    ],
)
async def test_session_id_sources(gateway: Gateway, headers: dict[str, str], body_extra: dict[str, str]) -> None:
    response = await gateway.client.post(
        "/v1/chat/completions", json={"messages": [USER], **body_extra}, headers=headers
    )
    assert response.status_code == 200
    assert response.headers["x-session-id"] == "via-header"
    # The gateway's own field never reaches the worker.
    sent = [r for w in gateway.workers.values() for r in w.requests]
    assert all("session_id" not in r for r in sent)


async def test_request_without_session_gets_a_new_one(gateway: Gateway) -> None:
    response = await gateway.client.post("/v1/chat/completions", json={"messages": [USER]})
    session_id = response.headers["x-session-id"]
    assert session_id.startswith("sess_")
    assert (await gateway.client.get(f"/v1/sessions/{session_id}")).json()["turn_count"] == 1


async def test_streamed_turn_relays_sse_and_records_the_assembled_answer(gateway: Gateway) -> None:
    async with gateway.client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [USER], "stream": True},
        headers={"X-Session-Id": "s-stream"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = (await response.aread()).decode()
    events = _sse_events(text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    # The client did not ask for usage nor for SGLang's extension: neither is relayed.
    assert all(c["choices"] for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content.startswith("echo: what is")

    turn = (await gateway.client.get("/v1/sessions/s-stream/turns")).json()["data"][0]
    assert turn["status"] == "ok"
    assert turn["output_message"]["content"] == content
    assert turn["finish_reason"] == "stop"
    assert turn["usage"]["prompt_tokens"] > 0  # recorded even though the client did not ask for usage
    assert turn["timings"]["first_token_at"] is not None


async def test_streamed_words_that_name_the_chunks_the_relay_reads_are_relayed_and_recorded(gateway: Gateway) -> None:
    """The relay reads at once only the chunks that may be a usage, cache report or error chunk, by their keys'
    names; generated text holding those names (as whole values, or quoted) is still relayed and recorded whole."""
    words = 'usage error sglext "usage" {"error": x} [DONE] data: done'
    async with gateway.client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": words}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        headers={"X-Session-Id": "s-names"},
    ) as response:
        text = (await response.aread()).decode()
    events = _sse_events(text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "echo: " + words
    assert chunks[-1]["usage"]["completion_tokens"] > 0  # the usage chunk, annotated
    assert chunks[-1]["sessiongate"]["session_id"] == "s-names"
    turn = (await gateway.client.get("/v1/sessions/s-names/turns")).json()["data"][0]
    assert (turn["status"], turn["output_message"]["content"]) == ("ok", content)


async def test_stream_with_include_usage_carries_cache_report_and_annotation(gateway: Gateway) -> None:
    async def usage_chunk() -> dict[str, Any]:
        response = await gateway.client.post(
            "/v1/chat/completions",
            json={"messages": [USER], "stream": True, "stream_options": {"include_usage": True}},
            headers={"X-Session-Id": "s-usage"},
        )
        last: dict[str, Any] = orjson.loads(_sse_events(response.text)[-2])
        return last

    cold = await usage_chunk()
    assert cold["choices"] == []
    assert cold["usage"]["prompt_tokens"] > 0
    # As from SGLang, a prompt without hits has no cache report; the usage chunk still comes, annotated.
    assert "cached_tokens_details" not in cold["usage"]["prompt_tokens_details"]
    assert cold["sessiongate"]["session_id"] == "s-usage"
    warm = await usage_chunk()
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens_details"]["device"] > 0


async def test_tool_call_and_tool_result_are_recorded_with_duration(gateway: Gateway) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    first = await gateway.client.post(
        "/v1/chat/completions",
        json={"messages": [USER], "tools": tools, "tool_choice": "required"},
        headers={"X-Session-Id": "s-tools"},
    )
    message = first.json()["choices"][0]["message"]
    call = message["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"

    result = {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}
    second = await gateway.client.post(
        "/v1/chat/completions",
        json={"messages": [USER, message, result], "tools": tools},
        headers={"X-Session-Id": "s-tools"},
    )
    assert second.status_code == 200

    turns = (await gateway.client.get("/v1/sessions/s-tools/turns")).json()["data"]
    recorded = turns[0]["tool_calls"]
    assert [c["id"] for c in recorded] == [call["id"]]
    assert recorded[0]["name"] == "get_weather"
    assert recorded[0]["result"] == "sunny"
    assert recorded[0]["duration_ms"] is not None
    assert recorded[0]["duration_ms"] >= 0
    assert turns[1]["input_messages"] == [result]


async def test_streamed_tool_call_fragments_are_assembled(gateway: Gateway) -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    await gateway.client.post(
        "/v1/chat/completions",
        json={"messages": [USER], "tools": tools, "tool_choice": "required", "stream": True},
        headers={"X-Session-Id": "s-stream-tools"},
    )
    turn = (await gateway.client.get("/v1/sessions/s-stream-tools/turns")).json()["data"][0]
    call = turn["output_message"]["tool_calls"][0]
    assert call["function"] == {"name": "search", "arguments": '{"q":"x"}'}
    assert turn["tool_calls"][0]["arguments"] == '{"q":"x"}'


async def test_sequential_turns_spread_over_idle_workers(gateway: Gateway) -> None:
    seen = set()
    for i in range(4):
        response = await gateway.client.post(
            "/v1/chat/completions", json={"messages": [USER]}, headers={"X-Session-Id": f"spread-{i}"}
        )
        seen.add(response.headers["x-sessiongate-worker"])
    assert seen == set(gateway.ids.values())

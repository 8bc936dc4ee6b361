"""Streamed chat, sync and async: chunks, assembly, history, mid-stream failures (never retried)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
import pytest

from sessiongate import sdk
from sessiongate.sdk import AsyncSessionGate, SessionGate
from sessiongate.sdk._streaming import ServerSentEvent, SSEDecoder

if TYPE_CHECKING:
    from .conftest import FakeGateway

HI = [{"role": "user", "content": "hi"}]
CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "search", "arguments": '{"query": "kv"}'},
    },
    {"id": "call_b", "type": "function", "function": {"name": "clock", "arguments": '{"tz": "UTC"}'}},
]


def test_stream_yields_chunks_and_assembles_the_completion(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    with session.chat(HI, stream=True) as stream:
        with pytest.raises(RuntimeError, match="not finished"):
            _ = stream.completion
        chunks = list(stream)

    assert chunks[0].delta.role == "assistant"
    assert "".join(chunk.content for chunk in chunks) == gateway.default_reply
    assert chunks[-1].choices == ()
    assert chunks[-1].usage is not None
    assert chunks[-1].session_id == session.id

    completion = stream.completion
    assert completion.content == gateway.default_reply
    assert completion.finish_reason == "stop"
    assert (completion.session_id, completion.worker) == (session.id, "worker-1")
    assert completion.turn_id is not None
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.cached_tokens) == (10, 8)
    assert completion.usage.cached_tokens_details == {"device": 4, "host": 3, "storage": 1}
    assert stream.request_id == f"req_{completion.turn_id}"

    (body,) = gateway.bodies()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    (request,) = gateway.calls()
    assert request.headers["accept"] == "text/event-stream"
    assert request.headers["x-session-id"] == session.id
    assert request.headers["idempotency-key"]
    assert session.messages == [*HI, {"role": "assistant", "content": gateway.default_reply}]


def test_tool_call_fragments_are_merged_by_index(client: SessionGate, gateway: FakeGateway) -> None:
    gateway.reply_content, gateway.reply_tool_calls = None, CALLS
    session = client.sessions.create()
    stream = session.chat([{"role": "user", "content": "search and tell the time"}], stream=True)
    completion = stream.get_final_completion()

    assert completion.finish_reason == "tool_calls"
    assert completion.message is not None
    assert [call.to_dict() for call in completion.message.tool_calls] == CALLS
    assert [json.loads(call.function.arguments) for call in completion.message.tool_calls] == [
        {"query": "kv"},
        {"tz": "UTC"},
    ]
    assert session.messages[-1] == {"role": "assistant", "content": None, "tool_calls": CALLS}


def test_error_event_raises_api_error_and_keeps_history(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    gateway.stream_failure = "error_event"
    seen: list[sdk.ChatCompletionChunk] = []
    with pytest.raises(sdk.APIError) as info, session.chat(HI, stream=True) as stream:
        seen.extend(stream)
    error = info.value
    assert not isinstance(error, sdk.APIStatusError)
    assert error.message == "worker crashed"
    assert error.type == "server_error"
    assert error.request_id is not None
    assert len(seen) == 2
    assert session.messages == []


def test_stream_cut_off_mid_way_is_not_retried(client: SessionGate, gateway: FakeGateway, sleeps: list[float]) -> None:
    session = client.sessions.create()
    gateway.stream_failure = "read_error"
    stream = session.chat(HI, stream=True)
    with pytest.raises(sdk.APIConnectionError):
        list(stream)
    assert len(gateway.calls()) == 1
    assert sleeps == []
    assert session.messages == []


def test_stream_without_done_is_an_error(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    gateway.stream_failure = "truncate"
    with pytest.raises(sdk.APIConnectionError, match=r"\[DONE\]"):
        session.chat(HI, stream=True).get_final_completion()
    assert session.messages == []


def test_error_before_the_stream_starts_is_retried(
    client: SessionGate, gateway: FakeGateway, sleeps: list[float]
) -> None:
    session = client.sessions.create()
    gateway.script(gateway.error_response(503, "warming up"))
    completion = session.chat(HI, stream=True).get_final_completion()
    assert completion.content == gateway.default_reply
    calls = gateway.calls()
    assert len(calls) == 2
    assert calls[0].headers["idempotency-key"] == calls[1].headers["idempotency-key"]
    assert len(sleeps) == 1


def test_a_stream_left_early_adds_nothing_to_history(client: SessionGate) -> None:
    session = client.sessions.create()
    with session.chat(HI, stream=True) as stream:
        first = next(stream)
    assert first.delta.role == "assistant"
    assert stream.response.is_closed
    assert session.messages == []


def test_thin_create_streams_without_history(client: SessionGate, gateway: FakeGateway) -> None:
    with client.chat.completions.create(messages=HI, stream=True, session_id="sess_x") as stream:
        text = "".join(chunk.content for chunk in stream)
    assert text == gateway.default_reply
    assert stream.completion.session_id == "sess_x"


def test_sse_decoder_follows_the_event_stream_rules() -> None:
    decoder = SSEDecoder()
    lines = [": keep-alive", "event: message", "data: {", 'data:  "a": 1}', "", "", "data: [DONE]"]
    events = [event for line in lines if (event := decoder.decode(line)) is not None]
    assert events == [ServerSentEvent(event="message", data='{\n "a": 1}')]
    assert decoder.flush() == ServerSentEvent(event=None, data="[DONE]")
    assert decoder.flush() is None


@pytest.mark.anyio
async def test_async_stream_assembles_and_keeps_history(aclient: AsyncSessionGate, gateway: FakeGateway) -> None:
    gateway.reply_tool_calls = CALLS
    session = await aclient.sessions.create()
    async with await session.chat(HI, stream=True) as stream:
        chunks = [chunk async for chunk in stream]
    assert "".join(chunk.content for chunk in chunks) == gateway.default_reply
    completion = stream.completion
    assert completion.message is not None
    assert [call.to_dict() for call in completion.message.tool_calls] == CALLS
    assert completion.usage is not None
    assert completion.usage.total_tokens == 15
    assert session.messages == [
        *HI,
        {"role": "assistant", "content": gateway.default_reply, "tool_calls": CALLS},
    ]


@pytest.mark.anyio
async def test_async_stream_failures(aclient: AsyncSessionGate, gateway: FakeGateway, sleeps: list[float]) -> None:
    session = await aclient.sessions.create()
    gateway.stream_failure = "error_event"
    stream = await session.chat(HI, stream=True)
    with pytest.raises(sdk.APIError, match="worker crashed"):
        await stream.get_final_completion()

    gateway.stream_failure = "read_error"
    stream = await session.chat(HI, stream=True)
    with pytest.raises(sdk.APIConnectionError):
        async for _ in stream:
            pass
    assert len(gateway.calls()) == 2
    assert sleeps == []
    assert session.messages == []


def test_malformed_chunk_raises_validation_error(client: SessionGate, gateway: FakeGateway) -> None:
    body = b'data: {"id": "x", "choices": [{"index": 0, "delta": "oops"}]}\n\ndata: [DONE]\n\n'
    gateway.script(httpx.Response(200, content=body, headers={"content-type": "text/event-stream"}))
    stream = client.chat.completions.create(messages=HI, stream=True)
    with pytest.raises(sdk.APIResponseValidationError), stream:
        list(stream)

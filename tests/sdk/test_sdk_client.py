"""The sync client against the fake gateway: settings, sessions, chat with history, headers, errors."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from sessiongate import sdk
from sessiongate.sdk import SessionGate

if TYPE_CHECKING:
    from .conftest import FakeGateway

HI = [{"role": "user", "content": "hi"}]


def test_settings_come_from_kwargs_then_env_then_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SESSIONGATE_BASE_URL", raising=False)
    monkeypatch.delenv("SESSIONGATE_API_KEY", raising=False)
    with SessionGate() as default:
        assert (default.base_url, default.api_key) == ("http://127.0.0.1:8000", None)
        assert "Authorization" not in default.default_headers

    monkeypatch.setenv("SESSIONGATE_BASE_URL", "http://env.test:9000/")
    monkeypatch.setenv("SESSIONGATE_API_KEY", "env-key")
    with SessionGate() as from_env:
        assert (from_env.base_url, from_env.api_key) == ("http://env.test:9000", "env-key")
    with SessionGate(base_url="http://kwarg.test", api_key="kwarg-key") as from_kwargs:
        assert (from_kwargs.base_url, from_kwargs.api_key) == ("http://kwarg.test", "kwarg-key")
        assert from_kwargs.default_headers["Authorization"] == "Bearer kwarg-key"


def test_api_key_from_env_is_sent_as_bearer(monkeypatch: pytest.MonkeyPatch, gateway: FakeGateway) -> None:
    monkeypatch.setenv("SESSIONGATE_API_KEY", "sk-env")
    gateway.api_key = "sk-env"
    with SessionGate(
        base_url=gateway.base_url, transport=gateway.transport(), default_headers={"X-Team": "a"}
    ) as client:
        client.sessions.create()
    assert gateway.requests[0].headers["authorization"] == "Bearer sk-env"
    assert gateway.requests[0].headers["x-team"] == "a"
    assert gateway.requests[0].headers["user-agent"].startswith("sessiongate-python/")


def test_session_lifecycle(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create(session_id="sess_a", priority=3, metadata={"app": "test"})
    assert gateway.bodies("/v1/sessions") == [{"session_id": "sess_a", "priority": 3, "metadata": {"app": "test"}}]
    assert session.id == "sess_a"
    assert (session.info.priority, session.info.metadata, session.info.state) == (
        3,
        {"app": "test"},
        "active",
    )
    assert isinstance(session.info.created_at, datetime)
    assert session.info.created_at.tzinfo is not None
    assert session.messages == []

    client.sessions.create(session_id="sess_b")
    client.sessions.create(session_id="sess_c")
    first = client.sessions.list(limit=2)
    assert [s.id for s in first.data] == ["sess_a", "sess_b"]
    assert first.has_more
    assert first.next_after == "sess_b"
    second = client.sessions.list(limit=2, after=first.next_after)
    assert [s.id for s in second.data] == ["sess_c"]
    assert not second.has_more
    assert second.next_after is None

    deleted = client.sessions.delete("sess_b")
    assert (deleted.id, deleted.deleted) == ("sess_b", True)
    with pytest.raises(sdk.NotFoundError):
        client.sessions.get("sess_b")


def test_chat_keeps_history_and_sends_session_headers(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    reply = session.chat(HI, model="tiny-model", temperature=0.0, max_tokens=16, seed=7)

    assert reply.content == gateway.default_reply
    assert reply.finish_reason == "stop"
    assert (reply.session_id, reply.worker) == (session.id, "worker-1")
    assert reply.turn_id is not None
    assert reply.turn_id.startswith("turn_")
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (10, 5, 15)
    assert reply.usage.cached_tokens == 8
    assert reply.usage.cached_tokens_details == {"device": 4, "host": 3, "storage": 1}
    assert session.messages == [*HI, {"role": "assistant", "content": gateway.default_reply}]

    session.chat([{"role": "user", "content": "and again"}])
    first, second = gateway.bodies()
    assert first == {"messages": HI, "model": "tiny-model", "temperature": 0.0, "max_tokens": 16, "seed": 7}
    assert second["messages"] == [
        *HI,
        {"role": "assistant", "content": gateway.default_reply},
        {"role": "user", "content": "and again"},
    ]
    assert "stream" not in second
    for request in gateway.calls():
        assert request.headers["x-session-id"] == session.id
        assert request.headers["idempotency-key"]
    keys = {r.headers["idempotency-key"] for r in gateway.calls()}
    assert len(keys) == 2
    assert len(session.messages) == 4


def test_failed_turn_leaves_history_unchanged(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    session.chat(HI)
    before = list(session.messages)

    gateway.script(gateway.error_response(400, "context too long"))
    with pytest.raises(sdk.BadRequestError):
        session.chat([{"role": "user", "content": "next"}])
    assert session.messages == before

    session.chat([{"role": "user", "content": "next"}])
    assert gateway.bodies()[-1]["messages"] == [*before, {"role": "user", "content": "next"}]
    assert session.messages[-2:] == [
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": gateway.default_reply},
    ]


def test_tool_call_reply_goes_into_history(client: SessionGate, gateway: FakeGateway) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    gateway.reply_content, gateway.reply_tool_calls = None, [call]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    session = client.sessions.create()

    reply = session.chat([{"role": "user", "content": "weather?"}], tools=tools, tool_choice="auto")

    assert reply.content == ""
    assert reply.finish_reason == "tool_calls"
    assert reply.message is not None
    (tool_call,) = reply.message.tool_calls
    assert (tool_call.id, tool_call.function.name, json.loads(tool_call.function.arguments)) == (
        "call_1",
        "get_weather",
        {"city": "Oslo"},
    )
    assert session.messages[-1] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert gateway.bodies()[0]["tools"] == tools
    assert gateway.bodies()[0]["tool_choice"] == "auto"


def test_get_loads_context_and_turns_are_typed(client: SessionGate, gateway: FakeGateway) -> None:
    session = client.sessions.create()
    session.chat(HI)

    again = client.sessions.get(session.id)
    assert again.messages == session.messages
    assert again.info.turn_count == 1

    (turn,) = again.turns()
    assert (turn.seq, turn.status, turn.session_id) == (1, "completed", session.id)
    assert turn.input_messages == tuple(HI)
    assert turn.output_message == {"role": "assistant", "content": gateway.default_reply}
    assert turn.usage is not None
    assert turn.usage.cached_tokens_details == {
        "device": 4,
        "host": 3,
        "storage": 1,
    }
    assert turn.timings.ttft_ms is not None
    assert turn.timings.ttft_ms >= 0


def test_thin_chat_completions_create_keeps_no_history(client: SessionGate, gateway: FakeGateway) -> None:
    reply = client.chat.completions.create(messages=HI, session_id="sess_thin")
    assert reply.content == gateway.default_reply
    assert reply.session_id == "sess_thin"
    assert gateway.calls()[0].headers["x-session-id"] == "sess_thin"

    anonymous = client.chat.completions.create(messages=HI)
    assert anonymous.session_id is None
    assert "x-session-id" not in gateway.calls()[1].headers


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, sdk.BadRequestError),
        (401, sdk.AuthenticationError),
        (403, sdk.PermissionDeniedError),
        (404, sdk.NotFoundError),
        (413, sdk.RequestTooLargeError),
        (422, sdk.UnprocessableEntityError),
        (418, sdk.APIStatusError),
    ],
)
def test_error_statuses_map_to_classes(
    client: SessionGate, gateway: FakeGateway, status: int, error_class: type[sdk.APIStatusError]
) -> None:
    gateway.script(gateway.error_response(status, "nope"))
    with pytest.raises(error_class) as info:
        client.sessions.list()
    error = info.value
    assert type(error) is error_class
    assert isinstance(error, sdk.APIError)
    assert isinstance(error, sdk.SessionGateError)
    assert error.status_code == status
    assert error.request_id == f"req_err_{status}"
    assert error.body == {
        "message": "nope",
        "type": "invalid_request_error",
        "param": None,
        "code": f"http_{status}",
    }
    assert (error.code, error.type, error.param) == (f"http_{status}", "invalid_request_error", None)
    assert "nope" in str(error)
    assert len(gateway.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (409, sdk.ConflictError),
        (429, sdk.RateLimitError),
        (500, sdk.InternalServerError),
        (503, sdk.InternalServerError),
    ],
)
def test_retryable_statuses_map_to_classes_after_retries(
    client: SessionGate, gateway: FakeGateway, status: int, error_class: type[sdk.APIStatusError]
) -> None:
    gateway.script(*[gateway.error_response(status, "busy") for _ in range(3)])
    with pytest.raises(error_class) as info:
        client.sessions.list()
    assert info.value.status_code == status
    assert len(gateway.requests) == 3  # the first try and max_retries=2 retries


def test_non_json_error_body_and_invalid_success_body(client: SessionGate, gateway: FakeGateway) -> None:
    gateway.script(httpx.Response(502, text="Bad Gateway", headers={"x-should-retry": "false"}))
    with pytest.raises(sdk.InternalServerError) as info:
        client.sessions.list()
    assert info.value.body == "Bad Gateway"

    gateway.script(httpx.Response(200, text="<html>"), httpx.Response(200, json={"object": "list"}))
    with pytest.raises(sdk.APIResponseValidationError):
        client.sessions.list()
    with pytest.raises(sdk.APIResponseValidationError):
        client.sessions.list()


def test_unknown_session_id_is_quoted_in_the_path(client: SessionGate, gateway: FakeGateway) -> None:
    with pytest.raises(sdk.NotFoundError):
        client.sessions.get("a/b c")
    assert gateway.requests[0].url.raw_path == b"/v1/sessions/a%2Fb%20c"


def test_injected_http_client_is_used_and_not_closed(gateway: FakeGateway) -> None:
    http_client = httpx.Client(transport=gateway.transport(), headers={"X-From-Client": "yes"})
    with SessionGate(base_url=gateway.base_url, http_client=http_client, timeout=7.0) as client:
        client.sessions.create()
    assert gateway.requests[0].headers["x-from-client"] == "yes"
    assert gateway.requests[0].extensions["timeout"]["read"] == 7.0
    assert not http_client.is_closed
    http_client.close()
    with pytest.raises(ValueError, match="either"):
        SessionGate(http_client=http_client, transport=gateway.transport())


def test_passing_a_single_message_dict_is_rejected(client: SessionGate) -> None:
    session = client.sessions.create()
    bad: Any = {"role": "user", "content": "hi"}
    with pytest.raises(TypeError, match="list of message dicts"):
        session.chat(bad)


def test_public_names_are_exported() -> None:
    for name in sdk.__all__:
        assert hasattr(sdk, name), name

"""Unit tests of the pure history functions: message comparison, deltas, context, tool calls and results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sessiongate.sessions.history import (
    EMPTY_DIGEST,
    _normalise_any,
    content_text,
    context_digest,
    context_messages,
    extend_digest,
    normalise_message,
    requested_tool_calls,
    split_delta,
    split_delta_by_digest,
    tool_results,
)


@dataclass
class FakeTurn:
    status: str
    input_messages: list[dict[str, Any]]
    output_message: dict[str, Any] | None
    context_reset: bool = False


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (None, ""),
        ("plain", "plain"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab"),
        ([{"type": "image_url", "image_url": {"url": "u"}}], '{"image_url":{"url":"u"},"type":"image_url"}'),
    ],
)
def test_content_text(content: Any, text: str) -> None:
    assert content_text(content) == text


def test_messages_compare_on_what_the_model_saw() -> None:
    stored = assistant(None, tool_calls=[call("c1", "search", '{"q": "x", "n": 1}')], reasoning_content="hm")
    echoed = {"role": "assistant", "tool_calls": [call("c1", "search", '{"n":1,"q":"x"}')], "name": None}
    assert normalise_message(stored) == normalise_message(echoed)
    assert normalise_message(user("hi")) == normalise_message(
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    )
    assert normalise_message(assistant("", tool_calls=[])) == normalise_message({"role": "assistant"})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (user("hi"), user("hi!")),
        (user("hi"), {"role": "system", "content": "hi"}),
        (
            assistant(None, tool_calls=[call("c1", "f", "{}")]),
            assistant(None, tool_calls=[call("c2", "f", "{}")]),
        ),
        (
            assistant(None, tool_calls=[call("c1", "f", '{"a": 1}')]),
            assistant(None, tool_calls=[call("c1", "f", '{"a": 2}')]),
        ),
        (
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "tool", "tool_call_id": "c2", "content": "r"},
        ),
    ],
)
def test_different_messages_differ(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert normalise_message(a) != normalise_message(b)


def test_split_delta_appends_when_the_request_extends_the_context() -> None:
    context = [user("q1"), assistant("a1")]
    delta = split_delta(context, [*context, user("q2")])
    assert delta.input_messages == [user("q2")]
    assert not delta.context_reset


def test_split_delta_on_an_empty_context_is_everything_without_reset() -> None:
    delta = split_delta([], [user("q1")])
    assert delta.input_messages == [user("q1")]
    assert not delta.context_reset


@pytest.mark.parametrize(
    "messages",
    [
        [user("q1 edited"), assistant("a1"), user("q2")],  # edited
        [user("q1")],  # rewound: regenerate the last answer
        [user("q2")],  # a new conversation in the same session
    ],
)
def test_split_delta_resets_when_history_changed(messages: list[dict[str, Any]]) -> None:
    delta = split_delta([user("q1"), assistant("a1")], messages)
    assert delta.input_messages == messages
    assert delta.context_reset


@pytest.mark.parametrize(
    "messages",
    [
        [user("q1"), assistant("a1"), user("q2")],
        [{"role": "user", "content": [{"type": "text", "text": "q1"}]}, assistant("a1", name=None)],
        [user("q1 edited"), assistant("a1"), user("q2")],
        [user("q1")],
        [user("q2")],
        [],
    ],
)
def test_the_digest_splits_as_the_messages_do(messages: list[dict[str, Any]]) -> None:
    context = [user("q1"), assistant("a1")]
    assert split_delta_by_digest(context_digest(context), len(context), messages) == split_delta(context, messages)
    assert split_delta_by_digest(EMPTY_DIGEST, 0, messages) == split_delta([], messages)


def test_the_digest_is_a_chain_over_normalised_messages() -> None:
    calls = [call("c1", "search", '{"q": "x", "n": 1}')]
    context = [user("q1"), assistant(None, tool_calls=calls), {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    assert context_digest([]) == EMPTY_DIGEST
    assert extend_digest(context_digest(context[:1]), context[1:]) == context_digest(context)
    echoed = [user("q1"), {"role": "assistant", "tool_calls": [call("c1", "search", '{"n":1,"q":"x"}')]}, context[2]]
    assert context_digest(echoed) == context_digest(context)
    assert context_digest(context[::-1]) != context_digest(context)
    assert context_digest([user("a"), user("b")]) != context_digest([user("ab")])
    # A lone surrogate (legal in a JSON request) is hashed, not an error.
    assert context_digest([user("x\ud800")]) not in (context_digest([user("x")]), context_digest([user("x?")]))


def test_split_delta_copies_the_messages() -> None:
    sent = [user("q1")]
    delta = split_delta([], sent)
    delta.input_messages[0]["content"] = "changed"
    assert sent == [user("q1")]


def test_context_starts_at_the_last_reset_and_skips_unfinished_turns() -> None:
    turns = [
        FakeTurn("ok", [user("q1")], assistant("a1")),
        FakeTurn("ok", [user("q2")], assistant("a2")),
        FakeTurn("ok", [user("x1")], assistant("b1"), context_reset=True),
        FakeTurn("failed", [user("x2")], assistant("partial")),
        FakeTurn("cancelled", [user("x2")], None),
        FakeTurn("ok", [user("x2")], assistant("b2")),
        FakeTurn("pending", [user("x3")], None),
    ]
    assert context_messages(turns) == [user("x1"), assistant("b1"), user("x2"), assistant("b2")]


def test_a_failed_reset_does_not_reset() -> None:
    turns = [
        FakeTurn("ok", [user("q1")], assistant("a1")),
        FakeTurn("failed", [user("other")], None, context_reset=True),
    ]
    assert context_messages(turns) == [user("q1"), assistant("a1")]


def test_tool_results_and_requested_calls() -> None:
    messages = [
        user("q"),
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
        {"role": "tool", "content": "no id"},
        {"role": "tool", "tool_call_id": "c2", "content": None},
    ]
    assert tool_results(messages) == [("c1", "42"), ("c2", "")]

    output = assistant(
        None,
        tool_calls=[
            call("c1", "search", '{"q": "x"}'),
            {"type": "function", "function": {"name": "no_id", "arguments": "{}"}},
            {"id": "c3", "type": "function", "function": {"name": "g", "arguments": {"k": 1}}},
        ],
    )
    requested = requested_tool_calls(output)
    assert [(r.call_id, r.name, r.arguments) for r in requested] == [
        ("c1", "search", '{"q": "x"}'),
        ("c3", "g", '{"k":1}'),
    ]
    assert requested_tool_calls(None) == []
    assert requested_tool_calls(assistant("just text")) == []


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "plain"},
        {"role": "user", "content": ""},
        {"role": "", "content": "no role name"},
        {"role": "user", "content": "extra keys", "name": "bob", "id": 3},
        {"role": None, "content": "a role that is None"},
        {"content": "no role"},
        {"role": "user"},
        {"role": "user", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]},
        {"role": "assistant", "content": "x", "tool_calls": None},
        {"role": "assistant", "content": "x", "tool_calls": []},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "1"}}],
        },
        {"role": "tool", "content": "result", "tool_call_id": "c"},
        {"role": "tool", "content": "result", "tool_call_id": None},
        {"role": 7, "content": "a role that is not text"},
    ],
)
def test_the_plain_message_shortcut_normalises_as_the_general_path(message: dict[str, Any]) -> None:
    assert normalise_message(message) == _normalise_any(message)

"""`validate_chat` against the `ChatCompletionBody` model it stands in for on the hot path: over plain bodies and
every kind of deviation from them, both accept the same bodies, read the same values, and refuse with the same
error (the hand check passes anything it does not accept outright on to the model)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from sessiongate.gateway.api.schemas import ChatCompletionBody, _plainly_valid, validate, validate_chat
from sessiongate.gateway.errors import InvalidRequest

PLAIN: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ],
    "stream": True,
    "stream_options": {"include_usage": True},
    "session_id": "s-1",
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "max_tokens": 16,
    "max_completion_tokens": 8,
    "n": 1,
    "temperature": 0.5,
    "top_p": 0.9,  # not checked: passes through
}

# Values that are right for some field and wrong (or coercible) for others.
ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    3,
    2.5,
    0.0,
    "1",
    "true",
    "",
    "user",
    [],
    [{}],
    [1],
    {},
    {"a": 1},
]


def _outcome(check: Any, body: Any) -> tuple[str, Any]:
    try:
        chat = check(body)
    except InvalidRequest as exc:
        return "refused", (exc.message, exc.param, exc.code)
    return "accepted", (
        len(chat.messages) if hasattr(chat, "messages") else chat.message_count,
        chat.stream,
        chat.stream_options,
        chat.max_tokens,
        chat.max_completion_tokens,
    )


def _variants() -> list[Any]:
    rng = random.Random(20261126)
    variants: list[Any] = [PLAIN, [], "text", {"messages": []}, {"messages": [{"content": "no role"}]}]
    for field in [*PLAIN, "nonsense"]:
        for value in ODD_VALUES:
            body = copy.deepcopy(PLAIN)
            body[field] = value
            variants.append(body)
        without = copy.deepcopy(PLAIN)
        without.pop(field, None)
        variants.append(without)
    for field in ("role", "content", "name", "tool_calls", "tool_call_id", "extra"):
        for value in ODD_VALUES:
            body = copy.deepcopy(PLAIN)
            body["messages"][rng.randrange(len(body["messages"]))][field] = value
            variants.append(body)
    for _ in range(200):  # several deviations at once
        body = copy.deepcopy(PLAIN)
        for _ in range(rng.randint(1, 3)):
            messages = body["messages"]
            if rng.random() < 0.5 or not (isinstance(messages, list) and messages and isinstance(messages[0], dict)):
                body[rng.choice(list(PLAIN))] = rng.choice(ODD_VALUES)
            else:
                message = messages[rng.randrange(len(messages))]
                message[rng.choice(["role", "content", "tool_calls", "name"])] = rng.choice(ODD_VALUES)
        variants.append(body)
    return variants


@pytest.mark.parametrize("body", _variants())
def test_the_hand_check_accepts_and_refuses_as_the_model_does(body: Any) -> None:
    by_model = _outcome(lambda b: validate(ChatCompletionBody, b), body)
    assert _outcome(validate_chat, body) == by_model
    if isinstance(body, dict) and _plainly_valid(body):
        assert by_model[0] == "accepted"  # the hand check never takes a body the model would refuse


def test_plain_bodies_skip_the_model() -> None:
    assert _plainly_valid(copy.deepcopy(PLAIN))
    assert not _plainly_valid({**PLAIN, "stream": "true"})  # coercible: the model decides

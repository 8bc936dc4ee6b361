"""Pure functions for storing a conversation as deltas: what is new in a request, and what the context is.

Clients send the whole OpenAI message list with every request; a turn stores only the messages that are new.
The session's *context* is, over the turns with status "ok" in seq order, starting at the last one with
`context_reset` (or the first turn), `input_messages + [output_message]`. A request whose messages start
with the context (compared after `normalise_message`) extends it; any other request (the client edited or
rewound its history) is stored whole with `context_reset=True`. Failed and cancelled turns keep their input
but are not part of the context, so a retried user message is recorded again.

The store does not read the context back for every request: it keeps the context's `context_digest` (a sha256
chain over the normalised messages) and its length, and `split_delta_by_digest` compares the start of a request
with those. `split_delta` is the same decision against the messages themselves. `starts_with_context` takes the
request's messages normalised and, when the caller remembers the context's normalised messages, compares with them
instead of hashing the resent history (a turn resends all of it: hashing it was most of what the check cost).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

__all__ = [
    "EMPTY_DIGEST",
    "Delta",
    "RequestedToolCall",
    "content_text",
    "context_digest",
    "context_messages",
    "extend_digest",
    "extend_normalised",
    "message_chars",
    "normalise_message",
    "requested_tool_calls",
    "split_delta",
    "split_delta_by_digest",
    "starts_with_context",
    "tool_results",
]

NormalisedMessage = tuple[str, str, tuple[tuple[str, str, str], ...], str | None]

EMPTY_DIGEST = ""  # the digest of an empty context


class ContextTurn(Protocol):
    """What `context_messages` needs of a turn (an ORM row and a `TurnRecord` both qualify)."""

    @property
    def status(self) -> str: ...
    @property
    def context_reset(self) -> bool: ...
    @property
    def input_messages(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def output_message(self) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class Delta:
    input_messages: list[dict[str, Any]]
    context_reset: bool


@dataclass(frozen=True, slots=True)
class RequestedToolCall:
    call_id: str
    name: str
    arguments: str


def content_text(content: Any) -> str:
    """A message's content as text: a string as is, text parts joined, other parts as canonical JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                pieces.append(part["text"])
            else:
                pieces.append(_canonical_json(part))
        return "".join(pieces)
    return _canonical_json(content)


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _canonical_arguments(arguments: Any) -> str:
    # Frameworks often parse the model's arguments and serialise them again with other spacing.
    if isinstance(arguments, str):
        try:
            return _canonical_json(json.loads(arguments))
        except ValueError:
            return arguments
    if arguments is None:
        return ""
    return _canonical_json(arguments)


def _tool_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call for call in calls if isinstance(call, Mapping)]


def normalise_message(message: Mapping[str, Any]) -> NormalisedMessage:
    """The parts of a message that decide whether two messages are "the same" turn of a conversation.

    Role, content as text, tool calls as (id, name, arguments) and tool_call_id; other keys are ignored,
    and so is the difference between a missing key, None and an empty content or tool call list.
    """
    role, content = message.get("role"), message.get("content")
    if type(role) is str and type(content) is str and "tool_calls" not in message and "tool_call_id" not in message:
        return (role, content, (), None)  # most messages: what `_normalise_any` makes of them, at once
    return _normalise_any(message)


def _normalise_any(message: Mapping[str, Any]) -> NormalisedMessage:
    calls = []
    for call in _tool_calls(message):
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        calls.append(
            (
                str(call.get("id") or ""),
                str(function.get("name") or ""),
                _canonical_arguments(function.get("arguments")),
            )
        )
    tool_call_id = message.get("tool_call_id")
    return (
        str(message.get("role") or ""),
        content_text(message.get("content")),
        tuple(calls),
        str(tool_call_id) if tool_call_id is not None else None,
    )


def context_messages(turns: Iterable[ContextTurn]) -> list[dict[str, Any]]:
    """The session's context from its turns in seq order (turns that are not "ok" are skipped)."""
    context: list[dict[str, Any]] = []
    for turn in turns:
        if turn.status != "ok":
            continue
        if turn.context_reset:
            context = []
        context.extend(dict(message) for message in turn.input_messages)
        if turn.output_message is not None:
            context.append(dict(turn.output_message))
    return context


def split_delta(context: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> Delta:
    """What a request with the full message list `messages` adds to `context`."""
    new = [dict(message) for message in messages]
    if len(messages) >= len(context) and all(
        normalise_message(old) == normalise_message(sent) for old, sent in zip(context, messages, strict=False)
    ):
        return Delta(input_messages=new[len(context) :], context_reset=False)
    return Delta(input_messages=new, context_reset=True)


def extend_digest(digest: str, messages: Iterable[Mapping[str, Any]]) -> str:
    """The digest of the context whose digest is `digest` followed by `messages` (hex; "" for no messages).

    Each message moves the digest to sha256(previous digest + JSON of `normalise_message`), so two contexts
    have the same digest exactly when their messages compare equal one by one (barring collisions).
    """
    return extend_normalised(digest, map(normalise_message, messages))


def extend_normalised(digest: str, normalised: Iterable[NormalisedMessage]) -> str:
    """`extend_digest` for messages already normalised."""
    state = bytes.fromhex(digest)
    for message in normalised:
        step = hashlib.sha256(state)
        step.update(_digest_json(message))  # not `state + ...`: a long message is not copied
        state = step.digest()
    return state.hex()


def _digest_json(normalised: NormalisedMessage) -> bytes:
    try:
        return orjson.dumps(normalised)  # a tenth of json.dumps' time on long messages
    except orjson.JSONEncodeError:  # a lone surrogate ("\ud800" in the request's JSON), which orjson refuses
        return json.dumps(normalised).encode()


def context_digest(messages: Iterable[Mapping[str, Any]]) -> str:
    return extend_digest(EMPTY_DIGEST, messages)


def split_delta_by_digest(digest: str, length: int, messages: Sequence[Mapping[str, Any]]) -> Delta:
    """`split_delta` against a context known only by its digest and its length in messages."""
    if starts_with_context(digest, length, [normalise_message(message) for message in messages]):
        return Delta(input_messages=[dict(message) for message in messages[length:]], context_reset=False)
    return Delta(input_messages=[dict(message) for message in messages], context_reset=True)


def starts_with_context(
    digest: str,
    length: int,
    normalised: list[NormalisedMessage],
    known: list[NormalisedMessage] | None = None,
) -> bool:
    """Whether a request whose messages, normalised, are `normalised` starts with the context of digest `digest`
    and `length` messages. `known`: that context's normalised messages, when the caller remembers them; they are
    compared (one list comparison) instead of hashing the request's first `length` messages."""
    if len(normalised) < length:
        return False
    if not length:
        return digest == EMPTY_DIGEST
    if known is not None:
        return normalised[:length] == known
    return extend_normalised(EMPTY_DIGEST, normalised[:length]) == digest


def message_chars(message: NormalisedMessage) -> int:
    """About how much memory a normalised message holds, in characters: its text and its calls' arguments."""
    calls = message[2]
    return len(message[1]) + sum(len(arguments) for _, _, arguments in calls) if calls else len(message[1])


def tool_results(messages: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(tool_call_id, result text) for each role=tool message that names its call."""
    results = []
    for message in messages:
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool" and isinstance(call_id, str) and call_id:
            results.append((call_id, content_text(message.get("content"))))
    return results


def requested_tool_calls(output_message: Mapping[str, Any] | None) -> list[RequestedToolCall]:
    """The tool calls an assistant message asks for, in order; calls without an id are skipped."""
    if output_message is None:
        return []
    requested = []
    for call in _tool_calls(output_message):
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "" if arguments is None else _canonical_json(arguments)
        requested.append(RequestedToolCall(call_id, str(function.get("name") or ""), arguments))
    return requested

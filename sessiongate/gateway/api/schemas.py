"""Validation of the JSON the gateway accepts, at the wire edge (pydantic), with OpenAI-style errors.

Only what the gateway relies on is checked strictly; every other field of a chat request passes through to
the worker unchanged (`extra="allow"`), so new OpenAI or SGLang parameters need no gateway release.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessiongate.gateway.errors import InvalidRequest

__all__ = [
    "ChatCompletionBody",
    "ChatRequest",
    "CreateSessionBody",
    "new_session_id",
    "parse_json",
    "validate",
    "validate_chat",
    "validate_session_id",
]

M = TypeVar("M", bound=BaseModel)

SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


def new_session_id() -> str:
    return "sess_" + secrets.token_hex(12)


def validate_session_id(value: str, *, param: str) -> str:
    if not SESSION_ID_PATTERN.fullmatch(value):
        raise InvalidRequest(
            f"Invalid session id {value[:64]!r}: use 1-128 characters from letters, digits and ._:@- "
            "starting with a letter or digit.",
            param=param,
            code="invalid_session_id",
        )
    return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    session_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=1)
    temperature: float | None = Field(default=None, ge=0, le=2)


class CreateSessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str | None = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    metadata: dict[str, Any] | None = None


class UpdateSessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: int | None = Field(default=None, ge=-1000, le=1000)
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What the gateway reads of a valid chat request (the body itself goes to the worker as it came)."""

    message_count: int
    stream: bool
    stream_options: dict[str, Any] | None
    max_tokens: int | None
    max_completion_tokens: int | None


_ROLES = frozenset(get_args(ChatMessage.model_fields["role"].annotation))
_OPTIONAL_STRINGS = ("model", "session_id")


def validate_chat(body: Any) -> ChatRequest:
    """`body` checked as `ChatCompletionBody` checks it.

    A body whose every checked field already has its JSON type (what clients send) is accepted by hand: the model
    builds a `ChatMessage` per message, the whole history on every turn, for a result the gateway never reads.
    Anything else goes through the model, which coerces what it may and names the first problem, so both ways
    accept the same bodies (tests/gateway/test_schemas.py compares them)."""
    if isinstance(body, dict) and _plainly_valid(body):
        return ChatRequest(
            len(body["messages"]),
            body.get("stream", False),
            body.get("stream_options"),
            body.get("max_tokens"),
            body.get("max_completion_tokens"),
        )
    chat = validate(ChatCompletionBody, body)
    return ChatRequest(
        len(chat.messages), chat.stream, chat.stream_options, chat.max_tokens, chat.max_completion_tokens
    )


def _plainly_valid(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    if type(messages) is not list or not messages:
        return False
    for message in messages:
        if type(message) is not dict:
            return False
        role = message.get("role")
        if type(role) is not str or role not in _ROLES:
            return False
        content = message.get("content")
        if type(content) is str and len(message) == 2:
            continue  # a role and a text: most messages, and the rest of the loop would look up three absent keys
        if content is not None and type(content) is not str and not _list_of_objects(content):
            return False
        for name in ("name", "tool_call_id"):
            value = message.get(name)
            if value is not None and type(value) is not str:
                return False
        calls = message.get("tool_calls")
        if calls is not None and not _list_of_objects(calls):
            return False
    for name in _OPTIONAL_STRINGS:
        value = body.get(name)
        if value is not None and type(value) is not str:
            return False
    if type(body.get("stream", False)) is not bool:
        return False
    options, tools = body.get("stream_options"), body.get("tools")
    if (options is not None and type(options) is not dict) or (tools is not None and not _list_of_objects(tools)):
        return False
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and not (type(value) is int and value >= 1):
            return False
    n, temperature = body.get("n", 1), body.get("temperature")
    if type(n) is not int or n != 1:
        return False
    return temperature is None or (type(temperature) in (int, float) and 0 <= temperature <= 2)


def _list_of_objects(value: Any) -> bool:
    return type(value) is list and all(type(item) is dict for item in value)


def parse_json(raw: bytes) -> Any:
    if not raw:
        raise InvalidRequest("The request body is empty; send a JSON object.", code="empty_body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc


def validate(model: type[M], data: Any) -> M:
    """Validate `data` against `model`, raising the first problem as an `InvalidRequest` naming its field."""
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param_path(first.get("loc", ()))
        raise InvalidRequest(
            f"Invalid value for '{param}': {first.get('msg', 'invalid')}.", param=param or None
        ) from None


def _param_path(loc: tuple[int | str, ...] | Any) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part) in {"str", "list[dict[str,any]]", "none"} or "[" in str(part):
            continue  # pydantic's union branch names are noise for the caller
        else:
            path += f".{part}" if path else str(part)
    return path

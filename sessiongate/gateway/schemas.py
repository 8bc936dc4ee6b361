"""Validation of the JSON the gateway accepts, at the wire edge (pydantic), with OpenAI-style errors.

Only what the gateway relies on is checked strictly; every other field of a chat request passes through to
the worker unchanged (`extra="allow"`), so new OpenAI or SGLang parameters need no gateway release.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidRequest

__all__ = [
    "ChatCompletionBody",
    "CreateSessionBody",
    "new_session_id",
    "parse_json",
    "validate",
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

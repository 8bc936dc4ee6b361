"""Typed, read-only views of chat completions and stream chunks, built from the wire dicts.

Each view is a frozen dataclass that keeps the dict it was built from in `.raw`, so fields the SDK does not
model (logprobs, new OpenAI fields) stay reachable. `parse_completion` and `parse_chunk` are the only
constructors the clients use; they also read the gateway's `sessiongate` object (session, turn, worker),
falling back to the response headers when the body does not carry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CachedTokens",
    "ChatCompletion",
    "ChatCompletionChunk",
    "Choice",
    "ChunkChoice",
    "Delta",
    "Function",
    "FunctionDelta",
    "JSONDict",
    "Message",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "as_mapping",
    "parse_chunk",
    "parse_completion",
    "parse_usage",
]

JSONDict = Mapping[str, Any]
_NO_DICT: JSONDict = {}


@dataclass(frozen=True)
class Function:
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    type: str
    function: Function

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.function.name, "arguments": self.function.arguments},
        }


@dataclass(frozen=True)
class Message:
    role: str
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The message as it goes back into a conversation: role, content, and tool_calls if any."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return out


@dataclass(frozen=True)
class Choice:
    index: int
    message: Message
    finish_reason: str | None


@dataclass(frozen=True)
class CachedTokens:
    """Prompt tokens whose KV came from each tier instead of being recomputed: the worker's device memory, its
    host memory, or the shared KV pool (`storage`)."""

    device: int = 0
    host: int = 0
    storage: int = 0


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int = 0
    cached_tokens_details: Mapping[str, int] = field(default_factory=dict)
    cached_tokens_by_tier: CachedTokens = field(default_factory=CachedTokens)


@dataclass(frozen=True)
class ChatCompletion:
    id: str
    model: str
    choices: tuple[Choice, ...]
    usage: Usage | None
    session_id: str | None
    turn_id: str | None
    worker: str | None
    raw: JSONDict = field(repr=False, compare=False)

    @property
    def message(self) -> Message | None:
        """The first choice's message."""
        return self.choices[0].message if self.choices else None

    @property
    def content(self) -> str:
        """The first choice's text ("" when there is none, e.g. a reply made only of tool calls)."""
        message = self.message
        return (message.content or "") if message is not None else ""

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason if self.choices else None


@dataclass(frozen=True)
class FunctionDelta:
    name: str | None
    arguments: str | None


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None
    type: str | None
    function: FunctionDelta | None


@dataclass(frozen=True)
class Delta:
    role: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True)
class ChunkChoice:
    index: int
    delta: Delta
    finish_reason: str | None


@dataclass(frozen=True)
class ChatCompletionChunk:
    id: str
    model: str
    choices: tuple[ChunkChoice, ...]
    usage: Usage | None
    session_id: str | None
    turn_id: str | None
    worker: str | None
    raw: JSONDict = field(repr=False, compare=False)

    @property
    def delta(self) -> Delta:
        """The first choice's delta (an empty one for a chunk without choices, e.g. the usage chunk)."""
        return self.choices[0].delta if self.choices else Delta()

    @property
    def content(self) -> str:
        """The text this chunk adds to the first choice."""
        return self.delta.content or ""


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def as_mapping(value: Any) -> JSONDict:
    """`value` if it is a mapping, else an empty one (the wire's optional objects may be null)."""
    return value if isinstance(value, Mapping) else _NO_DICT


def parse_usage(raw: Any) -> Usage | None:
    """A `Usage` from an OpenAI usage object (or a turn's usage), reading the cached-token breakdown too."""
    if not isinstance(raw, Mapping):
        return None
    details = as_mapping(raw.get("prompt_tokens_details"))
    cached = raw.get("cached_tokens", details.get("cached_tokens"))
    breakdown = as_mapping(raw.get("cached_tokens_details") or details.get("cached_tokens_details"))
    prompt, completion = _int(raw.get("prompt_tokens")), _int(raw.get("completion_tokens"))
    total = raw.get("total_tokens")
    # Token counts per tier only: SGLang also names its storage backend here (a string).
    counts = {str(tier): n for tier, n in breakdown.items() if isinstance(n, int)}
    # A turn read back from the gateway names the three tiers itself; a chat reply has SGLang's report only.
    tiers = as_mapping(raw.get("cached_tokens_by_tier")) or counts
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=_int(total) if total is not None else prompt + completion,
        cached_tokens=_int(cached),
        cached_tokens_details=counts,
        cached_tokens_by_tier=CachedTokens(
            device=_int(tiers.get("device")), host=_int(tiers.get("host")), storage=_int(tiers.get("storage"))
        ),
    )


def _parse_tool_call(raw: JSONDict) -> ToolCall:
    function = as_mapping(raw.get("function"))
    return ToolCall(
        id=str(raw.get("id") or ""),
        type=str(raw.get("type") or "function"),
        function=Function(name=str(function.get("name") or ""), arguments=str(function.get("arguments") or "")),
    )


def _parse_choice(raw: JSONDict) -> Choice:
    message = as_mapping(raw.get("message"))
    return Choice(
        index=_int(raw.get("index")),
        message=Message(
            role=str(message.get("role") or "assistant"),
            content=message.get("content"),
            tool_calls=tuple(_parse_tool_call(as_mapping(c)) for c in message.get("tool_calls") or ()),
        ),
        finish_reason=raw.get("finish_reason"),
    )


def _parse_tool_call_delta(raw: JSONDict) -> ToolCallDelta:
    function = raw.get("function")
    return ToolCallDelta(
        index=_int(raw.get("index")),
        id=raw.get("id"),
        type=raw.get("type"),
        function=(
            FunctionDelta(name=function.get("name"), arguments=function.get("arguments"))
            if isinstance(function, Mapping)
            else None
        ),
    )


def _parse_chunk_choice(raw: JSONDict) -> ChunkChoice:
    delta = as_mapping(raw.get("delta"))
    return ChunkChoice(
        index=_int(raw.get("index")),
        delta=Delta(
            role=delta.get("role"),
            content=delta.get("content"),
            tool_calls=tuple(_parse_tool_call_delta(as_mapping(c)) for c in delta.get("tool_calls") or ()),
        ),
        finish_reason=raw.get("finish_reason"),
    )


def _gateway_ids(raw: JSONDict, headers: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """(session_id, turn_id, worker) from the body's `sessiongate` object, else from the response headers."""
    extra = as_mapping(raw.get("sessiongate"))
    return (
        extra.get("session_id") or headers.get("x-session-id"),
        extra.get("turn_id") or headers.get("x-sessiongate-turn-id"),
        extra.get("worker") or headers.get("x-sessiongate-worker"),
    )


def parse_completion(raw: JSONDict, headers: Mapping[str, str] = _NO_DICT) -> ChatCompletion:
    """A `ChatCompletion` from a non-streamed response body (or an assembled stream)."""
    session_id, turn_id, worker = _gateway_ids(raw, headers)
    return ChatCompletion(
        id=str(raw.get("id") or ""),
        model=str(raw.get("model") or ""),
        choices=tuple(_parse_choice(as_mapping(c)) for c in raw.get("choices") or ()),
        usage=parse_usage(raw.get("usage")),
        session_id=session_id,
        turn_id=turn_id,
        worker=worker,
        raw=raw,
    )


def parse_chunk(raw: JSONDict) -> ChatCompletionChunk:
    """A `ChatCompletionChunk` from one SSE `data:` payload (the gateway object rides on the final chunk)."""
    session_id, turn_id, worker = _gateway_ids(raw, _NO_DICT)
    return ChatCompletionChunk(
        id=str(raw.get("id") or ""),
        model=str(raw.get("model") or ""),
        choices=tuple(_parse_chunk_choice(as_mapping(c)) for c in raw.get("choices") or ()),
        usage=parse_usage(raw.get("usage")),
        session_id=session_id,
        turn_id=turn_id,
        worker=worker,
        raw=raw,
    )

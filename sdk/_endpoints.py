"""What each endpoint sends: pure builders of `RequestOptions`, shared by the sync and async resources.

One function per gateway endpoint, so the wire format the SDK speaks is written down once. The matching
response parsers live in `_types.py` and `_session_types.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from ._base import RequestOptions

__all__ = [
    "Messages",
    "ToolChoice",
    "Tools",
    "build_chat_body",
    "chat_completion",
    "create_session",
    "delete_session",
    "get_session",
    "list_messages",
    "list_sessions",
    "list_turns",
    "parse_list",
]

Messages = Iterable[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]]
ToolChoice = str | Mapping[str, Any]


def _session_path(session_id: str, suffix: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{suffix}"


def create_session(session_id: str | None, priority: int, metadata: Mapping[str, Any] | None) -> RequestOptions:
    body: dict[str, Any] = {"priority": priority}
    if session_id is not None:
        body["session_id"] = session_id
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return RequestOptions.make("POST", "/v1/sessions", json=body)


def get_session(session_id: str) -> RequestOptions:
    return RequestOptions.make("GET", _session_path(session_id))


def list_sessions(limit: int, after: str | None) -> RequestOptions:
    return RequestOptions.make("GET", "/v1/sessions", params={"limit": limit, "after": after})


def delete_session(session_id: str) -> RequestOptions:
    return RequestOptions.make("DELETE", _session_path(session_id))


def list_messages(session_id: str) -> RequestOptions:
    return RequestOptions.make("GET", _session_path(session_id, "/messages"))


def list_turns(session_id: str) -> RequestOptions:
    return RequestOptions.make("GET", _session_path(session_id, "/turns"))


def parse_list(payload: Mapping[str, Any]) -> list[Any]:
    """The `data` of an `{"object": "list", "data": [...]}` body."""
    data = payload["data"]
    if not isinstance(data, list):
        raise TypeError("`data` is not a list")
    return data


def build_chat_body(
    messages: Messages,
    *,
    model: str | None,
    tools: Tools | None,
    tool_choice: ToolChoice | None,
    max_tokens: int | None,
    temperature: float | None,
    stream: bool,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """An OpenAI chat-completions body; parameters left as None are omitted, `extra` is merged last."""
    body: dict[str, Any] = {"messages": [dict(m) for m in messages]}
    optional = {
        "model": model,
        "tools": [dict(t) for t in tools] if tools is not None else None,
        "tool_choice": tool_choice,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def chat_completion(body: Mapping[str, Any], session_id: str | None) -> RequestOptions:
    headers = {"X-Session-Id": session_id} if session_id is not None else None
    return RequestOptions.make(
        "POST", "/v1/chat/completions", json=body, headers=headers, stream=bool(body.get("stream"))
    )

"""What each endpoint sends: pure builders of `RequestOptions`, shared by the sync and async resources.

One function per gateway endpoint, so the wire format the SDK speaks is written down once. The matching
response parsers live in `_types.py` and `_session_types.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

from ._base import RequestOptions

__all__ = [
    "AdviseKind",
    "Messages",
    "ToolChoice",
    "Tools",
    "TypingState",
    "admin_advisory_stats",
    "admin_close_session",
    "admin_delete_session",
    "admin_drop_kv",
    "admin_get_session",
    "admin_list_sessions",
    "admin_list_workers",
    "admin_patch_session",
    "admin_retain_kv",
    "admin_set_draining",
    "advise",
    "build_chat_body",
    "chat_completion",
    "create_session",
    "delete_session",
    "get_session",
    "list_messages",
    "list_sessions",
    "list_turns",
    "parse_list",
    "post_tool_result",
    "typing",
]

Messages = Iterable[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]]
ToolChoice = str | Mapping[str, Any]
TypingState = Literal["started", "stopped"]
AdviseKind = Literal["typing", "tool_result", "tool_call", "explicit"]


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


def fork_session(
    session_id: str, at_turn: int | None, child_id: str | None, metadata: Mapping[str, Any] | None
) -> RequestOptions:
    body: dict[str, Any] = {}
    if at_turn is not None:
        body["at_turn"] = at_turn
    if child_id is not None:
        body["session_id"] = child_id
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return RequestOptions.make("POST", _session_path(session_id, "/fork"), json=body)


def close_session(session_id: str) -> RequestOptions:
    return RequestOptions.make("POST", _session_path(session_id, "/close"))


def list_messages(session_id: str) -> RequestOptions:
    return RequestOptions.make("GET", _session_path(session_id, "/messages"))


def list_turns(session_id: str) -> RequestOptions:
    return RequestOptions.make("GET", _session_path(session_id, "/turns"))


# signals: hints that the session's next turn is coming (answered 202 with what the advisor did)


def typing(session_id: str, state: TypingState) -> RequestOptions:
    return RequestOptions.make("POST", _session_path(session_id, "/typing"), json={"state": state})


def post_tool_result(session_id: str, tool_call_id: str, content: str) -> RequestOptions:
    body = {"tool_call_id": tool_call_id, "content": content}
    return RequestOptions.make("POST", _session_path(session_id, "/tool_results"), json=body)


def advise(session_id: str, kind: AdviseKind, expected_in_ms: int | None) -> RequestOptions:
    body: dict[str, Any] = {"kind": kind}
    if expected_in_ms is not None:
        body["expected_in_ms"] = expected_in_ms
    return RequestOptions.make("POST", _session_path(session_id, "/advise"), json=body)


# the admin API (sent with the admin key)


def _admin_session_path(session_id: str, suffix: str = "") -> str:
    return f"/v1/admin/sessions/{quote(session_id, safe='')}{suffix}"


def admin_list_sessions(
    *,
    tenant_id: str | None,
    state: str | None,
    active_after: datetime | None,
    active_before: datetime | None,
    min_priority: int | None,
    max_priority: int | None,
    limit: int,
    after: str | None,
) -> RequestOptions:
    params = {
        "tenant_id": tenant_id,
        "state": state,
        "active_after": active_after.isoformat() if active_after is not None else None,
        "active_before": active_before.isoformat() if active_before is not None else None,
        "min_priority": min_priority,
        "max_priority": max_priority,
        "limit": limit,
        "after": after,
    }
    return RequestOptions.make("GET", "/v1/admin/sessions", params=params, admin=True)


def admin_get_session(session_id: str) -> RequestOptions:
    return RequestOptions.make("GET", _admin_session_path(session_id), admin=True)


def admin_patch_session(session_id: str, priority: int) -> RequestOptions:
    return RequestOptions.make("PATCH", _admin_session_path(session_id), json={"priority": priority}, admin=True)


def admin_close_session(session_id: str) -> RequestOptions:
    return RequestOptions.make("POST", _admin_session_path(session_id, "/close"), admin=True)


def admin_delete_session(session_id: str) -> RequestOptions:
    return RequestOptions.make("DELETE", _admin_session_path(session_id), admin=True)


def admin_retain_kv(session_id: str, priority: int | None, ttl_ms: int | None) -> RequestOptions:
    body = {k: v for k, v in {"priority": priority, "ttl_ms": ttl_ms}.items() if v is not None}
    return RequestOptions.make("POST", _admin_session_path(session_id, "/kv/retain"), json=body, admin=True)


def admin_drop_kv(session_id: str) -> RequestOptions:
    return RequestOptions.make("POST", _admin_session_path(session_id, "/kv/drop"), admin=True)


def admin_list_workers() -> RequestOptions:
    return RequestOptions.make("GET", "/v1/admin/workers", admin=True)


def admin_set_draining(worker_id: str, draining: bool) -> RequestOptions:
    action = "drain" if draining else "undrain"
    return RequestOptions.make("POST", f"/v1/admin/workers/{quote(worker_id, safe='')}/{action}", admin=True)


def admin_advisory_stats() -> RequestOptions:
    return RequestOptions.make("GET", "/v1/admin/advisories/stats", admin=True)


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

"""Translation between OpenAI's Responses API and the chat messages the gateway's turns are made of.

A Responses request becomes a chat completion request whose messages are the chain's stored context followed by
the request's input items; the chat answer becomes the response's output items. Both directions are pure functions
of their inputs, so what reaches the worker is exactly the chat turn the session's context (and so the worker's
cached prefix) continues, and a function call's `call_id` is the chat tool call's `id` the worker produced.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessiongate.gateway.errors import InvalidRequest

__all__ = [
    "ChatPlan",
    "chat_tool_choice",
    "chat_tools",
    "input_messages",
    "new_id",
    "output_items",
    "response_object",
    "response_usage",
]


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """What one Responses request sends as a chat turn: the full message list and the other chat fields."""

    messages: list[dict[str, Any]]
    fields: dict[str, Any]
    input_items: list[dict[str, Any]]


def _text_of(content: Any, *, param: str) -> str:
    """An input message's content as text: a string, or its text parts joined (other parts are refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("A message's 'content' must be a string or a list of content parts.", param=param)
    pieces = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InvalidRequest(f"Content parts of type {kind!r} are not supported; send text.", param=param)
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest("A text content part needs a string 'text'.", param=param)
        pieces.append(text)
    return "".join(pieces)


def _normalised_items(raw: Any) -> list[dict[str, Any]]:
    """The request's `input` as a list of items (a string is one user message), each with its `type`."""
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise InvalidRequest("'input' must be a string or a list of items.", param="input")
    items = []
    for index, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise InvalidRequest("Each input item must be an object.", param=f"input.{index}")
        item = dict(item)
        if "type" not in item and "role" in item:
            item["type"] = "message"
        items.append(item)
    return items


def input_messages(raw_input: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The chat messages the input items stand for, and the items as stored (with ids) for `input_items`.

    Consecutive `function_call` items (and an assistant message just before them) become one assistant message with
    its tool calls, as the chat template renders them; `reasoning` items are dropped (the worker's chat template
    has no place for them)."""
    messages: list[dict[str, Any]] = []
    stored: list[dict[str, Any]] = []
    for index, item in enumerate(_normalised_items(raw_input)):
        kind = item.get("type")
        param = f"input.{index}"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequest(f"Unsupported message role {role!r}.", param=f"{param}.role")
            text = _text_of(item.get("content"), param=f"{param}.content")
            messages.append({"role": "system" if role == "developer" else role, "content": text})
            part_type = "output_text" if role == "assistant" else "input_text"
            stored.append(
                {
                    "type": "message",
                    "id": item.get("id") or new_id("msg_"),
                    "role": role,
                    "status": "completed",
                    "content": [{"type": part_type, "text": text}],
                }
            )
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise InvalidRequest("A function_call item needs 'call_id' and 'name'.", param=param)
            if not isinstance(arguments, str):
                raise InvalidRequest("A function_call item's 'arguments' must be a string.", param=param)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last.get("content"):
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            stored.append(
                {
                    "type": "function_call",
                    "id": item.get("id") or new_id("fc_"),
                    "call_id": call_id,
                    "name": name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest("A function_call_output item needs 'call_id'.", param=param)
            text = output if isinstance(output, str) else _text_of(output, param=f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            stored.append(
                {
                    "type": "function_call_output",
                    "id": item.get("id") or new_id("fco_"),
                    "call_id": call_id,
                    "output": text,
                    "status": "completed",
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise InvalidRequest(f"Input items of type {kind!r} are not supported.", param=f"{param}.type")
    return messages, stored


def chat_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) as chat tools (nested under `function`); other tool types are refused."""
    if not tools:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise InvalidRequest(
                f"Only function tools are supported (tool of type {tool.get('type')!r}).", param=f"tools.{index}"
            )
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object"}}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequest("'tool_choice' must be 'auto', 'none', 'required' or a function.", param="tool_choice")


def output_items(message: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The response's output items for the worker's assistant message: its text, then its tool calls."""
    if message is None:
        return []
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        items.append(message_item(new_id("msg_"), content))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            function_call_item(
                new_id("fc_"), str(call.get("id") or ""), str(function.get("name") or ""), function.get("arguments")
            )
        )
    return items


def message_item(item_id: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: Any, *, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else "",
        "status": status,
    }


def response_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage (with the gateway's cache report) in the Responses API's terms."""
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    out: dict[str, Any] = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }
    if isinstance(details, Mapping) and isinstance(details.get("cached_tokens_details"), Mapping):
        out["input_tokens_details"]["cached_tokens_details"] = dict(details["cached_tokens_details"])
    return out


def response_object(
    response_id: str,
    request: Mapping[str, Any],
    *,
    status: str,
    output: list[dict[str, Any]],
    model: str | None,
    usage: Mapping[str, Any] | None = None,
    finish_reason: str | None = None,
    created_at: int | None = None,
    error: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Response object, from the request's own fields and what the turn produced."""
    incomplete = None
    if status == "completed" and finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "background": False,
        "error": dict(error) if error else None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model or request.get("model") or "",
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": list(request.get("tools") or []),
        "top_p": request.get("top_p", 1.0),
        "truncation": request.get("truncation") or "disabled",
        "usage": response_usage(usage),
        "user": request.get("user"),
        "metadata": dict(request.get("metadata") or {}),
    }

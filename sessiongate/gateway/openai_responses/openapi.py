"""The OpenAPI schemas of `/v1/responses`' answers (the operations are in `gateway/api/openapi.py`).

What the gateway promises of a Response object: OpenAI's required fields, and the `sessiongate` annotation (the
session and turn the response was). Output items are described by their kinds (`message`, `function_call`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESPONSES_API_SCHEMAS"]

_STR = {"type": "string"}
_INT = {"type": "integer"}
_OBJ = {"type": "object"}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


_USAGE = _object(
    {"input_tokens": _INT, "output_tokens": _INT, "total_tokens": _INT},
    {"input_tokens_details": _object({"cached_tokens": _INT}), "output_tokens_details": _OBJ},
)
_ITEM = _object(
    {"type": {"enum": ["message", "function_call", "function_call_output"]}, "id": _STR},
    {"status": _STR, "role": _STR, "content": {"type": "array"}, "call_id": _STR, "name": _STR, "arguments": _STR},
)

RESPONSES_API_SCHEMAS: dict[str, dict[str, Any]] = {
    "Response": _object(
        {
            "id": _STR,
            "object": {"const": "response"},
            "created_at": _INT,
            "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
            "model": _STR,
            "output": {"type": "array", "items": _ITEM},
        },
        {
            "instructions": {"type": ["string", "null"]},
            "previous_response_id": {"type": ["string", "null"]},
            "usage": {"anyOf": [_USAGE, {"type": "null"}]},
            "metadata": _OBJ,
            "error": {"type": ["object", "null"]},
            "sessiongate": {"type": ["object", "null"]},
        },
    ),
    "ResponseItem": _ITEM,
    "ResponseItemList": _object(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ITEM},
            "has_more": {"type": "boolean"},
        },
        {"first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]}},
    ),
    "ResponseDeleted": _object({"id": _STR, "object": {"const": "response"}, "deleted": {"const": True}}),
    # One server-sent event of a streamed response: `event` is its type, `data` the event object as JSON.
    "ResponseEvent": _object(
        {"data": {"type": "string", "contentMediaType": "application/json"}}, {"event": _STR, "id": _STR}
    ),
}

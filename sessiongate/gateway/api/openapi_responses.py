"""The response schemas of the OpenAPI document (sessiongate/gateway/api/openapi.py): what each handler really
answers, checked against real answers by tests/gateway/test_openapi_responses.py. Required fields are the ones every
answer has; objects stay open (more fields may come) unless a client could not cope with them."""

from __future__ import annotations

from typing import Any

__all__ = ["RESPONSE_SCHEMAS", "list_of"]

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OBJ = {"type": "object"}
_TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


def list_of(item: str, *, paged: bool = False) -> dict[str, Any]:
    """`{"object": "list", "data": [item, ...]}` (and `has_more` where the list is paged)."""
    schema = _object(
        {"object": {"const": "list"}, "data": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}}}
    )
    if paged:
        schema["required"].append("has_more")
        schema["properties"]["has_more"] = _BOOL
    return schema


_USAGE = _object({}, {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT})
_KV_RESULT = _object(
    {"worker": _STR, "session_id": _STR, "operation": {"enum": ["retain", "drop"]}},
    {"tokens": _INT, "device_tokens": _INT, "host_tokens": _INT, "storage_tokens": _INT, "error": _STR},
)
_LIMITS = _object({"max_concurrent": {"type": ["integer", "null"]}, "tokens_per_minute": {"type": ["integer", "null"]}})

RESPONSE_SCHEMAS: dict[str, dict[str, Any]] = {
    "ChatCompletion": _object(
        {
            "id": _STR,
            "object": {"const": "chat.completion"},
            "choices": {
                "type": "array",
                "items": _object(
                    {"index": _INT, "message": _object({"role": _STR})}, {"finish_reason": {"type": ["string", "null"]}}
                ),
            },
            "sessiongate": _object({"session_id": _STR, "turn_id": _STR}, {"worker": {"type": ["string", "null"]}}),
        },
        {"model": _STR, "created": _INT, "usage": {"anyOf": [_USAGE, {"type": "null"}]}},
    ),
    # One server-sent event of a streamed turn: `data` is a `chat.completion.chunk` as JSON, an error object
    # (`{"error": ...}`, when the worker fails mid-stream), or `[DONE]` last.
    "ChatCompletionEvent": _object(
        {"data": {"type": "string", "contentMediaType": "application/json"}},
        {"event": _STR, "id": _STR, "retry": _INT},
    ),
    "Model": _object({"id": _STR, "object": {"const": "model"}}, {"owned_by": _STR}),
    "Turn": _object(
        {
            "id": _STR,
            "object": {"const": "session.turn"},
            "session_id": _STR,
            "seq": _INT,
            "status": {"enum": ["pending", "ok", "failed", "cancelled"]},
            "input_messages": {"type": "array", "items": _OBJ},
            "context_reset": _BOOL,
        },
        {
            "output_message": {"type": ["object", "null"]},
            "session_source": {"enum": ["header", "body", "inferred", "response", "new", None]},
            "prefix_break": {"type": ["object", "null"]},
            "finish_reason": {"type": ["string", "null"]},
            "worker": {"type": ["string", "null"]},
            "error": {"type": ["object", "null"]},
            "usage": {"anyOf": [{"$ref": "#/components/schemas/TurnUsage"}, {"type": "null"}]},
            "advisory": {
                "description": "The advisory settled against the turn (kind `none`, outcome `missed` when no signal "
                "foresaw it); null until settled, just after the turn ends.",
                "anyOf": [{"$ref": "#/components/schemas/TurnAdvisory"}, {"type": "null"}],
            },
            "timings": _OBJ,
            "tool_calls": {"type": "array", "items": _OBJ},
        },
    ),
    "TurnUsage": _object(
        {
            "prompt_tokens": {"type": ["integer", "null"]},
            "completion_tokens": {"type": ["integer", "null"]},
            "cached_tokens": {"type": ["integer", "null"]},
            "cached_tokens_by_tier": _object(
                {"device": _INT, "host": _INT, "storage": _INT},
            ),
        },
        {"cached_tokens_details": {"type": ["object", "null"], "description": "SGLang's cache report as it came"}},
    ),
    "TurnAdvisory": _object(
        {
            "id": _STR,
            "kind": {"enum": ["typing", "tool_result", "tool_call", "explicit", "none"]},
            "outcome": {"enum": ["used", "late", "wasted", "missed", "cancelled"]},
            "target_worker": {"type": ["string", "null"]},
        }
    ),
    "Message": _object({"role": _STR}),
    "SessionDeleted": _object(
        {"id": _STR, "object": {"const": "session.deleted"}, "deleted": {"const": True}},
        {"kv": {"type": "array", "items": _KV_RESULT}},
    ),
    "Advisory": _object(
        {
            "object": {"const": "advisory"},
            "state": {"enum": ["fired", "scheduled", "refreshed", "stopping", "skipped", "none"]},
        },
        {
            "id": _STR,
            "kind": _STR,
            "worker": _STR,
            "target": _STR,
            "expires_in_s": _NUM,
            "reason": {"description": "why it was skipped", "type": "string"},
        },
    ),
    "ToolResult": _object(
        {
            "object": {"const": "session.tool_result"},
            "session_id": _STR,
            "tool_call_id": _STR,
            "name": _STR,
            "duration_ms": {"type": ["number", "null"]},
            "advisory": {"anyOf": [{"$ref": "#/components/schemas/Advisory"}, {"type": "null"}]},
        }
    ),
    "AdminSession": {
        "allOf": [
            {"$ref": "#/components/schemas/Session"},
            _object({"turns": {"type": "array", "items": {"$ref": "#/components/schemas/Turn"}}}),
        ]
    },
    "SessionKv": _object(
        {
            "object": {"const": "session.kv"},
            "session_id": _STR,
            "operation": {"enum": ["retain", "drop"]},
            "workers": {"type": "array", "items": _KV_RESULT},
        }
    ),
    "Worker": _object(
        {
            "id": _STR,
            "object": {"const": "worker"},
            "url": _STR,
            "healthy": _BOOL,
            "draining": _BOOL,
            "routable": _BOOL,
        },
        {
            "in_flight": _INT,
            "served": _INT,
            "last_error": {"type": ["string", "null"]},
            "load": {"type": ["object", "null"]},
        },
    ),
    "AdvisoryStats": _object({"object": {"const": "advisory.stats"}, "kinds": _OBJ}),
    "ApiKey": _object(
        {
            "id": _STR,
            "object": {"const": "api_key"},
            "tenant_id": _STR,
            "name": _STR,
            "prefix": _STR,
            "created_at": _TIME_OR_NULL,
            "revoked_at": _TIME_OR_NULL,
        }
    ),
    "ApiKeyCreated": {
        "allOf": [
            {"$ref": "#/components/schemas/ApiKey"},
            _object({"key": {"type": "string", "description": "the secret: in this answer only"}}),
        ]
    },
    "Tenant": _object(
        {
            "id": _STR,
            "object": {"const": "tenant"},
            "name": _STR,
            "limits": _LIMITS,
            "effective_limits": _LIMITS,
        },
        {"created_at": _TIME_OR_NULL},
    ),
    "Health": _object({"status": {"const": "ok"}}),
    "Readiness": _object({"status": {"enum": ["ready", "not_ready"]}, "checks": _OBJ}),
}

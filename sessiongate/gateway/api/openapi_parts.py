"""The parts the OpenAPI document (`openapi.py`) is built from: the operation builder (`_op`) and its shorthands, the
parameters the paths share, the error and session schemas, and the components taken from the pydantic models the
handlers validate with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sessiongate.gateway.advisor.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER
from sessiongate.gateway.openai_responses import ResponsesBody
from sessiongate.gateway.openai_responses.openapi import RESPONSES_API_SCHEMAS

from .admin import AdminSessionPatch, RetainBody
from .keys import TENANT_ID_PATTERN, CreateKeyBody, TenantLimitsBody
from .lifecycle import ForkBody
from .openapi_responses import RESPONSE_SCHEMAS
from .schemas import SESSION_ID_PATTERN, ChatCompletionBody, CreateSessionBody, UpdateSessionBody
from .signals import AdviseBody, ToolResultBody, TypingBody, TypingWebhookBody

_REF = "#/components/schemas/{model}"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
_SESSION = {
    "type": "object",
    "required": ["id", "object", "tenant_id", "state", "priority", "metadata", "turn_count"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "session"},
        "tenant_id": {"type": "string"},
        "state": {"enum": ["active", "closed"]},
        "priority": {"type": "integer"},
        "metadata": {"type": "object"},
        "created_at": {"type": ["string", "null"]},
        "last_active_at": {"type": ["string", "null"]},
        "turn_count": {"type": "integer"},
        "prefix_breaks": {"type": "integer"},
    },
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _op(
    summary: str,
    ok: tuple[str, dict[str, Any]],
    *,
    body: str | None = None,
    body_required: bool = True,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[str, ...] = ("400", "401", "404"),
    auth: bool = True,
    extra: dict[str, Any] | None = None,
    extra_responses: dict[str, Any] | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    status, schema = ok
    content = _json(schema)
    if stream:  # OpenAPI 3.1: an event stream's `schema` describes each event
        content["text/event-stream"] = {"schema": _ref("ChatCompletionEvent")}
    op: dict[str, Any] = {"summary": summary, "responses": {status: {"description": "OK", "content": content}}}
    for code in errors:
        op["responses"][code] = {"description": "Error (OpenAI error format)", "content": _json(_ref("Error"))}
    op["responses"].update(extra_responses or {})
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": _json(_ref(body))}
    if params:
        op["parameters"] = params
    if not auth:
        op["security"] = []
    op.update(extra or {})
    return op


_SESSION_PARAM = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": SESSION_ID_PATTERN.pattern},
}
_KEY_PARAM = {"name": "key_id", "in": "path", "required": True, "schema": {"type": "string"}}
_TENANT_PARAM = {
    "name": "tenant_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": TENANT_ID_PATTERN},
}
_WORKER_PARAM = {"name": "worker_id", "in": "path", "required": True, "schema": {"type": "string"}}
_PRIORITY = {"type": "integer", "minimum": -1000, "maximum": 1000}
_TIME = {"type": "string", "format": "date-time"}
_ADMIN_SESSION_FILTERS = [
    {"name": "tenant_id", "in": "query", "required": False, "schema": {"type": "string", "pattern": TENANT_ID_PATTERN}},
    {"name": "state", "in": "query", "required": False, "schema": {"enum": ["active", "closed"]}},
    {"name": "active_after", "in": "query", "required": False, "schema": _TIME},
    {"name": "active_before", "in": "query", "required": False, "schema": _TIME},
    {"name": "min_priority", "in": "query", "required": False, "schema": _PRIORITY},
    {"name": "max_priority", "in": "query", "required": False, "schema": _PRIORITY},
    {"name": "min_prefix_breaks", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1, "maximum": 500}},
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
]
# The webhook is authenticated by its signature, not a key: see sessiongate/gateway/advisor/webhook.py.
_WEBHOOK_HEADERS = [
    {"name": TIMESTAMP_HEADER, "in": "header", "required": True, "schema": {"type": "string"}},
    {"name": SIGNATURE_HEADER, "in": "header", "required": True, "schema": {"type": "string"}},
]
_SIGNAL = {"$ref": _REF.format(model="Advisory"), "description": "What the advisor did."}
_LIMIT = {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}}
_SESSION_HEADERS = [
    {"name": "X-Session-Id", "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"}},
]
_ADMIN_ERRORS = ("400", "401", "403")


_RESPONSE_PARAM = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _responses_create() -> dict[str, Any]:
    """`POST /v1/responses`: a turn of the chain's session; `stream: true` answers with the Responses events."""
    op = _op(
        "OpenAI's Responses API: one turn of the session the response chain is",
        ("200", _ref("Response")),
        body="CreateResponseRequest",
        params=_SESSION_HEADERS,
        errors=("400", "401", "404", "409", "413", "429", "502", "503", "504"),
    )
    op["responses"]["200"]["content"]["text/event-stream"] = {"schema": _ref("ResponseEvent")}
    return op


def _session_op(summary: str, ok: tuple[str, dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """An operation of the tenant's on the session named in its path."""
    return _op(summary, ok, params=[_SESSION_PARAM], **fields)


def _admin_op(
    summary: str, ok: tuple[str, dict[str, Any]], *, of: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """An admin-key operation, on the object that path parameter `of` names if given (404 when it does not exist)."""
    if of is None:
        return _op(summary, ok, errors=_ADMIN_ERRORS, **fields)
    return _op(summary, ok, params=[of], errors=(*_ADMIN_ERRORS, "404"), **fields)


def _components() -> dict[str, Any]:
    models: dict[str, type[BaseModel]] = {
        "ChatCompletionRequest": ChatCompletionBody,
        "CreateResponseRequest": ResponsesBody,
        "ForkSessionRequest": ForkBody,
        "CreateSessionRequest": CreateSessionBody,
        "UpdateSessionRequest": UpdateSessionBody,
        "CreateKeyRequest": CreateKeyBody,
        "TenantLimitsRequest": TenantLimitsBody,
        "AdminSessionPatch": AdminSessionPatch,
        "RetainKvRequest": RetainBody,
        "TypingRequest": TypingBody,
        "TypingWebhookRequest": TypingWebhookBody,
        "ToolResultRequest": ToolResultBody,
        "AdviseRequest": AdviseBody,
    }
    schemas: dict[str, Any] = {"Error": _ERROR, "Session": _SESSION, **RESPONSE_SCHEMAS, **RESPONSES_API_SCHEMAS}
    for name, model in models.items():
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    return {
        "schemas": schemas,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "tenant API key"}},
    }

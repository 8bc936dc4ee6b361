"""The OpenAPI 3.1 document of the gateway's own endpoints, served at `GET /openapi.json`.

Request bodies come from the pydantic models the handlers validate with (one source of truth); response bodies
are described in `openapi_responses.py`, and every error is the OpenAI error object. The document is built once
per app and is what the fuzzing test (schemathesis) drives, so an endpoint missing here is an endpoint nobody
fuzzes: add it with its route (tests/security/test_openapi_document.py fails until you do). Answers are checked
against it: tests/gateway/test_openapi_responses.py sends real requests to every operation, and the fuzzing run
checks status codes, content types and bodies of everything it sends.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sessiongate.gateway.advisor.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER
from sessiongate.gateway.openai_responses import ResponsesBody
from sessiongate.gateway.openai_responses.openapi import RESPONSES_API_SCHEMAS

from .admin import AdminSessionPatch, RetainBody
from .keys import TENANT_ID_PATTERN, CreateKeyBody, TenantLimitsBody
from .lifecycle import ForkBody
from .openapi_responses import RESPONSE_SCHEMAS, list_of
from .schemas import SESSION_ID_PATTERN, ChatCompletionBody, CreateSessionBody, UpdateSessionBody
from .signals import AdviseBody, ToolResultBody, TypingBody, TypingWebhookBody

__all__ = ["openapi_document", "openapi_json"]

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


def openapi_document() -> dict[str, Any]:
    anything: dict[str, Any] = {"type": "object"}
    r = _ref
    paths: dict[str, Any] = {
        "/v1/chat/completions": {
            "post": _op(
                "One session turn (OpenAI-compatible; `stream: true` answers with server-sent events)",
                ("200", r("ChatCompletion")),
                body="ChatCompletionRequest",
                params=_SESSION_HEADERS,
                errors=("400", "401", "404", "409", "413", "429", "502", "503", "504"),
                stream=True,
            )
        },
        "/v1/responses": {"post": _responses_create()},
        "/v1/responses/{response_id}": {
            "get": _op("A stored response", ("200", r("Response")), params=[_RESPONSE_PARAM]),
            "delete": _op(
                "Delete a stored response (its chain's last: the session is closed)",
                ("200", r("ResponseDeleted")),
                params=[_RESPONSE_PARAM],
            ),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": _op(
                "The input items of a stored response",
                ("200", r("ResponseItemList")),
                params=[
                    _RESPONSE_PARAM,
                    {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer"}},
                    {"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
                ],
            )
        },
        "/v1/models": {"get": _op("The models the workers serve", ("200", list_of("Model")), errors=("401",))},
        "/v1/sessions": {
            "post": _op(
                "Create a session", ("201", _ref("Session")), body="CreateSessionRequest", errors=("400", "401", "409")
            ),
            "get": _op(
                "List the tenant's sessions, newest first",
                ("200", list_of("Session", paged=True)),
                params=[_LIMIT, {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}}],
            ),
        },
        "/v1/sessions/{session_id}": {
            "get": _session_op("A session", ("200", _ref("Session"))),
            "patch": _session_op("Change priority or metadata", ("200", _ref("Session")), body="UpdateSessionRequest"),
            "delete": _session_op("Delete a session with its turns", ("200", r("SessionDeleted"))),
        },
        "/v1/sessions/{session_id}/turns": {
            "get": _op("The session's turns", ("200", list_of("Turn")), params=[_SESSION_PARAM, _LIMIT])
        },
        "/v1/sessions/{session_id}/messages": {
            "get": _session_op("The session's context as chat messages", ("200", list_of("Message")))
        },
        "/v1/sessions/{session_id}/fork": {
            "post": _session_op(
                "A new session sharing this one's context (and KV) up to a turn",
                ("201", _ref("Session")),
                body="ForkSessionRequest",
                body_required=False,
                errors=("400", "401", "404", "409"),
            )
        },
        "/v1/sessions/{session_id}/close": {
            "post": _session_op("End the session and free its KV on every worker", ("200", _ref("Session")))
        },
        "/v1/sessions/{session_id}/typing": {
            "post": _session_op(
                "The user started or stopped typing: a hint to prefetch the session's KV",
                ("202", _SIGNAL),
                body="TypingRequest",
            )
        },
        "/v1/sessions/{session_id}/tool_results": {
            "post": _session_op(
                "A tool call of the session returned", ("202", r("ToolResult")), body="ToolResultRequest"
            )
        },
        "/v1/sessions/{session_id}/advise": {
            "post": _session_op(
                "An explicit hint that the session's next turn is coming",
                ("202", _SIGNAL),
                body="AdviseRequest",
                body_required=False,
            )
        },
        "/v1/webhooks/typing": {
            "post": _op(
                "Typing signal from a trusted sender, signed with the webhook secret (HMAC-SHA256 over "
                "`timestamp.body`); 404 while no secret is configured",
                ("202", _SIGNAL),
                body="TypingWebhookRequest",
                params=_WEBHOOK_HEADERS,
                errors=("400", "401", "404"),
                auth=False,
            )
        },
        "/v1/admin/sessions": {
            "get": _op(
                "Sessions across tenants, newest first",
                ("200", list_of("Session", paged=True)),
                params=_ADMIN_SESSION_FILTERS,
                errors=(*_ADMIN_ERRORS, "404"),  # 404: `after` names no session
            )
        },
        "/v1/admin/sessions/{session_id}": {
            "get": _admin_op(
                "A session with its turns, advisories and believed KV placement",
                ("200", r("AdminSession")),
                of=_SESSION_PARAM,
            ),
            "patch": _admin_op(
                "Change a session's priority", ("200", _ref("Session")), body="AdminSessionPatch", of=_SESSION_PARAM
            ),
            "delete": _admin_op(
                "Drop the session's KV on every worker, then delete it", ("200", r("SessionDeleted")), of=_SESSION_PARAM
            ),
        },
        "/v1/admin/sessions/{session_id}/kv/retain": {
            "post": _admin_op(
                "Every routable worker keeps the session's KV",
                ("200", r("SessionKv")),
                body="RetainKvRequest",
                body_required=False,
                of=_SESSION_PARAM,
            )
        },
        "/v1/admin/sessions/{session_id}/kv/drop": {
            "post": _admin_op(
                "Every routable worker (and the pool) drops the session's KV",
                ("200", r("SessionKv")),
                of=_SESSION_PARAM,
            )
        },
        "/v1/admin/sessions/{session_id}/close": {
            "post": _admin_op("Close a session: no more turns", ("200", _ref("Session")), of=_SESSION_PARAM)
        },
        "/v1/admin/workers": {"get": _admin_op("Workers: health, draining, load", ("200", list_of("Worker")))},
        "/v1/admin/workers/{worker_id}/drain": {
            "post": _admin_op("Route no new requests to the worker", ("200", r("Worker")), of=_WORKER_PARAM)
        },
        "/v1/admin/workers/{worker_id}/undrain": {
            "post": _admin_op("Route requests to the worker again", ("200", r("Worker")), of=_WORKER_PARAM)
        },
        "/v1/admin/advisories/stats": {
            "get": _admin_op("Advisory outcomes per signal kind", ("200", r("AdvisoryStats")))
        },
        "/v1/admin/keys": {
            "post": _admin_op(
                "Create a tenant key (its secret is in this answer only)",
                ("201", r("ApiKeyCreated")),
                body="CreateKeyRequest",
            ),
            "get": _admin_op(
                "List keys (never their secrets)",
                ("200", list_of("ApiKey")),
                params=[{"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"}}],
            ),
        },
        "/v1/admin/keys/{key_id}": {"delete": _admin_op("Revoke a key", ("200", r("ApiKey")), of=_KEY_PARAM)},
        "/openapi.json": {"get": _op("This document", ("200", anything), errors=(), auth=False)},
        "/v1/admin/tenants": {
            "get": _admin_op("Tenants, with their limit overrides and the limits they get", ("200", list_of("Tenant")))
        },
        "/v1/admin/tenants/{tenant_id}": {"get": _admin_op("A tenant", ("200", r("Tenant")), of=_TENANT_PARAM)},
        "/v1/admin/tenants/{tenant_id}/limits": {
            # Any tenant id may get limits before its first key or session: no 404.
            "put": _admin_op(
                "Replace the tenant's limit overrides (null: the global setting; 0: no limit)",
                ("200", r("Tenant")),
                body="TenantLimitsRequest",
                params=[_TENANT_PARAM],
            )
        },
        "/healthz": {"get": _op("Liveness", ("200", r("Health")), errors=(), auth=False)},
        "/readyz": {
            "get": _op(
                "Readiness: store and a routable worker",
                ("200", r("Readiness")),
                errors=(),
                auth=False,
                # Not ready is the same object, not an error: load balancers and people read its checks.
                extra_responses={"503": {"description": "Not ready", "content": _json(r("Readiness"))}},
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                ("200", {"type": "string"}),
                errors=(),
                auth=False,
                extra={
                    "responses": {
                        "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}
                    }
                },
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "sessiongate", "version": "0.1.0", "description": "An agent-session gateway for SGLang."},
        "paths": paths,
        "components": _components(),
        "security": [{"bearer": []}],
    }


async def openapi_json(request: Request) -> Response:
    """`GET /openapi.json`: public, like the OpenAI spec itself (it holds no tenant data)."""
    return JSONResponse(openapi_document())

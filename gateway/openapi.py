"""The OpenAPI 3.1 document of the gateway's own endpoints, served at `GET /openapi.json`.

Request bodies come from the pydantic models the handlers validate with (one source of truth); responses are
described by their shape where clients rely on it, and every error is the OpenAI error object. The document is
built once per app and is what the fuzzing test (schemathesis) drives, so an endpoint missing here is an
endpoint nobody fuzzes: add it with its route.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .keys_api import CreateKeyBody
from .schemas import SESSION_ID_PATTERN, ChatCompletionBody, CreateSessionBody, UpdateSessionBody

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
    },
}
_LIST = {"type": "object", "required": ["object", "data"], "properties": {"object": {"const": "list"}}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _op(
    summary: str,
    ok: tuple[str, dict[str, Any]],
    *,
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[str, ...] = ("400", "401", "404"),
    auth: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status, schema = ok
    op: dict[str, Any] = {"summary": summary, "responses": {status: {"description": "OK", "content": _json(schema)}}}
    for code in errors:
        op["responses"][code] = {"description": "Error (OpenAI error format)", "content": _json(_ref("Error"))}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json(_ref(body))}
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
_LIMIT = {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}}
_SESSION_HEADERS = [
    {"name": "X-Session-Id", "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"}},
]


def _components() -> dict[str, Any]:
    models: dict[str, type[BaseModel]] = {
        "ChatCompletionRequest": ChatCompletionBody,
        "CreateSessionRequest": CreateSessionBody,
        "UpdateSessionRequest": UpdateSessionBody,
        "CreateKeyRequest": CreateKeyBody,
    }
    schemas: dict[str, Any] = {"Error": _ERROR, "Session": _SESSION}
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
    admin = ("400", "401", "403")
    paths: dict[str, Any] = {
        "/v1/chat/completions": {
            "post": _op(
                "One session turn (OpenAI-compatible; `stream: true` answers with server-sent events)",
                ("200", anything),
                body="ChatCompletionRequest",
                params=_SESSION_HEADERS,
                errors=("400", "401", "404", "409", "413", "429", "502", "503", "504"),
            )
        },
        "/v1/models": {"get": _op("The models the workers serve", ("200", _LIST), errors=("401",))},
        "/v1/sessions": {
            "post": _op(
                "Create a session", ("201", _ref("Session")), body="CreateSessionRequest", errors=("400", "401", "409")
            ),
            "get": _op(
                "List the tenant's sessions, newest first",
                ("200", _LIST),
                params=[_LIMIT, {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}}],
            ),
        },
        "/v1/sessions/{session_id}": {
            "get": _op("A session", ("200", _ref("Session")), params=[_SESSION_PARAM]),
            "patch": _op(
                "Change priority or metadata",
                ("200", _ref("Session")),
                body="UpdateSessionRequest",
                params=[_SESSION_PARAM],
            ),
            "delete": _op("Delete a session with its turns", ("200", anything), params=[_SESSION_PARAM]),
        },
        "/v1/sessions/{session_id}/turns": {
            "get": _op("The session's turns", ("200", _LIST), params=[_SESSION_PARAM, _LIMIT])
        },
        "/v1/sessions/{session_id}/messages": {
            "get": _op("The session's context as chat messages", ("200", _LIST), params=[_SESSION_PARAM])
        },
        "/v1/admin/keys": {
            "post": _op(
                "Create a tenant key (its secret is in this answer only)",
                ("201", anything),
                body="CreateKeyRequest",
                errors=admin,
            ),
            "get": _op(
                "List keys (never their secrets)",
                ("200", _LIST),
                params=[{"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"}}],
                errors=admin,
            ),
        },
        "/v1/admin/keys/{key_id}": {
            "delete": _op("Revoke a key", ("200", anything), params=[_KEY_PARAM], errors=(*admin, "404"))
        },
        "/healthz": {"get": _op("Liveness", ("200", anything), errors=(), auth=False)},
        "/readyz": {
            "get": _op("Readiness: store and a routable worker", ("200", anything), errors=("503",), auth=False)
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

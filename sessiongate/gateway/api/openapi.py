"""The OpenAPI 3.1 document of the gateway's own endpoints, served at `GET /openapi.json`.

Request bodies come from the pydantic models the handlers validate with (one source of truth); response bodies
are described in `openapi_responses.py`, and every error is the OpenAI error object. The document is built once
per app and is what the fuzzing test (schemathesis) drives, so an endpoint missing here is an endpoint nobody
fuzzes: add it with its route (tests/security/test_openapi_document.py fails until you do). Answers are checked
against it: tests/gateway/test_openapi_responses.py sends real requests to every operation, and the fuzzing run
checks status codes, content types and bodies of everything it sends. The path table is here; what it is built from
(the operation builder, the parameters the paths share, the components) is in `openapi_parts.py`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .openapi_parts import (
    _ADMIN_ERRORS,
    _ADMIN_SESSION_FILTERS,
    _KEY_PARAM,
    _LIMIT,
    _RESPONSE_PARAM,
    _SESSION_HEADERS,
    _SESSION_PARAM,
    _SIGNAL,
    _TENANT_PARAM,
    _WEBHOOK_HEADERS,
    _WORKER_PARAM,
    _admin_op,
    _components,
    _json,
    _op,
    _ref,
    _responses_create,
    _session_op,
)
from .openapi_responses import list_of

__all__ = ["openapi_document", "openapi_json"]


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

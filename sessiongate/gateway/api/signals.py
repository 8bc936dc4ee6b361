"""The signal endpoints: typing (client and signed webhook), tool results, explicit hints; each hands its signal to
the advisor (`gateway.advisor`), which imports nothing of the HTTP layer.

Each answers 202 with what the advisor did (`fired`, `scheduled`, `refreshed`, `stopping`, `skipped`, `none`);
a signal is a hint, so its answer never waits for a prefetch.

    POST /v1/sessions/{id}/typing        {"state": "started" | "stopped"}
    POST /v1/webhooks/typing             {"session_id", "state", "ts", "tenant_id"?}, signed (see webhook.py)
    POST /v1/sessions/{id}/tool_results  {"tool_call_id", "content"}
    POST /v1/sessions/{id}/advise        {"kind"?, "expected_in_ms"?}
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sessiongate.gateway.advisor.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookRejected
from sessiongate.gateway.errors import AuthenticationFailed, NotFound
from sessiongate.gateway.state import gateway_state

from .auth import DEFAULT_TENANT, authenticate
from .schemas import parse_json, validate, validate_session_id

__all__ = ["signal_routes"]


class TypingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: Literal["started", "stopped"]


class TypingWebhookBody(TypingBody):
    session_id: str
    ts: float | None = None
    tenant_id: str = DEFAULT_TENANT


class ToolResultBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=256)
    content: str


class AdviseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["typing", "tool_result", "tool_call", "explicit"] = "explicit"
    expected_in_ms: int | None = Field(default=None, ge=0, le=3_600_000)


def _session_id(request: Request) -> str:
    return validate_session_id(request.path_params["session_id"], param="session_id")


async def _typing(request: Request, session_id: str, tenant_id: str, state: str) -> Response:
    gateway = gateway_state(request)
    await gateway.store.get_session(session_id, tenant_id=tenant_id)
    if state == "stopped":
        return JSONResponse(await gateway.advisor.stopped(session_id), status_code=202)
    return JSONResponse(await gateway.advisor.signal(session_id, tenant_id, "typing"), status_code=202)


async def typing(request: Request) -> Response:
    gateway = gateway_state(request)
    tenant_id = await authenticate(request, gateway.settings)
    body = validate(TypingBody, parse_json(await request.body()))
    return await _typing(request, _session_id(request), tenant_id, body.state)


async def typing_webhook(request: Request) -> Response:
    gateway = gateway_state(request)
    if gateway.webhook is None:
        raise NotFound("The typing webhook is disabled: set SESSIONGATE_WEBHOOK_SECRET.", code="webhook_disabled")
    raw = await request.body()
    try:
        await gateway.webhook.verify(
            request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER), raw, time.time()
        )
    except WebhookRejected as exc:
        raise AuthenticationFailed(exc.message, code="invalid_signature") from None
    body = validate(TypingWebhookBody, parse_json(raw))
    session_id = validate_session_id(body.session_id, param="session_id")
    return await _typing(request, session_id, body.tenant_id, body.state)


async def tool_result(request: Request) -> Response:
    gateway = gateway_state(request)
    tenant_id = await authenticate(request, gateway.settings)
    session_id = _session_id(request)
    body = validate(ToolResultBody, parse_json(await request.body()))
    call = await gateway.store.record_tool_result(
        session_id, body.tool_call_id, tenant_id=tenant_id, content=body.content, returned_at=datetime.now(UTC)
    )
    advisory = await gateway.advisor.on_tool_result(call, tenant_id)
    return JSONResponse(
        {
            "object": "session.tool_result",
            "session_id": session_id,
            "tool_call_id": call.call_id,
            "name": call.name,
            "duration_ms": call.duration_ms,
            "advisory": advisory,
        },
        status_code=202,
    )


async def advise(request: Request) -> Response:
    gateway = gateway_state(request)
    tenant_id = await authenticate(request, gateway.settings)
    session_id = _session_id(request)
    raw = await request.body()
    body = validate(AdviseBody, parse_json(raw) if raw else {})
    await gateway.store.get_session(session_id, tenant_id=tenant_id)
    expected = None if body.expected_in_ms is None else body.expected_in_ms / 1000
    return JSONResponse(
        await gateway.advisor.signal(session_id, tenant_id, body.kind, expected_in_s=expected), status_code=202
    )


def signal_routes() -> list[Route]:
    return [
        Route("/v1/sessions/{session_id}/typing", typing, methods=["POST"]),
        Route("/v1/webhooks/typing", typing_webhook, methods=["POST"]),
        Route("/v1/sessions/{session_id}/tool_results", tool_result, methods=["POST"]),
        Route("/v1/sessions/{session_id}/advise", advise, methods=["POST"]),
    ]

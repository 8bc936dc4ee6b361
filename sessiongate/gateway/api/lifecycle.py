"""A session's end and its forks, for the tenant that owns it.

    POST /v1/sessions/{id}/fork    {"at_turn": seq?, "session_id": id?, "metadata": {...}?} -> 201 the child
    POST /v1/sessions/{id}/close   -> 200 the session, closed, with what each worker dropped

A fork is a new session sharing the parent's context up to a turn (`sessions.forks`): the child's requests resend
that context, so their prompts start with the parent's tokens and are cache hits on the worker that holds them (or
from the pool). The router's belief of where the parent's KV lives is copied to the child, so the child's first turn
is routed to it as the parent's next turn would be. Closing a session refuses its further turns (409) and drops its
KV on every routable worker, every tier (`session_kv.kv_everywhere`), so its pages are free at once instead of
when eviction reaches them. `DELETE /v1/responses/{id}` of a chain's last response closes its session the same way.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sessiongate import sessions
from sessiongate.gateway.state import GatewayState, gateway_state
from sessiongate.gateway.turn.session_kv import kv_everywhere, kv_request

from .auth import authenticate
from .schemas import parse_json, validate, validate_session_id
from .sessions import serialize_session

__all__ = ["ForkBody", "close_and_free", "close_session", "fork_session"]


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at_turn: int | None = Field(default=None, ge=1)
    session_id: str | None = None
    metadata: dict[str, Any] | None = None


async def close_and_free(state: GatewayState, record: sessions.SessionRecord) -> dict[str, Any]:
    """Close the session and drop its KV everywhere; the closed session as JSON, with the workers' answers."""
    kv = await kv_request(state, record, priority=record.priority)
    closed = await state.store.update_session(record.id, tenant_id=record.tenant_id, state="closed")
    dropped = await kv_everywhere(state, record, "drop", kv)
    return {**serialize_session(closed), "kv": dropped}


async def close_session(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    session_id = validate_session_id(request.path_params["session_id"], param="session_id")
    record = await state.store.get_session(session_id, tenant_id=tenant_id)
    return JSONResponse(await close_and_free(state, record))


async def fork_session(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    parent_id = validate_session_id(request.path_params["session_id"], param="session_id")
    raw = await request.body()
    body = validate(ForkBody, parse_json(raw) if raw else {})
    child_id = validate_session_id(body.session_id, param="session_id") if body.session_id is not None else None
    child, shared = await state.store.fork_session(
        parent_id, tenant_id=tenant_id, child_id=child_id, at_seq=body.at_turn, metadata=body.metadata
    )
    belief = state.router.belief
    entry = belief.entry(parent_id)
    if entry is not None:  # the child's first turn is routed where the parent's KV is
        belief.replace(child.id, copy.deepcopy(entry))
    return JSONResponse({**serialize_session(child), "forked_from": parent_id, "shared_messages": shared}, 201)

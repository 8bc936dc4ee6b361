"""The session endpoints: create, list, show, update, delete; a session's turns and context messages."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sessiongate import sessions
from sessiongate.gateway.errors import InvalidRequest
from sessiongate.gateway.state import GatewayState, gateway_state

from .auth import authenticate
from .schemas import CreateSessionBody, UpdateSessionBody, parse_json, validate, validate_session_id

__all__ = [
    "create_session",
    "delete_session",
    "get_session",
    "list_messages",
    "list_sessions",
    "list_turns",
    "serialize_session",
    "serialize_turn",
    "serialize_turn_advisory",
    "update_session",
]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def serialize_session(record: sessions.SessionRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "session",
        "tenant_id": record.tenant_id,
        "state": record.state,
        "priority": record.priority,
        "metadata": record.metadata,
        "created_at": _iso(record.created_at),
        "last_active_at": _iso(record.last_active_at),
        "turn_count": record.turn_count,
        "prefix_breaks": record.prefix_breaks,
    }


def serialize_turn_advisory(advisory: sessions.TurnAdvisory | None) -> dict[str, Any] | None:
    if advisory is None:
        return None
    return {
        "id": advisory.id,
        "kind": advisory.kind,
        "outcome": advisory.outcome,
        "target_worker": advisory.target_worker,
    }


def serialize_turn(turn: sessions.TurnRecord) -> dict[str, Any]:
    usage = None
    if turn.prompt_tokens is not None or turn.completion_tokens is not None:
        usage = {
            "prompt_tokens": turn.prompt_tokens,
            "completion_tokens": turn.completion_tokens,
            "cached_tokens": turn.cached_tokens,
            # SGLang's report as it came (it may also name its storage backend), and the three tiers as numbers.
            "cached_tokens_details": turn.cached_tokens_details,
            "cached_tokens_by_tier": {
                "device": turn.cached_device or 0,
                "host": turn.cached_host or 0,
                "storage": turn.cached_storage or 0,
            },
        }
    return {
        "id": turn.id,
        "object": "session.turn",
        "session_id": turn.session_id,
        "seq": turn.seq,
        "status": turn.status,
        "input_messages": turn.input_messages,
        "context_reset": turn.context_reset,
        "session_source": turn.session_source,
        "prefix_break": turn.prefix_break,
        "output_message": turn.output_message,
        "finish_reason": turn.finish_reason,
        "model": turn.model,
        "worker": turn.worker,
        "error": turn.error,
        "usage": usage,
        "advisory": serialize_turn_advisory(turn.advisory),
        "timings": {
            "received_at": _iso(turn.received_at),
            "dispatched_at": _iso(turn.dispatched_at),
            "first_token_at": _iso(turn.first_token_at),
            "ended_at": _iso(turn.ended_at),
        },
        "tool_calls": [
            {
                "id": c.call_id,
                "name": c.name,
                "arguments": c.arguments,
                "requested_at": _iso(c.requested_at),
                "result": c.result,
                "returned_at": _iso(c.returned_at),
                "duration_ms": c.duration_ms,
            }
            for c in turn.tool_calls
        ],
    }


def _path_session_id(request: Request) -> str:
    return validate_session_id(request.path_params["session_id"], param="session_id")


def _limit(request: Request, default: int, maximum: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {maximum}.", param="limit")
    return int(raw)


def _check_priority(priority: int | None, state: GatewayState) -> None:
    """A tenant's sessions rank at most `tenant_max_priority` (the worker ranks their KV by it)."""
    bound = state.settings.tenant_max_priority
    if priority is not None and priority > bound:
        raise InvalidRequest(f"'priority' must be at most {bound} for a tenant's session.", param="priority")


async def create_session(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    raw = await request.body()
    body = validate(CreateSessionBody, parse_json(raw) if raw else {})
    if body.session_id is not None:
        validate_session_id(body.session_id, param="session_id")
    _check_priority(body.priority, state)
    record = await state.store.create_session(
        tenant_id=tenant_id, session_id=body.session_id, priority=body.priority, metadata=body.metadata
    )
    return JSONResponse(serialize_session(record), status_code=201)


async def list_sessions(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    after = request.query_params.get("after")
    if after is not None:
        validate_session_id(after, param="after")
    page = await state.store.list_sessions(tenant_id=tenant_id, limit=_limit(request, 20, 100), after=after)
    return JSONResponse(
        {"object": "list", "data": [serialize_session(s) for s in page.items], "has_more": page.has_more}
    )


async def get_session(request: Request) -> Response:
    state = gateway_state(request)
    record = await state.store.get_session(
        _path_session_id(request), tenant_id=await authenticate(request, state.settings)
    )
    return JSONResponse(serialize_session(record))


async def update_session(request: Request) -> Response:
    state = gateway_state(request)
    tenant_id = await authenticate(request, state.settings)
    body = validate(UpdateSessionBody, parse_json(await request.body()))
    _check_priority(body.priority, state)
    record = await state.store.update_session(
        _path_session_id(request), tenant_id=tenant_id, priority=body.priority, metadata=body.metadata
    )
    return JSONResponse(serialize_session(record))


async def delete_session(request: Request) -> Response:
    state = gateway_state(request)
    session_id = _path_session_id(request)
    await state.store.delete_session(session_id, tenant_id=await authenticate(request, state.settings))
    return JSONResponse({"id": session_id, "object": "session.deleted", "deleted": True})


async def list_turns(request: Request) -> Response:
    state = gateway_state(request)
    turns = await state.store.list_turns(
        _path_session_id(request),
        tenant_id=await authenticate(request, state.settings),
        limit=_limit(request, 100, 1000),
    )
    return JSONResponse({"object": "list", "data": [serialize_turn(t) for t in turns]})


async def list_messages(request: Request) -> Response:
    state = gateway_state(request)
    messages = await state.store.session_context(
        _path_session_id(request), tenant_id=await authenticate(request, state.settings)
    )
    return JSONResponse({"object": "list", "data": messages})

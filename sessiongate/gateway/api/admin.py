"""The admin API: sessions across tenants, their KV, workers, advisory statistics. Admin key only.

    GET    /v1/admin/sessions                  filters: tenant_id, state, active_after, active_before (ISO 8601),
                                               min_priority, max_priority, min_prefix_breaks; limit, after (cursor)
    GET    /v1/admin/sessions/{id}             the session, its turns, tool calls, advisories, believed KV
    PATCH  /v1/admin/sessions/{id}             {"priority"}
    POST   /v1/admin/sessions/{id}/kv/retain   {"priority"?, "ttl_ms"?}: every routable worker keeps its KV
    POST   /v1/admin/sessions/{id}/kv/drop     every routable worker (and the pool) drops its KV
    POST   /v1/admin/sessions/{id}/close       no more turns; its KV is left to decay
    DELETE /v1/admin/sessions/{id}             drops its KV everywhere, then deletes it
    GET    /v1/admin/workers                   health, draining, in flight, latest load report
    POST   /v1/admin/workers/{id}/drain        no new requests routed there (in-flight ones finish)
    POST   /v1/admin/workers/{id}/undrain
    GET    /v1/admin/advisories/stats          per signal kind: outcomes, precision, recall, lead time, bytes

KV operations go to the workers' extension endpoints; a worker that fails or lacks the extension is reported in
the answer (`error`), never fails the whole operation. Draining is this replica's routing state.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sessiongate import sessions
from sessiongate.gateway.errors import InvalidRequest, NotFound
from sessiongate.gateway.state import GatewayState, gateway_state
from sessiongate.gateway.turn.session_kv import kv_everywhere, kv_request

from .auth import require_admin
from .schemas import parse_json, validate, validate_session_id
from .sessions import serialize_session, serialize_turn

__all__ = ["admin_routes"]


class AdminSessionPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: int = Field(ge=-1000, le=1000)


class RetainBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: int | None = Field(default=None, ge=-1000, le=1000)
    ttl_ms: int = Field(default=300_000, ge=1, le=86_400_000)


def _admin(request: Request) -> GatewayState:
    state = gateway_state(request)
    require_admin(request, state.settings)
    return state


async def _session(request: Request, state: GatewayState) -> sessions.SessionRecord:
    return await state.store.find_session(validate_session_id(request.path_params["session_id"], param="session_id"))


def _query_time(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be an ISO 8601 time with a zone.", param=name) from None
    if value.tzinfo is None:
        raise InvalidRequest(f"'{name}' must be an ISO 8601 time with a zone.", param=name)
    return value


def _query_int(
    request: Request, name: str, *, default: int | None = None, low: int = -1000, high: int = 1000
) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"'{name}' must be an integer.", param=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"'{name}' must be from {low} to {high}.", param=name)
    return value


async def list_sessions(request: Request) -> Response:
    state = _admin(request)
    query = request.query_params
    session_state = query.get("state")
    if session_state is not None and session_state not in ("active", "closed"):
        raise InvalidRequest("'state' must be 'active' or 'closed'.", param="state")
    after = query.get("after")
    page = await state.store.search_sessions(
        tenant_id=query.get("tenant_id"),
        state=session_state,
        active_after=_query_time(request, "active_after"),
        active_before=_query_time(request, "active_before"),
        min_priority=_query_int(request, "min_priority"),
        max_priority=_query_int(request, "max_priority"),
        min_prefix_breaks=_query_int(request, "min_prefix_breaks", low=0, high=1_000_000),
        limit=_query_int(request, "limit", default=50, low=1, high=500) or 50,
        after=validate_session_id(after, param="after") if after is not None else None,
    )
    return JSONResponse(
        {"object": "list", "data": [serialize_session(s) for s in page.items], "has_more": page.has_more}
    )


def _advisory(record: sessions.AdvisoryRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "kind": record.kind,
        "target_worker": record.target_worker,
        "outcome": record.outcome,
        "created_at": record.created_at.isoformat(),
        "expires_at": record.expires_at.isoformat(),
        "resolved_at": record.resolved_at.isoformat() if record.resolved_at else None,
        "turn_id": record.turn_id,
        "detail": record.detail,
    }


async def show_session(request: Request) -> Response:
    state = _admin(request)
    record = await _session(request, state)
    turns = await state.store.list_turns(record.id, tenant_id=record.tenant_id, limit=1000)
    advisories = await state.store.list_advisories(record.id, tenant_id=record.tenant_id, limit=1000)
    return JSONResponse(
        {
            **serialize_session(record),
            "turns": [serialize_turn(t) for t in turns],
            "advisories": [_advisory(a) for a in advisories],
            "kv": state.router.belief.describe(record.id, state.router.clock()),
        }
    )


async def patch_session(request: Request) -> Response:
    state = _admin(request)
    record = await _session(request, state)
    body = validate(AdminSessionPatch, parse_json(await request.body()))
    updated = await state.store.update_session(record.id, tenant_id=record.tenant_id, priority=body.priority)
    return JSONResponse(serialize_session(updated))


async def retain_kv(request: Request) -> Response:
    state = _admin(request)
    record = await _session(request, state)
    raw = await request.body()
    body = validate(RetainBody, parse_json(raw) if raw else {})
    priority = record.priority if body.priority is None else body.priority
    kv = await kv_request(state, record, priority=priority, ttl_ms=body.ttl_ms)
    results = await kv_everywhere(state, record, "retain", kv)
    return JSONResponse({"object": "session.kv", "session_id": record.id, "operation": "retain", "workers": results})


async def drop_kv(request: Request) -> Response:
    state = _admin(request)
    record = await _session(request, state)
    results = await kv_everywhere(state, record, "drop", await kv_request(state, record, priority=record.priority))
    return JSONResponse({"object": "session.kv", "session_id": record.id, "operation": "drop", "workers": results})


async def close_session(request: Request) -> Response:
    state = _admin(request)
    record = await _session(request, state)
    closed = await state.store.update_session(record.id, tenant_id=record.tenant_id, state="closed")
    return JSONResponse(serialize_session(closed))


async def delete_session(request: Request) -> Response:
    state = _admin(request)
    record = await _session(request, state)
    results = await kv_everywhere(state, record, "drop", await kv_request(state, record, priority=record.priority))
    await state.store.delete_session(record.id, tenant_id=record.tenant_id)
    return JSONResponse({"id": record.id, "object": "session.deleted", "deleted": True, "kv": results})


def _worker_json(state: GatewayState, worker_id: str) -> dict[str, Any]:
    worker = state.workers.get(worker_id)
    if worker is None:
        raise NotFound(f"No worker {worker_id!r}.", code="worker_not_found")
    report = worker.load
    return {
        "id": worker.id,
        "object": "worker",
        "url": worker.url,
        "healthy": worker.healthy,
        "draining": worker.draining,
        "routable": worker.healthy and not worker.draining,
        "in_flight": worker.in_flight,
        "served": worker.served,
        "last_error": worker.last_error,
        "extension": worker.extension,
        "load": report.model_dump() if report is not None else None,
        "load_age_s": round(time.monotonic() - worker.load_received_at, 3) if report is not None else None,
    }


async def list_workers(request: Request) -> Response:
    state = _admin(request)
    return JSONResponse({"object": "list", "data": [_worker_json(state, w.id) for w in state.workers.workers]})


async def drain_worker(request: Request) -> Response:
    return _set_draining(request, True)


async def undrain_worker(request: Request) -> Response:
    return _set_draining(request, False)


def _set_draining(request: Request, draining: bool) -> Response:
    state = _admin(request)
    worker_id = request.path_params["worker_id"]
    _worker_json(state, worker_id)  # 404 for an unknown worker
    worker = state.workers.get(worker_id)
    assert worker is not None
    worker.draining = draining
    return JSONResponse(_worker_json(state, worker_id))


async def advisory_stats(request: Request) -> Response:
    state = _admin(request)
    return JSONResponse(await state.advisor.report())


def admin_routes() -> list[Route]:
    prefix = "/v1/admin"
    return [
        Route(f"{prefix}/sessions", list_sessions, methods=["GET"]),
        Route(f"{prefix}/sessions/{{session_id}}", show_session, methods=["GET"]),
        Route(f"{prefix}/sessions/{{session_id}}", patch_session, methods=["PATCH"]),
        Route(f"{prefix}/sessions/{{session_id}}", delete_session, methods=["DELETE"]),
        Route(f"{prefix}/sessions/{{session_id}}/kv/retain", retain_kv, methods=["POST"]),
        Route(f"{prefix}/sessions/{{session_id}}/kv/drop", drop_kv, methods=["POST"]),
        Route(f"{prefix}/sessions/{{session_id}}/close", close_session, methods=["POST"]),
        Route(f"{prefix}/workers", list_workers, methods=["GET"]),
        Route(f"{prefix}/workers/{{worker_id}}/drain", drain_worker, methods=["POST"]),
        Route(f"{prefix}/workers/{{worker_id}}/undrain", undrain_worker, methods=["POST"]),
        Route(f"{prefix}/advisories/stats", advisory_stats, methods=["GET"]),
    ]

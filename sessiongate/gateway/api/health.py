"""Operational endpoints: liveness, readiness, Prometheus metrics, and the models the workers serve."""

from __future__ import annotations

import asyncio
import time

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sessiongate import sessions
from sessiongate.gateway.shared import SharedState, SharedUnavailable
from sessiongate.gateway.state import gateway_state

from .auth import authenticate

__all__ = ["healthz", "list_models", "metrics", "readyz"]


async def healthz(request: Request) -> Response:
    """The process is up and serving HTTP."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready to serve turns: the store answers and at least one worker is routable."""
    state = gateway_state(request)
    checks: dict[str, str] = {}
    try:
        await state.store.ping()
        checks["store"] = "ok"
    except sessions.StoreError as exc:
        checks["store"] = f"unavailable: {exc}"
    checks["shared_state"] = await _shared_state_check(state.shared)
    routable = state.workers.routable()
    checks["workers"] = f"{len(routable)} of {len(state.workers.workers)} routable"
    ready = checks["store"] == "ok" and bool(routable)
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks}, status_code=200 if ready else 503
    )


async def _shared_state_check(shared: SharedState) -> str:
    """Not a condition of readiness: without Redis each replica decides with its own state (docs/architecture.md)."""
    if not shared.distributed:
        return "local (this replica's own memory)"
    try:
        await shared.ping()
    except SharedUnavailable as exc:
        return f"unavailable, deciding with this replica's own state: {exc}"
    return "ok"


async def metrics(request: Request) -> Response:
    state = gateway_state(request)
    for worker in state.workers.workers:
        state.metrics.observe_worker(worker)
    state.metrics.observe_shared(state.shared)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


_MODELS_TTL_S = 10.0


async def list_models(request: Request) -> Response:
    """The union of the routable workers' `/v1/models`, cached for a few seconds."""
    state = gateway_state(request)
    await authenticate(request, state.settings)
    cache = request.app.state.models_cache
    if cache["expires"] < time.monotonic():
        routable = state.workers.routable()
        answers = await asyncio.gather(*(state.worker_client.models(w.url) for w in routable), return_exceptions=True)
        models: dict[str, dict[str, object]] = {}
        for answer in answers:
            if isinstance(answer, httpx.HTTPError | ValueError):
                continue
            if isinstance(answer, BaseException):
                raise answer
            for model in answer:
                models.setdefault(str(model.get("id")), model)
        cache.update(data=list(models.values()), expires=time.monotonic() + _MODELS_TTL_S)
    return JSONResponse({"object": "list", "data": cache["data"]})

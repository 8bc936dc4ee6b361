"""The gateway's ASGI application: routes, middleware, error handlers, and the lifespan that owns resources.

`create_app(settings)` is the only constructor. The lifespan opens the shared HTTP client and the store,
starts the worker health loop, and yields the typed `GatewayState` that handlers read from
`request.state.gateway`. Tests inject `worker_transport` (an ASGI app speaking SGLang's HTTP API) and/or a
ready `store`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

import sessions

from .admin_api import admin_routes
from .advisor.signals import signal_routes
from .auth import authentication_mode
from .chat import chat_completions
from .errors import exception_handlers
from .health import healthz, list_models, metrics, readyz
from .keys_api import key_routes
from .limits import TenantLimits
from .metrics import GatewayMetrics
from .middleware import BodyLimit, HeaderLimit, RequestContext
from .openapi import openapi_json
from .routing import RoutingPolicy
from .sessions_api import (
    create_session,
    delete_session,
    get_session,
    list_messages,
    list_sessions,
    list_turns,
    update_session,
)
from .settings import GatewaySettings
from .state import GatewayState
from .tenancy import CacheSalts, KeyRing
from .upstream import WorkerClient, make_http_client
from .wiring import start_routing
from .workers import WorkerPool

__all__ = ["create_app"]

log = structlog.get_logger(__name__)


def _routes() -> list[Route]:
    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/sessions", create_session, methods=["POST"]),
        Route("/v1/sessions", list_sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id}", get_session, methods=["GET"]),
        Route("/v1/sessions/{session_id}", update_session, methods=["PATCH"]),
        Route("/v1/sessions/{session_id}", delete_session, methods=["DELETE"]),
        Route("/v1/sessions/{session_id}/turns", list_turns, methods=["GET"]),
        Route("/v1/sessions/{session_id}/messages", list_messages, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *key_routes(),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *signal_routes(),
        *admin_routes(),
    ]


def create_app(
    settings: GatewaySettings,
    *,
    worker_transport: httpx.AsyncBaseTransport | None = None,
    store: sessions.SessionStore | None = None,
    policy: RoutingPolicy | None = None,
) -> Starlette:
    gateway_metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, GatewayState]]:
        async with contextlib.AsyncExitStack() as stack:
            http = make_http_client(
                connect_timeout_s=settings.upstream_connect_timeout_s,
                read_timeout_s=settings.upstream_read_timeout_s,
                transport=worker_transport,
            )
            stack.push_async_callback(http.aclose)
            the_store = store
            if the_store is None:
                if settings.auto_migrate:
                    await sessions.upgrade(settings.database_url)
                the_store = sessions.SqlSessionStore(sessions.create_engine(settings.database_url))
                stack.push_async_callback(the_store.close)
            instance, run = settings.instance_id or f"{socket.gethostname()}:{settings.port}", secrets.token_hex(8)
            await _fail_stale_turns(the_store, settings, instance, run)
            pool = WorkerPool(
                settings.workers,
                http,
                health_timeout_s=settings.health_timeout_s,
                unhealthy_after=settings.unhealthy_after,
            )
            await pool.check_all()  # serve knowing which workers answer
            health = asyncio.create_task(pool.run_health_checks(settings.health_interval_s))
            stack.callback(health.cancel)
            salts = CacheSalts(_salt_secret(settings))
            routing = await start_routing(stack, settings, pool, http, the_store, policy, salts.for_tenant)
            state = GatewayState(
                settings=settings,
                http=http,
                workers=pool,
                worker_client=WorkerClient(http, read_timeout_s=settings.upstream_read_timeout_s),
                policy=routing.router.policy,
                store=the_store,
                metrics=gateway_metrics,
                keys=KeyRing(the_store, ttl_s=settings.key_cache_ttl_s),
                limits=TenantLimits(
                    max_concurrent=settings.tenant_max_concurrent,
                    tokens_per_minute=settings.tenant_tokens_per_minute,
                ),
                salts=salts,
                instance=instance,
                run=run,
                router=routing.router,
                advisor=routing.advisor,
                extension=routing.extension,
                webhook=routing.webhook,
            )
            log.info(
                "gateway_started",
                workers=list(settings.workers),
                policy=state.policy.name,
                authentication=authentication_mode(settings),
            )
            yield {"gateway": state}

    app = Starlette(
        routes=_routes(),
        middleware=[
            Middleware(RequestContext, metrics=gateway_metrics),
            Middleware(BodyLimit, max_bytes=settings.max_body_bytes),
            Middleware(HeaderLimit, max_bytes=settings.max_header_bytes),
        ],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.models_cache = {"expires": 0.0, "data": []}
    return app


async def _fail_stale_turns(store: sessions.SessionStore, settings: GatewaySettings, instance: str, run: str) -> None:
    """Turns left pending by a gateway that died: this replica's earlier runs' at once (a replica runs one process
    at a time, so nothing serves them any more); any replica's once none can still be serving them."""
    mine = await store.fail_pending_turns(
        gateway_instance=instance,
        except_run=run,
        error_message="The gateway restarted before this turn finished.",
    )
    if mine:
        log.warning("interrupted_turns_failed", count=mine, instance=instance)
    cutoff = datetime.now(UTC) - timedelta(seconds=settings.upstream_read_timeout_s)
    count = await store.fail_pending_turns(
        older_than=cutoff, error_message="The gateway stopped before this turn finished."
    )
    if count:
        log.warning("stale_turns_failed", count=count)


def _salt_secret(settings: GatewaySettings) -> bytes:
    if settings.cache_salt_secret:
        return settings.cache_salt_secret.encode()
    log.warning(
        "cache_salt_secret_random",
        detail="SESSIONGATE_CACHE_SALT_SECRET is not set: tenant cache salts change at every start and differ "
        "between replicas, so cached KV is not reused across them",
    )
    return secrets.token_bytes(32)

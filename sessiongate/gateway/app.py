"""The gateway's ASGI application: routes, middleware, error handlers, and the lifespan that owns resources.

`create_app(settings)` is the only constructor. The lifespan opens the shared HTTP client and the store,
starts the worker health loop, and yields the typed `GatewayState` that handlers read from
`request.state.gateway`. Tests inject a ready `store`; they serve fake workers on real sockets, as production's
workers are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import structlog
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from sessiongate import sessions

from .api.admin import admin_routes
from .api.auth import authentication_mode
from .api.health import healthz, list_models, metrics, readyz
from .api.keys import key_routes
from .api.lifecycle import close_session, fork_session
from .api.middleware import BodyLimit, HeaderLimit, RequestContext
from .api.openapi import openapi_json
from .api.sessions import (
    create_session,
    delete_session,
    get_session,
    list_messages,
    list_sessions,
    list_turns,
    update_session,
)
from .api.signals import signal_routes
from .api.tenancy import CacheSalts, KeyRing
from .errors import exception_handlers
from .observability.admission_metrics import AdmissionCollector
from .observability.metrics import GatewayMetrics
from .observability.store_metrics import StoreCollector
from .observability.tracing import Tracing, tracing_from_environ
from .openai_responses import create_response, delete_response, get_response, list_input_items
from .routing import RoutingPolicy
from .settings import GatewaySettings
from .shared import make_shared
from .state import GatewayState
from .turn.admission import AdmissionConfig, FairAdmission
from .turn.chat import chat_completions
from .turn.idempotency import LateWrites
from .turn.limits import TenantLimits
from .turn.loop_lag import LoopLagLimiter
from .turn.prefix_breaks import PrefixBreakNotes
from .turn.route import ChatRoute
from .webui.page import ui_routes
from .wiring import start_routing
from .workers.pool import WorkerPool
from .workers.upstream import WorkerClient, make_chat_pool, make_http_client, worker_ssl_context

__all__ = ["DuplicateInstance", "create_app"]

log = structlog.get_logger(__name__)


def _routes() -> list[Route]:
    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
        Route("/v1/sessions", create_session, methods=["POST"]),
        Route("/v1/sessions", list_sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id}", get_session, methods=["GET"]),
        Route("/v1/sessions/{session_id}", update_session, methods=["PATCH"]),
        Route("/v1/sessions/{session_id}", delete_session, methods=["DELETE"]),
        Route("/v1/sessions/{session_id}/turns", list_turns, methods=["GET"]),
        Route("/v1/sessions/{session_id}/messages", list_messages, methods=["GET"]),
        Route("/v1/sessions/{session_id}/fork", fork_session, methods=["POST"]),
        Route("/v1/sessions/{session_id}/close", close_session, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *key_routes(),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *signal_routes(),
        *admin_routes(),
        *ui_routes(),
    ]


def create_app(
    settings: GatewaySettings,
    *,
    store: sessions.SessionStore | None = None,
    policy: RoutingPolicy | None = None,
    tracing: Tracing | None = None,
) -> Starlette:
    """The gateway app. `tracing`: the test seam for traces; by default the standard `OTEL_*` variables decide
    (read when the lifespan starts: gateway.observability.tracing)."""
    gateway_metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, GatewayState]]:
        async with contextlib.AsyncExitStack() as stack:
            traces = tracing if tracing is not None else tracing_from_environ(os.environ)
            # Last out, so the spans of what the other resources ended go too; in a thread, as the exporter's last
            # requests may wait on the network.
            stack.push_async_callback(asyncio.to_thread, traces.shutdown)
            tls = await asyncio.to_thread(worker_ssl_context)  # reads the CA files
            http = make_http_client(
                connect_timeout_s=settings.upstream_connect_timeout_s,
                read_timeout_s=settings.upstream_read_timeout_s,
                worker_api_key=settings.worker_api_key,
                ssl_context=tls,
            )
            stack.push_async_callback(http.aclose)
            chat_pool = make_chat_pool(
                connect_timeout_s=settings.upstream_connect_timeout_s,
                read_timeout_s=settings.upstream_read_timeout_s,
                worker_api_key=settings.worker_api_key,
                ssl_context=tls,
            )
            stack.push_async_callback(chat_pool.close)
            the_store = store
            if the_store is None:
                if settings.auto_migrate:
                    await sessions.upgrade(settings.database_url)
                the_store = sessions.SqlSessionStore(
                    sessions.create_engine(settings.database_url, pool_size=settings.database_pool_size)
                )
                stack.push_async_callback(the_store.close)
            instance, run = (
                settings.instance_id or default_instance_id(settings.host, settings.port),
                secrets.token_hex(8),
            )
            await _lease_instance(the_store, settings, instance, run)
            stack.push_async_callback(_release_instance, the_store, instance, run)

            async def renew_lease() -> None:
                if not await the_store.heartbeat_instance(instance, run=run):
                    log.error("instance_lease_lost", instance=instance, detail="another process took this id over")

            stack.callback(asyncio.create_task(_every(settings.instance_lease_s / 3, renew_lease)).cancel)
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
            shared = make_shared(settings.redis_url, prefix=settings.redis_prefix, timeout_s=settings.redis_timeout_s)
            stack.push_async_callback(shared.aclose)
            if shared.distributed:
                log.info("shared_state", backend="redis", prefix=settings.redis_prefix, replica=f"{instance}/{run}")
            limits = TenantLimits(
                max_concurrent=settings.tenant_max_concurrent,
                tokens_per_minute=settings.tenant_tokens_per_minute,
                shared=shared,
            )

            async def reload_limits() -> None:
                limits.replace_overrides(await the_store.list_tenants(with_overrides=True))

            async def sweep_idempotency_keys() -> None:
                cutoff = datetime.now(UTC) - timedelta(seconds=settings.idempotency_retention_s)
                if count := await the_store.delete_idempotency_keys(created_before=cutoff):
                    log.info("idempotency_keys_expired", count=count)

            await reload_limits()
            for job, interval in (
                (reload_limits, settings.key_cache_ttl_s),
                (sweep_idempotency_keys, settings.idempotency_sweep_interval_s),
            ):
                stack.callback(asyncio.create_task(_every(interval, job)).cancel)
            salts = CacheSalts(_salt_secret(settings))
            routing = await start_routing(
                stack,
                settings,
                pool,
                http,
                the_store,
                shared,
                f"{instance}/{run}",
                limits,
                policy,
                salts.for_tenant,
                fast_http=chat_pool,
                tracing=traces,
            )
            gateway_metrics.watch_advisories(routing.advisor.stats)
            admission = FairAdmission(
                AdmissionConfig(
                    max_active=settings.admission_max_active_per_worker * max(len(settings.workers), 1),
                    max_wait_s=settings.admission_max_wait_s,
                    half_life_s=settings.admission_half_life_s,
                )
            )
            limiter = _loop_lag_limiter(admission, settings)
            if limiter is not None:
                stack.callback(asyncio.create_task(limiter.run()).cancel)
            gateway_metrics.registry.register(AdmissionCollector(admission, limiter))
            gateway_metrics.registry.register(StoreCollector(the_store))
            late_writes = LateWrites(retry_for_s=settings.upstream_read_timeout_s)
            stack.push_async_callback(late_writes.aclose)  # before the store closes (the stack unwinds in reverse)
            prefix_breaks = PrefixBreakNotes(the_store, gateway_metrics)
            stack.push_async_callback(prefix_breaks.aclose)
            state = GatewayState(
                settings=settings,
                http=http,
                workers=pool,
                worker_client=WorkerClient(http, chat_pool=chat_pool),
                policy=routing.router.policy,
                store=the_store,
                metrics=gateway_metrics,
                keys=KeyRing(the_store, ttl_s=settings.key_cache_ttl_s),
                limits=limits,
                admission=admission,
                idempotency_writes=late_writes,
                prefix_breaks=prefix_breaks,
                salts=salts,
                instance=instance,
                run=run,
                router=routing.router,
                advisor=routing.advisor,
                extension=routing.extension,
                webhook=routing.webhook,
                shared=shared,
                sharing=routing.sharing,
                tracing=traces,
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
            Middleware(
                ChatRoute,
                handler=chat_completions,
                metrics=gateway_metrics,
                max_body_bytes=settings.max_body_bytes,
                max_header_bytes=settings.max_header_bytes,
            ),
            Middleware(RequestContext, metrics=gateway_metrics),
            Middleware(BodyLimit, max_bytes=settings.max_body_bytes),
            Middleware(HeaderLimit, max_bytes=settings.max_header_bytes),
        ],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.models_cache = {"expires": 0.0, "data": []}
    return app


def default_instance_id(host: str, port: int) -> str:
    """`<hostname>:<port>`, or `<hostname>:<address>:<port>` for a replica bound to one address that is not loopback.

    A host name alone does not tell replicas apart where they share it: containers or network namespaces on one
    machine (`scripts/netns-cluster.sh`), each with its own address and the same port. Two such replicas with one id
    would refuse each other (`DuplicateInstance`); their addresses differ."""
    if host in ("", "0.0.0.0", "::", "localhost") or host.startswith("127.") or host == "::1":
        return f"{socket.gethostname()}:{port}"
    return f"{socket.gethostname()}:{host}:{port}"


class DuplicateInstance(RuntimeError):
    """Another live gateway holds this instance id: starting would fail its in-flight turns."""


# The active limit never goes below this many turns per worker: each worker keeps a batch to run.
_FLOOR_PER_WORKER = 4


def _loop_lag_limiter(admission: FairAdmission, settings: GatewaySettings) -> LoopLagLimiter | None:
    ceiling = admission.config.max_active
    if not ceiling or not settings.admission_loop_lag_target_ms:
        return None
    floor = min(ceiling, _FLOOR_PER_WORKER * max(len(settings.workers), 1))
    return LoopLagLimiter(
        admission, target_s=settings.admission_loop_lag_target_ms / 1000, ceiling=ceiling, floor=floor
    )


def _dead_on_this_host(holder: sessions.InstanceLease) -> bool:
    """Whether the holder ran on this host and its process is gone (a crash: no need to wait out its lease)."""
    if holder.host != socket.gethostname():
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user has that pid: alive
        return False
    return False


async def _lease_instance(store: sessions.SessionStore, settings: GatewaySettings, instance: str, run: str) -> None:
    """Claim the instance id, or raise `DuplicateInstance`. A holder elsewhere whose heartbeat is recent may have
    just crashed: its lease is watched until it would expire, and only a holder that keeps renewing it wins."""

    async def claim() -> sessions.InstanceLease | None:
        return await store.claim_instance(
            instance,
            run=run,
            host=socket.gethostname(),
            pid=os.getpid(),
            stale_before=datetime.now(UTC) - timedelta(seconds=settings.instance_lease_s),
            holder_dead=_dead_on_this_host,
        )

    holder = await claim()
    if holder is None:
        return
    log.warning(
        "instance_id_held", instance=instance, host=holder.host, pid=holder.pid, wait_s=settings.instance_lease_s
    )
    await asyncio.sleep(settings.instance_lease_s)
    holder = await claim()
    if holder is None:
        return
    age = (datetime.now(UTC) - holder.heartbeat_at).total_seconds()
    message = (
        f"Another live gateway uses instance id {instance!r} (host {holder.host}, pid {holder.pid}, heartbeat "
        f"{age:.1f} s ago). Give each replica its own SESSIONGATE_INSTANCE_ID: two with one id fail each "
        "other's in-flight turns."
    )
    log.error("duplicate_instance_id", instance=instance, host=holder.host, pid=holder.pid)
    raise DuplicateInstance(message)


async def _release_instance(store: sessions.SessionStore, instance: str, run: str) -> None:
    try:
        await store.release_instance(instance, run=run)
    except sessions.StoreError as exc:  # the lease then expires on its own
        log.warning("instance_lease_not_released", error=str(exc))


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


async def _every(interval_s: float, job: Callable[[], Awaitable[None]]) -> None:
    """Run `job` every `interval_s` until cancelled; a store outage skips a round instead of ending the loop."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job()
        except sessions.StoreError as exc:
            log.warning("periodic_job_failed", job=job.__name__, error=str(exc))


def _salt_secret(settings: GatewaySettings) -> bytes:
    if settings.cache_salt_secret:
        return settings.cache_salt_secret.encode()
    log.warning(
        "cache_salt_secret_random",
        detail="SESSIONGATE_CACHE_SALT_SECRET is not set: tenant cache salts change at every start and differ "
        "between replicas, so cached KV is not reused across them",
    )
    return secrets.token_bytes(32)

"""Building the routing side of the gateway at start-up: policy, router, load poller, advisor, webhook verifier
(the last three given the replicas' shared state, `gateway.shared`), and what a turn shares with the other
replicas (`turn_sharing`: whether there are replicas is asked here, once).

Kept out of `app.py` so the lifespan stays a list of resources: this returns the parts and registers their
background loops (load polling, the advisor's tick) on the lifespan's exit stack, which cancels them at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from sessiongate import sessions

from .advisor import Advisor, WebhookVerifier
from .advisor.toolkv import ToolKVPolicy
from .observability.tracing import NO_TRACING, Tracing
from .routing import CostModel, KVBelief, RoutingPolicy, make_policy
from .routing.router import Router
from .settings import GatewaySettings
from .shared import SharedState
from .turn.limits import TenantLimits
from .turn.sharing import OneReplica, turn_sharing
from .workers.extension import ExtensionClient
from .workers.http1 import Http1Pool
from .workers.load import LoadPoller
from .workers.pool import WorkerPool

__all__ = ["RoutingParts", "start_routing"]


@dataclass(frozen=True, slots=True)
class RoutingParts:
    router: Router
    advisor: Advisor
    extension: ExtensionClient
    webhook: WebhookVerifier | None
    sharing: OneReplica


def build_policy(settings: GatewaySettings) -> RoutingPolicy:
    cost = CostModel(
        typical_prefill_tokens=settings.typical_prefill_tokens,
        default_prefill_tokens_per_s=settings.default_prefill_tokens_per_s,
        default_decode_tokens_per_s=settings.default_decode_tokens_per_s,
        kv_bytes_per_token=settings.kv_bytes_per_token,
        host_to_device_bytes_per_s=settings.host_to_device_bytes_per_s,
        pool_to_device_bytes_per_s=settings.pool_to_device_bytes_per_s,
        host_to_device_latency_s=settings.host_to_device_latency_s,
        pool_to_device_latency_s=settings.pool_to_device_latency_s,
    )
    return make_policy(settings.routing_policy, cost=cost, reservation_margin_s=settings.reservation_margin_s)


async def start_routing(
    stack: contextlib.AsyncExitStack,
    settings: GatewaySettings,
    pool: WorkerPool,
    http: httpx.AsyncClient,
    store: sessions.SessionStore,
    shared: SharedState,
    replica: str,
    limits: TenantLimits,
    policy: RoutingPolicy | None = None,
    cache_salt_for: Callable[[str], str] | None = None,
    fast_http: Http1Pool | None = None,
    tracing: Tracing = NO_TRACING,
) -> RoutingParts:
    poller = LoadPoller(pool, http, interval_s=settings.load_poll_interval_s, fast=fast_http)
    await poller.poll_all()  # the first choice already sees the reports
    router = Router(
        policy or build_policy(settings),
        pool,
        belief=KVBelief(device_ttl_s=settings.kv_device_ttl_s, host_ttl_s=settings.kv_host_ttl_s),
        stale_after_s=poller.stale_after_s,
        shared=shared,
    )
    extension = ExtensionClient(http, timeout_s=settings.upstream_connect_timeout_s + 2.0)
    advisor = Advisor(
        store=store,
        router=router,
        extension=extension,
        ttl_s=settings.advisory_ttl_s,
        stop_grace_s=settings.advisory_stop_grace_s,
        lead_s=settings.advisory_lead_s,
        tool_result_trigger=settings.advisory_tool_result_trigger,
        tool_kv_enabled=settings.advisory_tool_kv,
        typing_quantile=settings.advisory_typing_quantile if settings.advisory_typing_timed else None,
        cache_salt_for=cache_salt_for,
        shared=shared,
        replica=replica,
        # A long tool's prefetch is timed by the context's load time from the pool, at the cost model's rates.
        tool_kv=ToolKVPolicy(
            kv_bytes_per_token=settings.kv_bytes_per_token,
            load_bytes_per_s=settings.pool_to_device_bytes_per_s,
            load_latency_s=settings.pool_to_device_latency_s,
        ),
        tracing=tracing,
    )
    stack.push_async_callback(advisor.aclose)
    for loop in (poller.run(), advisor.run(settings.advisor_tick_s)):
        task = asyncio.create_task(loop)
        stack.callback(task.cancel)
    webhook = WebhookVerifier(settings.webhook_secret, shared=shared) if settings.webhook_secret else None
    sharing = turn_sharing(shared, limits=limits, router=router, advisor=advisor)
    return RoutingParts(router=router, advisor=advisor, extension=extension, webhook=webhook, sharing=sharing)

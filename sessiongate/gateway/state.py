"""What the lifespan builds once and every handler reads from `request.state.gateway`."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from starlette.requests import Request

from sessiongate import sessions
from sessiongate.gateway.turn.admission import FairAdmission

from .advisor import Advisor, WebhookVerifier
from .api.tenancy import CacheSalts, KeyRing
from .observability.metrics import GatewayMetrics
from .observability.tracing import NO_TRACING, Tracing
from .routing import RoutingPolicy
from .routing.router import Router
from .settings import GatewaySettings
from .shared import SharedState
from .turn.idempotency import LateWrites
from .turn.limits import TenantLimits
from .turn.prefix_breaks import PrefixBreakNotes
from .turn.sharing import OneReplica
from .workers.extension import ExtensionClient
from .workers.pool import WorkerPool
from .workers.upstream import WorkerClient

__all__ = ["GatewayState", "gateway_state"]


@dataclass(frozen=True, slots=True)
class GatewayState:
    settings: GatewaySettings
    http: httpx.AsyncClient
    workers: WorkerPool
    worker_client: WorkerClient
    policy: RoutingPolicy
    store: sessions.SessionStore
    metrics: GatewayMetrics
    keys: KeyRing
    limits: TenantLimits
    # The chat turns' fair queue and its bound (gateway/turn/admission.py).
    admission: FairAdmission
    salts: CacheSalts
    router: Router
    advisor: Advisor
    extension: ExtensionClient
    webhook: WebhookVerifier | None
    # What the replicas share (LocalShared with one process; RedisShared with SESSIONGATE_REDIS_URL).
    shared: SharedState
    # What a turn shares with the other replicas (asked once, in `wiring.start_routing`).
    sharing: OneReplica
    # Idempotency keys' completions and releases retried after the store was unreachable (gateway/turn/idempotency.py).
    idempotency_writes: LateWrites
    # Turns whose resent history broke the stored context, examined in the background (gateway/turn/prefix_breaks.py).
    prefix_breaks: PrefixBreakNotes
    # This replica's name and this process's run (see `GatewaySettings.instance_id`).
    instance: str = ""
    run: str = ""
    # OpenTelemetry traces (NO_TRACING unless the OTEL_* variables configure an exporter:
    # gateway.observability.tracing).
    tracing: Tracing = NO_TRACING


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.state.gateway
    return state

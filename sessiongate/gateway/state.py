"""What the lifespan builds once and every handler reads from `request.state.gateway`."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from starlette.requests import Request

from sessiongate import sessions

from .admission import FairAdmission
from .advisor import Advisor, WebhookVerifier
from .extension import ExtensionClient
from .limits import TenantLimits
from .metrics import GatewayMetrics
from .router import Router
from .routing import RoutingPolicy
from .settings import GatewaySettings
from .shared import SharedState
from .tenancy import CacheSalts, KeyRing
from .tracing import NO_TRACING, Tracing
from .upstream import WorkerClient
from .workers import WorkerPool

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
    # The chat turns' fair queue and its bound (gateway/admission.py).
    admission: FairAdmission
    salts: CacheSalts
    router: Router
    advisor: Advisor
    extension: ExtensionClient
    webhook: WebhookVerifier | None
    # What the replicas share (LocalShared with one process; RedisShared with SESSIONGATE_REDIS_URL).
    shared: SharedState
    # This replica's name and this process's run (see `GatewaySettings.instance_id`).
    instance: str = ""
    run: str = ""
    # OpenTelemetry traces (NO_TRACING unless the OTEL_* variables configure an exporter: gateway.tracing).
    tracing: Tracing = NO_TRACING


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.state.gateway
    return state

"""What the lifespan builds once and every handler reads from `request.state.gateway`."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from starlette.requests import Request

import sessions

from .metrics import GatewayMetrics
from .routing import RoutingPolicy
from .settings import GatewaySettings
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


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.state.gateway
    return state

"""Choosing a worker for a request: pure policies over immutable views, and the beliefs they read.

Nothing here does I/O or reads a clock, so the same objects drive the gateway and the cluster simulator; the one
exception is `router.py`, the gateway's side of routing (it builds the views from the worker pool and keeps the
belief current), which this package's `__init__` does not import.
`make_policy(name, ...)` builds a policy by its setting name (`SESSIONGATE_ROUTING_POLICY`).
"""

from __future__ import annotations

from .belief import KVBelief
from .cache_aware import CacheAware
from .cost import CostModel, Placement, split_prompt
from .dynamo_cost import DynamoCost, DynamoWeights
from .policies import DEFAULT_RESERVATION_MARGIN_S, KVAware, LeastLoaded, RoundRobin, RoutingPolicy, Sticky
from .views import KVResidency, Reservation, RouteRequest, WorkerView

__all__ = [
    "DEFAULT_RESERVATION_MARGIN_S",
    "POLICY_NAMES",
    "CacheAware",
    "CostModel",
    "DynamoCost",
    "DynamoWeights",
    "KVAware",
    "KVBelief",
    "KVResidency",
    "LeastLoaded",
    "Placement",
    "Reservation",
    "RoundRobin",
    "RouteRequest",
    "RoutingPolicy",
    "Sticky",
    "WorkerView",
    "make_policy",
    "split_prompt",
]

POLICY_NAMES = ("round_robin", "least_loaded", "sticky", "cache_aware", "kv_aware", "dynamo_cost")


def make_policy(
    name: str, *, cost: CostModel | None = None, reservation_margin_s: float = DEFAULT_RESERVATION_MARGIN_S
) -> RoutingPolicy:
    if name == "round_robin":
        return RoundRobin()
    if name == "least_loaded":
        return LeastLoaded()
    if name == "sticky":
        return Sticky()
    if name == "cache_aware":
        return CacheAware()
    if name == "kv_aware":
        return KVAware(cost, reservation_margin_s=reservation_margin_s)
    if name == "dynamo_cost":
        return DynamoCost()
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")

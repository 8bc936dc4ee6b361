"""Choosing a worker for a request: the policy seam.

A policy is a pure object: it sees immutable views of the workers and the request and returns a choice. It does
no I/O, so the same objects can drive the cluster simulator. The foundation's policy is `LeastInFlight`;
the KV-aware router plugs in here later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LeastInFlight", "RouteRequest", "RoutingPolicy", "WorkerView"]


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may know about one routable worker."""

    id: str
    url: str
    in_flight: int


@dataclass(frozen=True, slots=True)
class RouteRequest:
    session_id: str
    tenant_id: str


class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        """Pick one of `workers` (never empty) for `request`."""
        ...


class LeastInFlight:
    """The worker with the fewest requests in flight through this gateway; ties rotate.

    Rotating among ties spreads sequential traffic instead of sending all of it to the first worker.
    """

    name = "least_in_flight"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        fewest = min(w.in_flight for w in workers)
        tied = [w for w in workers if w.in_flight == fewest]
        self._turn += 1
        return tied[self._turn % len(tied)]

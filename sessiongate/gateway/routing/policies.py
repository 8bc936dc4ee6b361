"""The routing policies: each a pure object choosing one worker from immutable views (no I/O, no clock).

- `round_robin`: rotate, ignoring everything. The floor any policy must beat.
- `least_loaded`: the fewest requests ahead (`WorkerView.load`); ties rotate, so sequential traffic spreads.
- `sticky`: the worker that served the session last, while it is routable: the stateful baseline that pins a
  session to its cache.
- `cache_aware`: prefix affinity with a load threshold, like SGLang's router (see `cache_aware.py`).
- `kv_aware` (the default): the lowest expected time to first token, `CostModel.score_s`, with an advisory
  reservation honoured while the reserved worker scores within `reservation_margin_s` of the best.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .cost import CostModel
from .views import RouteRequest, WorkerView

__all__ = ["DEFAULT_RESERVATION_MARGIN_S", "KVAware", "LeastLoaded", "RoundRobin", "RoutingPolicy", "Sticky"]


# How far (seconds of expected time to first token) a reserved worker may trail the best one and still be chosen.
DEFAULT_RESERVATION_MARGIN_S = 0.25


class RoutingPolicy(Protocol):
    """A routing rule. One that matches on `RouteRequest.prompt_text` says so with a class attribute
    `matches_prompt_text = True`: the router builds that text (a copy of the whole conversation) only for it."""

    name: str

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        """Pick one of `workers` (never empty) for `request`."""
        ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        ordered = sorted(workers, key=lambda w: w.id)
        choice = ordered[self._next % len(ordered)]
        self._next += 1
        return choice


class LeastLoaded:
    """The fewest requests ahead; ties rotate instead of always going to the first worker."""

    name = "least_loaded"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        fewest = min(w.load for w in workers)
        tied = sorted((w for w in workers if w.load == fewest), key=lambda w: w.id)
        self._turn += 1
        return tied[self._turn % len(tied)]


class Sticky:
    """Session affinity: the last worker of the session while routable, else the least loaded."""

    name = "sticky"

    def __init__(self) -> None:
        self._fallback = LeastLoaded()

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        for worker in workers:
            if worker.id == request.kv.last_worker:
                return worker
        return self._fallback.choose(request, workers)


class KVAware:
    """Lowest expected seconds to first token: queueing wait plus the cost of making the session's KV resident.

    There is no stickiness bonus: a session's previous worker wins only when its resident KV saves more than
    the extra wait costs. An advisory reservation (the advisor asked that worker to prefetch this session) is
    kept while the reserved worker scores within `reservation_margin_s` of the best, because its prefetch is
    probably under way and the score cannot see that yet; beyond the margin the reservation is dropped. Once the
    prefetch has landed the score sees its KV, and the reservation only breaks ties.
    """

    name = "kv_aware"

    def __init__(
        self, cost: CostModel | None = None, *, reservation_margin_s: float = DEFAULT_RESERVATION_MARGIN_S
    ) -> None:
        self.cost = cost or CostModel()
        self.reservation_margin_s = reservation_margin_s
        self._turn = 0

    def scores(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, float]:
        return {w.id: self.cost.score_s(request.prompt_tokens, request.kv, w) for w in workers}

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        scores = self.scores(request, workers)
        lowest = min(scores.values())
        # Equal scores (idle workers, a new session) rotate, so sequential traffic spreads.
        tied = [w for w in workers if scores[w.id] <= lowest + 1e-9]
        if len(tied) > 1:
            tied.sort(key=lambda w: (w.load, w.id))
            tied = [w for w in tied if w.load == tied[0].load]
        self._turn += 1
        best = tied[self._turn % len(tied)]
        reservation = request.reservation
        if reservation is not None and reservation.expires_at > request.now:
            # A landed prefetch needs no margin: the score already counts the KV it brought (a margin then would
            # only hold the request on a worker that got busier since). One still under way gets the margin.
            margin = 1e-9 if reservation.landed else self.reservation_margin_s
            for worker in workers:
                if worker.id == reservation.worker_id and scores[worker.id] <= scores[best.id] + margin:
                    return worker
        return best

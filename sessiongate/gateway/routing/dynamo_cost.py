"""`dynamo_cost`: NVIDIA Dynamo's KV-router cost as one of our policies, so our router is compared with the best
public cost model and not with a straw man of our own.

Read from ai-dynamo/dynamo (Apache-2.0; not copied, restated):

- `lib/kv-router/src/scheduling/selector/default.rs`, `DefaultWorkerScorer::worker_logit`: per worker,

      overlap_credit = overlap_score_credit * device_blocks + host_cache_hit_weight * host_blocks
                       + disk_cache_hit_weight * disk_blocks (+ shared_cache_multiplier * shared blocks)
      cost           = prefill_load_scale * max(0, raw_prefill_blocks - overlap_credit)
                       + decode_blocks + decode_active_request_weight * active_requests

  and the lowest cost wins (`router_temperature` 0: argmin, ties broken at random; above 0 a softmax sample).
- `lib/kv-router/src/scheduling/selector/mod.rs`: `raw_prefill_blocks` is (the worker's active prefill tokens +
  the request's input tokens) / block size; `decode_blocks` is the worker's potential decode blocks (the KV of the
  sequences it runs).
- `lib/kv-router/src/scheduling/config.rs`, the defaults used here: `overlap_score_credit` 1.0,
  `host_cache_hit_weight` 0.75, `disk_cache_hit_weight` 0.25, `prefill_load_scale` 1.0,
  `decode_active_request_weight` 0.0, `overlap_score_credit_decay` 0.0 (off, not modelled), temperature 0.0.

Our tiers map as device -> device, host tier -> host, shared pool -> disk (0.25, as issue 15 states it; Dynamo
counts a shared HiCache L3 with `shared_cache_multiplier`, 0.5 once `DYN_SHARED_CACHE_TYPE=hicache` is set:
`pool_weight=0.5` reproduces that). The tiers are disjoint prefix lengths from `split_prompt`, credited in whole
blocks. Dynamo keeps its own per-worker token accounting of what it routed; the simulator fills
`WorkerView.active_prefill_tokens` / `active_kv_tokens` exactly; the gateway fills both from the worker's load
report (`LoadReport.queued_prefill_tokens`, plus `typical_prefill_tokens` per request sent since the report, and
`device_kv_tokens_used`, SGLang's tokens held by running sequences); without a report it falls back to running
requests times `typical_prefill_tokens`.
Ties rotate (deterministic) instead of being drawn at random.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .cost import split_prompt
from .views import RouteRequest, WorkerView

__all__ = ["DynamoCost", "DynamoWeights"]


@dataclass(frozen=True, slots=True)
class DynamoWeights:
    block_tokens: int = 64
    device_weight: float = 1.0  # overlap_score_credit
    host_weight: float = 0.75  # host_cache_hit_weight
    pool_weight: float = 0.25  # disk_cache_hit_weight
    prefill_load_scale: float = 1.0
    active_request_weight: float = 0.0  # decode_active_request_weight
    # Only when a view has no token figures (the gateway today): tokens assumed per queued / running request.
    typical_prefill_tokens: int = 512


class DynamoCost:
    name = "dynamo_cost"

    def __init__(self, weights: DynamoWeights | None = None) -> None:
        self.weights = weights or DynamoWeights()
        self._turn = 0

    def _active_prefill_tokens(self, worker: WorkerView) -> int:
        if worker.active_prefill_tokens is not None:
            return worker.active_prefill_tokens + worker.in_flight_since_report * self.weights.typical_prefill_tokens
        queued = worker.in_flight if worker.queued is None else worker.queued + worker.in_flight_since_report
        return queued * self.weights.typical_prefill_tokens

    def _decode_tokens(self, worker: WorkerView) -> int:
        if worker.active_kv_tokens is not None:
            return worker.active_kv_tokens
        return (worker.running or 0) * self.weights.typical_prefill_tokens

    def cost(self, request: RouteRequest, worker: WorkerView) -> float:
        """Dynamo's cost of sending `request` to `worker`, in blocks (lower is better)."""
        w = self.weights
        size = w.block_tokens
        placement = split_prompt(request.prompt_tokens, request.kv, worker.id)
        credit = (
            w.device_weight * (placement.device // size)
            + w.host_weight * (placement.host // size)
            + w.pool_weight * (placement.pool // size)
        )
        raw_prefill = (self._active_prefill_tokens(worker) + request.prompt_tokens) / size
        decode = self._decode_tokens(worker) / size
        return w.prefill_load_scale * max(0.0, raw_prefill - credit) + decode + w.active_request_weight * worker.load

    def costs(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, float]:
        return {w.id: self.cost(request, w) for w in workers}

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        costs = self.costs(request, workers)
        lowest = min(costs.values())
        tied = sorted((w for w in workers if costs[w.id] <= lowest + 1e-9), key=lambda w: w.id)
        self._turn += 1
        return tied[self._turn % len(tied)]

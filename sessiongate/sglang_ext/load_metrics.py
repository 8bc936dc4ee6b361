"""The extension's load figures on the worker's Prometheus `/metrics` (SGLang's `--enable-metrics`).

SGLang serves `/metrics` from prometheus_client's multiprocess collector: each process writes its
metrics to files under `PROMETHEUS_MULTIPROC_DIR` and the HTTP process merges them. The scheduler
sets these gauges as it samples its counters (every ~50 ms, see `internals.scheduler_ops`), with
`multiprocess_mode="mostrecent"` like SGLang's own scheduler gauges, so a scrape sees the latest
value. The names carry the `sessiongate:` prefix next to SGLang's `sglang:` ones. Cumulative figures
(`pool_pages_rejected`, the pool calls' counts and seconds) are gauges too: the scheduler sets them from its
own totals, which a multiprocess counter cannot take.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GAUGES", "POOL_CALL_GAUGES", "PREFETCH_EVICTED", "LoadGauges"]

# Key of the scheduler's stats -> (metric name, help text).
GAUGES: Mapping[str, tuple[str, str]] = {
    "prefetches_in_flight": ("sessiongate:prefetches_in_flight", "Advisory prefetches not finished yet."),
    "prefill_tokens_per_s": ("sessiongate:prefill_tokens_per_s", "Prefill tokens computed per second, recently."),
    "decode_tokens_per_s": ("sessiongate:decode_tokens_per_s", "Tokens generated per second, recently."),
    "host_kv_tokens_used": ("sessiongate:host_kv_tokens_used", "HiCache host pool tokens in use."),
    "host_kv_tokens_total": ("sessiongate:host_kv_tokens_total", "HiCache host pool size in tokens."),
    "pool_pages_rejected": (
        "sessiongate:pool_pages_rejected",
        "Pool pages read since start that failed verification (each a cache miss, removed from the pool).",
    ),
}


# Field of each kind's pool figures (`pool_timing`, the stats' `pool_calls`) -> (metric name, help text); labelled
# by the kind of call, `op`: read, write, lookup.
POOL_CALL_GAUGES: Mapping[str, tuple[str, str]] = {
    "calls": ("sessiongate:pool_calls", "Batch calls to the shared KV pool since start, by kind (op)."),
    "pages": ("sessiongate:pool_call_pages", "Pages the batch calls to the shared KV pool named since start."),
    "seconds": ("sessiongate:pool_call_seconds", "Seconds spent in batch calls to the shared KV pool since start."),
    "recent_ms": (
        "sessiongate:pool_recent_call_ms",
        "Mean milliseconds per batch call to the shared KV pool over the last ~5 s (NaN: no call in that time).",
    ),
}


PREFETCH_EVICTED = (
    "sessiongate:prefetch_evicted_tokens",
    "Device KV tokens evicted to make room for advisory prefetches, by what they were (rank).",
)


@dataclass(frozen=True)
class LoadGauges:
    gauges: Mapping[str, Any]
    evicted: Any
    """`PREFETCH_EVICTED`, labelled by rank class (`kv_fate.KVFate.rank_class`)."""
    pool_calls: Mapping[str, Any]
    """`POOL_CALL_GAUGES`, labelled by kind of call (`op`)."""

    @classmethod
    def create(cls) -> LoadGauges:
        # Imported here: prometheus_client must be imported after SGLang set PROMETHEUS_MULTIPROC_DIR.
        from prometheus_client import Gauge

        return cls(
            {
                key: Gauge(name, documentation, multiprocess_mode="mostrecent")
                for key, (name, documentation) in GAUGES.items()
            },
            Gauge(*PREFETCH_EVICTED, ["rank"], multiprocess_mode="mostrecent"),
            {
                key: Gauge(name, documentation, ["op"], multiprocess_mode="mostrecent")
                for key, (name, documentation) in POOL_CALL_GAUGES.items()
            },
        )

    def update(self, stats: Mapping[str, Any]) -> None:
        for key, gauge in self.gauges.items():
            value = stats.get(key)
            if value is not None:
                gauge.set(value)
        for rank, tokens in (stats.get("prefetch_evicted_tokens") or {}).items():
            self.evicted.labels(rank).set(tokens)
        for kind, figures in (stats.get("pool_calls") or {}).items():
            for key, gauge in self.pool_calls.items():
                value = figures.get(key)
                gauge.labels(kind).set(math.nan if value is None else value)

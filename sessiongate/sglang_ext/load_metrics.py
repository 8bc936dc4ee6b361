"""The extension's load figures on the worker's Prometheus `/metrics` (SGLang's `--enable-metrics`).

SGLang serves `/metrics` from prometheus_client's multiprocess collector: each process writes its
metrics to files under `PROMETHEUS_MULTIPROC_DIR` and the HTTP process merges them. The scheduler
sets these gauges as it samples its counters (every ~50 ms, see `internals.scheduler_ops`), with
`multiprocess_mode="mostrecent"` like SGLang's own scheduler gauges, so a scrape sees the latest
value. The names carry the `sessiongate:` prefix next to SGLang's `sglang:` ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GAUGES", "PREFETCH_EVICTED", "LoadGauges"]

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


PREFETCH_EVICTED = (
    "sessiongate:prefetch_evicted_tokens",
    "Device KV tokens evicted to make room for advisory prefetches, by what they were (rank).",
)


@dataclass(frozen=True)
class LoadGauges:
    gauges: Mapping[str, Any]
    evicted: Any
    """`PREFETCH_EVICTED`, labelled by rank class (`kv_fate.KVFate.rank_class`)."""

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
        )

    def update(self, stats: Mapping[str, Any]) -> None:
        for key, gauge in self.gauges.items():
            value = stats.get(key)
            if value is not None:
                gauge.set(value)
        for rank, tokens in (stats.get("prefetch_evicted_tokens") or {}).items():
            self.evicted.labels(rank).set(tokens)

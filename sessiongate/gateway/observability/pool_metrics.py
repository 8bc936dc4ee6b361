"""The workers' calls to their shared KV pool on the gateway's `/metrics`, from each worker's latest load report.

A pool behind a slow or lossy link changes no answer and fails no request: only the worker's own timing of its pool
calls (`LoadReport.pool_calls`, `sglang_ext.pool_timing`) shows it. Per worker and kind of call (`op`: read, write,
lookup):

- `sessiongate_worker_pool_mean_call_seconds`: the mean call over the worker's last ~5 s, absent when it made none;
- `sessiongate_worker_pool_calls_total`, `sessiongate_worker_pool_call_seconds_total`,
  `sessiongate_worker_pool_pages_total`: since the worker started (they fall back to 0 when it restarts, which
  Prometheus' `rate()` takes as a counter reset). `rate(..._call_seconds_total) / rate(..._calls_total)` is the
  mean call over any range.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sessiongate.sglang_ext.protocol import PoolCallKind, PoolCalls

__all__ = ["WorkerPoolCollector"]


class WorkerPoolCollector(Collector):
    """Reads `reports` (worker id -> its latest `pool_calls`) when scraped; `GatewayMetrics.observe_worker` sets it."""

    def __init__(self) -> None:
        self.reports: dict[str, Mapping[PoolCallKind, PoolCalls]] = {}

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(self.reports)

    @staticmethod
    def _families(reports: Mapping[str, Mapping[PoolCallKind, PoolCalls]]) -> list[Metric]:
        labels = ["worker", "op"]
        mean = GaugeMetricFamily(
            "sessiongate_worker_pool_mean_call_seconds",
            "Mean duration of the worker's batch calls to its shared KV pool over its last ~5 s, by kind (read, write,"
            " lookup), as its latest load report says; absent when it made none.",
            labels=labels,
        )
        calls = CounterMetricFamily(
            "sessiongate_worker_pool_calls",
            "Batch calls the worker made to its shared KV pool since it started, by kind, as its latest load report"
            " says.",
            labels=labels,
        )
        seconds = CounterMetricFamily(
            "sessiongate_worker_pool_call_seconds",
            "Seconds the worker spent in batch calls to its shared KV pool since it started, by kind, as its latest"
            " load report says.",
            labels=labels,
        )
        pages = CounterMetricFamily(
            "sessiongate_worker_pool_pages",
            "Pages the worker's batch calls to its shared KV pool named since it started, by kind (read: pages asked"
            " for, write: pages written through, lookup: pages looked for), as its latest load report says.",
            labels=labels,
        )
        for worker, kinds in sorted(reports.items()):
            for kind, figures in sorted(kinds.items()):
                if figures.recent_ms is not None:
                    mean.add_metric([worker, kind], figures.recent_ms / 1000)
                calls.add_metric([worker, kind], figures.calls)
                seconds.add_metric([worker, kind], figures.seconds)
                pages.add_metric([worker, kind], figures.pages)
        return [mean, calls, seconds, pages]

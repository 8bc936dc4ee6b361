"""Prometheus metrics of one gateway, in a registry the app owns (no process-global state)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sessiongate.gateway.advisor.stats import PREFETCH_LATENCY_BUCKETS, AdvisoryStats
from sessiongate.gateway.shared import SharedState
from sessiongate.gateway.workers.pool import Worker

from .pool_metrics import WorkerPoolCollector

__all__ = ["AdvisoryCollector", "GatewayMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http_requests = Counter(
            "sessiongate_http_requests",
            "HTTP requests answered, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.turns = Counter(
            "sessiongate_turns",
            "Chat turns finished, by outcome and worker.",
            ["status", "worker"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "sessiongate_time_to_first_token_seconds",
            "Streamed turns: request received to first token.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.turn_latency = Histogram(
            "sessiongate_turn_seconds",
            "Turns: request received to last byte.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "sessiongate_prompt_tokens",
            "Prompt tokens by where their KV came from (device, host, storage, computed).",
            ["source"],
            registry=self.registry,
        )
        self.prefix_breaks = Counter(
            "sessiongate_prefix_breaks",
            "Turns whose resent history broke their session's stored context, by kind (gateway/turn/prefix_breaks.py).",
            ["kind"],
            registry=self.registry,
        )
        self.prefix_breaks_unexamined = Counter(
            "sessiongate_prefix_breaks_unexamined",
            "Turns that reset their session's context and were not examined for a prefix break: more were waiting "
            "than PrefixBreakNotes keeps (gateway/turn/prefix_breaks.py).",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "sessiongate_worker_in_flight", "Requests in flight per worker.", ["worker"], registry=self.registry
        )
        self.worker_up = Gauge(
            "sessiongate_worker_healthy", "1 if the worker is routable.", ["worker"], registry=self.registry
        )
        self.prefetch_evicted = Gauge(
            "sessiongate_worker_prefetch_evicted_tokens",
            "Device KV tokens a worker evicted to make room for advisory prefetches, by what they were (its load"
            " report): expired_hint, unhinted, hinted (a lower priority).",
            ["worker", "rank"],
            registry=self.registry,
        )
        # The workers' own figures, from their latest load report (gateway/workers/load.py), so that one scrape of the
        # gateway shows each worker's queue: the dashboard's worker panels need no scrape of the workers.
        self.worker_running = Gauge(
            "sessiongate_worker_running_requests",
            "Requests the worker is running, as its latest load report says.",
            ["worker"],
            registry=self.registry,
        )
        self.worker_queued = Gauge(
            "sessiongate_worker_queued_requests",
            "Requests waiting in the worker's queue, as its latest load report says.",
            ["worker"],
            registry=self.registry,
        )
        self.worker_kv_used = Gauge(
            "sessiongate_worker_device_kv_used_ratio",
            "Share of the worker's device KV pool in use, as its latest load report says.",
            ["worker"],
            registry=self.registry,
        )
        self.worker_prefetches = Gauge(
            "sessiongate_worker_prefetches_in_flight",
            "Advisory prefetches the worker has not finished, as its latest load report says.",
            ["worker"],
            registry=self.registry,
        )
        self.shared_available = Gauge(
            "sessiongate_shared_state_available",
            "1 while the replicas' shared state (Redis) answers, 0 while this replica decides with its own state;"
            " 1 without Redis (one replica).",
            registry=self.registry,
        )
        self.shared_failures = Counter(
            "sessiongate_shared_state_failures",
            "Calls to the shared state (Redis) that failed: each one decided with this replica's own state.",
            registry=self.registry,
        )
        self._shared_failures_seen = 0
        self.advisories = AdvisoryCollector()
        self.registry.register(self.advisories)
        # Each worker's calls to its shared KV pool (the link to the pool is visible nowhere else).
        self.worker_pool = WorkerPoolCollector()
        self.registry.register(self.worker_pool)
        # Label children by their values: `labels()` takes a lock and builds a key on every call, per request.
        self._requests_by: dict[tuple[str, int], Counter] = {}
        self._turns_by: dict[tuple[str, str], Counter] = {}
        self._prompt_by = {s: self.prompt_tokens.labels(s) for s in ("device", "host", "storage", "cached", "computed")}

    def count_request(self, route: str, status: int) -> None:
        child = self._requests_by.get((route, status))
        if child is None:
            child = self._requests_by[(route, status)] = self.http_requests.labels(route, str(status))
        child.inc()

    def count_turn(self, status: str, worker: str) -> None:
        child = self._turns_by.get((status, worker))
        if child is None:
            child = self._turns_by[(status, worker)] = self.turns.labels(status, worker)
        child.inc()

    def observe_shared(self, shared: SharedState) -> None:
        """Set the shared state's figures (when `/metrics` is scraped)."""
        self.shared_available.set(1 if shared.available else 0)
        if shared.failures > self._shared_failures_seen:
            self.shared_failures.inc(shared.failures - self._shared_failures_seen)
            self._shared_failures_seen = shared.failures

    def observe_worker(self, worker: Worker) -> None:
        """Set the worker's gauges (when `/metrics` is scraped): its health and in-flight count here, and its queue,
        KV use, prefetches and pool calls from its latest load report (none before its first)."""
        self.in_flight.labels(worker.id).set(worker.in_flight)
        self.worker_up.labels(worker.id).set(1 if worker.healthy and not worker.draining else 0)
        report = worker.load
        if report is None:
            return
        self.worker_running.labels(worker.id).set(report.running_requests)
        self.worker_queued.labels(worker.id).set(report.queued_requests)
        total = report.device_kv_tokens_total
        self.worker_kv_used.labels(worker.id).set(report.device_kv_tokens_used / total if total else 0.0)
        self.worker_prefetches.labels(worker.id).set(report.prefetches_in_flight)
        for rank, tokens in report.prefetch_evicted_tokens.items():
            self.prefetch_evicted.labels(worker.id, rank).set(tokens)
        self.worker_pool.reports[worker.id] = report.pool_calls

    def watch_advisories(self, stats: AdvisoryStats) -> None:
        """Report this advisor's figures (the app calls it once its advisor exists)."""
        self.advisories.stats = stats

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def record_prompt_sources(
        self, prompt_tokens: int | None, details: dict[str, object] | None, cached_tokens: int | None
    ) -> None:
        if not prompt_tokens:
            return
        cached = 0
        if details:
            for source in ("device", "host", "storage"):
                value = details.get(source)
                if isinstance(value, int) and value > 0:
                    self._prompt_by[source].inc(value)
                    cached += value
        elif cached_tokens:
            self._prompt_by["cached"].inc(cached_tokens)
            cached = cached_tokens
        self._prompt_by["computed"].inc(max(prompt_tokens - cached, 0))


class AdvisoryCollector(Collector):
    """The advisor's figures, read from its `AdvisoryStats` when `/metrics` is scraped: the advisor only adds to
    plain integers as signals and prefetches happen (no metric objects made or looked up on its paths)."""

    def __init__(self) -> None:
        self.stats: AdvisoryStats | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families(AdvisoryStats())

    def collect(self) -> Iterable[Metric]:
        return self._families(self.stats if self.stats is not None else AdvisoryStats())

    @staticmethod
    def _families(stats: AdvisoryStats) -> list[Metric]:
        signals = CounterMetricFamily(
            "sessiongate_advisory_signals", "Advisory signals handled, by kind.", labels=["kind"]
        )
        outcomes = CounterMetricFamily(
            "sessiongate_advisory_outcomes",
            "Advisories settled, by signal kind and outcome (used, late, wasted, cancelled; a follow-up request no "
            'advisory foresaw is kind "none", outcome "missed").',
            labels=["kind", "outcome"],
        )
        for kind, kind_stats in sorted(stats.kinds.items()):
            signals.add_metric([kind], kind_stats.signals)
            for outcome, count in kind_stats.outcomes.items():
                outcomes.add_metric([kind, outcome], count)
        outcomes.add_metric(["none", "missed"], stats.missed)
        sent = CounterMetricFamily(
            "sessiongate_prefetches_sent", "Prefetch requests sent to workers, by target tier.", labels=["target"]
        )
        for target in ("device", "host"):
            sent.add_metric([target], stats.prefetches_sent.get(target, 0))
        moved = CounterMetricFamily(
            "sessiongate_prefetch_bytes", "Bytes of KV the finished prefetches loaded, as the workers reported them."
        )
        moved.add_metric([], stats.prefetch_bytes)
        latency = stats.prefetch_latency
        cumulative, buckets = 0, []
        for bound, count in zip((*PREFETCH_LATENCY_BUCKETS, float("inf")), latency.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        histogram = HistogramMetricFamily(
            "sessiongate_prefetch_seconds",
            "Prefetches that finished: sent to done.",
            buckets=buckets,
            sum_value=latency.total_s,
        )
        return [signals, outcomes, sent, moved, histogram]

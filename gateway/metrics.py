"""Prometheus metrics of one gateway, in a registry the app owns (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["GatewayMetrics"]

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
        self.in_flight = Gauge(
            "sessiongate_worker_in_flight", "Requests in flight per worker.", ["worker"], registry=self.registry
        )
        self.worker_up = Gauge(
            "sessiongate_worker_healthy", "1 if the worker is routable.", ["worker"], registry=self.registry
        )

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
                    self.prompt_tokens.labels(source).inc(value)
                    cached += value
        elif cached_tokens:
            self.prompt_tokens.labels("cached").inc(cached_tokens)
            cached = cached_tokens
        self.prompt_tokens.labels("computed").inc(max(prompt_tokens - cached, 0))

"""The session store's figures on `/metrics`, read from `SessionStore.health()` when scraped (nothing on a call's path).

An unreachable database shows in the oldest call's wait within one scrape, long before a call times out into a 503.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sessiongate import sessions

__all__ = ["StoreCollector"]


class StoreCollector(Collector):
    def __init__(self, store: sessions.SessionStore) -> None:
        self.store = store

    def collect(self) -> Iterable[Metric]:
        health = self.store.health()
        calls = GaugeMetricFamily("sessiongate_store_calls_in_flight", "Calls to the session store waiting for it now.")
        calls.add_metric([], health.calls_in_flight)
        oldest = GaugeMetricFamily(
            "sessiongate_store_oldest_call_seconds",
            "How long the oldest call to the session store still in flight has waited (0 with none).",
        )
        oldest.add_metric([], round(health.oldest_call_s, 3))
        unavailable = CounterMetricFamily(
            "sessiongate_store_unavailable",
            "Calls to the session store that failed because it could not be reached or was busy (each a 503 or a"
            " retried write).",
        )
        unavailable.add_metric([], health.unavailable)
        return [calls, oldest, unavailable]

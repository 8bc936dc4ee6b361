"""The fair queue's figures on `/metrics`, read from `FairAdmission` when scraped (nothing on the turn's path)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sessiongate.gateway.turn.admission import FairAdmission
from sessiongate.gateway.turn.loop_lag import LoopLagLimiter

__all__ = ["AdmissionCollector"]


class AdmissionCollector(Collector):
    def __init__(self, admission: FairAdmission, limiter: LoopLagLimiter | None = None) -> None:
        self.admission = admission
        self.limiter = limiter

    def collect(self) -> Iterable[Metric]:
        gate = self.admission
        active = GaugeMetricFamily("sessiongate_admission_active", "Chat turns in their active phase.")
        active.add_metric([], gate.active)
        waiting = GaugeMetricFamily("sessiongate_admission_waiting", "Chat turns waiting in the fair queue.")
        waiting.add_metric([], gate.waiting)
        started = CounterMetricFamily("sessiongate_admission_started", "Chat turns admitted to their active phase.")
        started.add_metric([], gate.started)
        shed = CounterMetricFamily(
            "sessiongate_admission_shed",
            "Chat turns refused at once because their predicted wait passed the bound, by status (429: the tenant "
            "over its fair share, 503: the gateway saturated).",
            labels=["status"],
        )
        for status, count in sorted(gate.shed_counts.items()):
            shed.add_metric([str(status)], count)
        mean = GaugeMetricFamily(
            "sessiongate_admission_mean_active_seconds", "Recent mean time a turn spends in its active phase."
        )
        mean.add_metric([], gate.mean_active_s or 0.0)
        limit = GaugeMetricFamily(
            "sessiongate_admission_limit",
            "Chat turns allowed in their active phase now: the configured maximum, or less while the event loop lags.",
        )
        limit.add_metric([], gate.limit)
        interval = GaugeMetricFamily(
            "sessiongate_admission_start_interval_seconds",
            "Seconds between turn starts at saturation, as the queue predicts waits and spaces returns with them.",
        )
        interval.add_metric([], gate.per_start_s())
        promised, horizon = gate.returns()
        returns = GaugeMetricFamily(
            "sessiongate_admission_returns_promised",
            "Shed turns told when to come back (Retry-After) and still expected.",
        )
        returns.add_metric([], promised)
        ahead = GaugeMetricFamily(
            "sessiongate_admission_return_horizon_seconds",
            "How far ahead the last promised return is: about the wait a turn shed now is told.",
        )
        ahead.add_metric([], horizon)
        waits = HistogramMetricFamily(
            "sessiongate_admission_wait_seconds",
            "How long admitted chat turns waited in the fair queue (0 for a turn that started at once).",
        )
        waits.add_metric([], gate.waits.cumulative(), gate.waits.total_s)
        figures: list[Metric] = [active, waiting, started, shed, mean, limit, interval, returns, ahead, waits]
        if self.limiter is not None:
            lag = GaugeMetricFamily(
                "sessiongate_event_loop_lag_seconds", "How late the gateway's event loop runs a due timer, recently."
            )
            lag.add_metric([], self.limiter.lag_s)
            figures.append(lag)
        return figures

"""The load test's report (`load_test`): what its client and the gateway recorded, and the summary it prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadReport"]


@dataclass
class LoadReport:
    config: dict[str, Any]
    turns_sent: int = 0
    turns_ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # Each transport error as "<exception>: <message>".
    error_details: dict[str, int] = field(default_factory=dict)
    throughput_turns_per_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    direct_latency_ms: dict[str, float] = field(default_factory=dict)
    added_latency_ms: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    rss_mb: list[tuple[float, float]] = field(default_factory=list)
    # Turns refused with 429/503 and Retry-After, by status (each sent again after the wait), and how long the
    # refusals took to come.
    shed: dict[str, int] = field(default_factory=dict)
    shed_latency_ms: dict[str, float] = field(default_factory=dict)
    added_p99_over_p50: float = 0.0
    # The steady part of the run (`_Tally.steady_from`): from when, its throughput and latencies, and what the gateway
    # added to them (the figures the targets are read from; the fields above cover every turn, the first ones too).
    steady_from_s: float = 0.0
    steady_throughput_turns_per_s: float = 0.0
    steady_latency_ms: dict[str, float] = field(default_factory=dict)
    steady_added_latency_ms: dict[str, float] = field(default_factory=dict)
    steady_added_p99_over_p50: float = 0.0
    # The refusals sent in the steady part (those of the first seconds wait behind every session's first turn).
    steady_shed_latency_ms: dict[str, float] = field(default_factory=dict)
    # Per session, in the steady part: tokens served
    # (usage.total_tokens) and turns answered, against the fair share (`load_figures.fairness`).
    fairness_tokens: dict[str, float] = field(default_factory=dict)
    fairness_turns: dict[str, float] = field(default_factory=dict)
    # The sessions the shares are of: those answered before the steady part began, the heavy ones left out.
    fairness_sessions: int = 0
    # With heavy sessions: the shares above are the other sessions'; each heavy session's tokens against that fair
    # share (the mean of the heavy ones).
    heavy_share_of_fair: float = 0.0
    rss: dict[str, float] = field(default_factory=dict)
    # From the store: each answered turn's wait from the gateway's handler to its dispatch to a worker (SQLite only).
    store_dispatch_wait_ms: dict[str, float] = field(default_factory=dict)
    # How late the client's own event loop woke from a 50 ms sleep: a latency the client measures that is its own.
    client_lag_ms: dict[str, float] = field(default_factory=dict)
    # From a quiet client (`shed_probe`), over the steady part: how fast its refusals came, and its admitted turns.
    shed_probe: dict[str, Any] = field(default_factory=dict)
    # The gateway's own figure of the waits in its fair queue, after the warm-up (`load_figures.queue_waits`).
    queue_wait: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        lat, direct, added = self.latency_ms, self.direct_latency_ms, self.added_latency_ms
        config, rss, tokens = self.config, self.rss, self.fairness_tokens
        steady_shed = self.steady_shed_latency_ms
        rows_total = sum(n for key, n in self.rows.items() if key.startswith("turns_"))
        lines = [
            f"sessions {config['sessions']}, {config['duration_s']} s, {config['workers']} fake workers,"
            f" workload {config['workload']}, think time {config['think_time_s']} s",
            f"turns sent {self.turns_sent}, ok {self.turns_ok}, errors {self.errors or 0}, shed {self.shed or 0}",
            *([f"error details {self.error_details}"] if self.error_details else []),
            f"throughput {self.throughput_turns_per_s:.1f} turns/s",
            f"latency ms through the gateway p50 {lat.get('p50', 0):.1f} p99 {lat.get('p99', 0):.1f}",
            f"latency ms straight to a worker p50 {direct.get('p50', 0):.1f} p99 {direct.get('p99', 0):.1f}",
            f"added by the gateway p50 {added.get('p50', 0):.1f} p99 {added.get('p99', 0):.1f}"
            f" (p99 / p50 {self.added_p99_over_p50:.2f})",
            f"steady from {self.steady_from_s:.1f} s: {self.steady_throughput_turns_per_s:.1f} turns/s, latency ms p50"
            f" {self.steady_latency_ms.get('p50', 0):.1f} p99 {self.steady_latency_ms.get('p99', 0):.1f}, added p50"
            f" {self.steady_added_latency_ms.get('p50', 0):.1f} p99 {self.steady_added_latency_ms.get('p99', 0):.1f}"
            f" (p99 / p50 {self.steady_added_p99_over_p50:.2f})",
            *(
                [
                    f"shed answered in ms p50 {self.shed_latency_ms['p50']:.1f} p99 {self.shed_latency_ms['p99']:.1f}"
                    f" max {self.shed_latency_ms['max']:.1f}; steady p50 {steady_shed.get('p50', 0):.1f}"
                    f" p99 {steady_shed.get('p99', 0):.1f}"
                ]
                if self.shed_latency_ms
                else []
            ),
            f"steady per-session ({self.fairness_sessions}) tokens: least {tokens.get('min_share_of_fair', 0):.2f}"
            " of the fair share, p1"
            f" {tokens.get('p1_share_of_fair', 0):.2f}, most {tokens.get('max_share_of_fair', 0):.2f}; turns: least"
            f" {self.fairness_turns.get('min_share_of_fair', 0):.2f}",
            *(
                [
                    f"heavy sessions: {self.config['heavy_sessions']} x {self.config['heavy_concurrency']} turns in"
                    f" flight, each served {self.heavy_share_of_fair:.2f} x the others' fair share"
                ]
                if self.config["heavy_sessions"]
                else []
            ),
            f"client loop lag ms p50 {self.client_lag_ms.get('p50', 0):.1f} p99 {self.client_lag_ms.get('p99', 0):.1f}",
            *self._probe_lines(),
            f"store rows: {self.rows} (turns answered ok: {self.turns_ok}"
            + (f" and the probe's {self.shed_probe['admitted']}" if self.shed_probe.get("admitted") else "")
            + f", rows {rows_total})",
            *(
                [
                    f"queue wait (gateway, after warm-up): p50 <= {self.queue_wait['p50_under_s']:g} s, p99 <="
                    f" {self.queue_wait['p99_under_s']:g} s; {self.queue_wait['within_bound']:.1%} of"
                    f" {self.queue_wait['admitted']:.0f} admitted turns within the bound"
                ]
                if self.queue_wait
                else []
            ),
            f"handler to worker ms (store) p50 {self.store_dispatch_wait_ms.get('p50', 0):.1f} p99"
            f" {self.store_dispatch_wait_ms.get('p99', 0):.1f} max {self.store_dispatch_wait_ms.get('max', 0):.1f}",
            f"gateway RSS MB: start {rss.get('start_mb', 0):.0f}, after warm-up {rss.get('after_warmup_mb', 0):.0f},"
            f" end {rss.get('end_mb', 0):.0f}, max {rss.get('max_mb', 0):.0f}; growth after warm-up"
            f" {rss.get('growth_after_warmup_mb', 0):.1f} MB; {rss.get('mb_per_1000_sessions', 0):.1f} MB per 1,000"
            " sessions",
        ]
        return "\n".join(lines)

    def _probe_lines(self) -> list[str]:
        probe = self.shed_probe
        if not probe:
            return []
        if "error" in probe:
            return [f"shed probe: {probe['error']}"]
        shed, lag = probe.get("shed_ms") or {}, probe.get("own_lag_ms") or {}
        return [
            f"shed answered to a quiet client (probe, {self.config['shed_probe_rate']:g}/s): p50"
            f" {shed.get('p50', 0):.1f} p99 {shed.get('p99', 0):.1f} max {shed.get('max', 0):.1f} ms of"
            f" {shed.get('n', 0):.0f} refused, {probe.get('admitted', 0)} admitted, errors {probe.get('errors') or 0};"
            f" the probe's loop lag p99 {lag.get('p99', 0):.1f} ms"
        ]

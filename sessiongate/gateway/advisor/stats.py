"""Advisory statistics per signal kind, counted by this replica since it started (soft state); with replicas
sharing state, the same counts are also added up across replicas (`deltas`, `from_counters`) for the admin report.

    precision  = used / (used + late + wasted)          how often a hint's prefetch served the request
    recall     = (used + late) / requests              share of follow-up requests that some hint foresaw
                 (requests = claimed advisories + missed)
    lead time  = request arrival - prefetch finished,  mean over used advisories
    wasted bytes = bytes the worker loaded for advisories that ended wasted (when it reported them)

The per-advisory records (kind, worker, outcome) are in the store (`GET /v1/admin/sessions/{id}`).

Also counted here for `/metrics` (`gateway.observability.metrics` reads them when scraped, so the advisor's paths
only add to plain integers): signals handled per kind, prefetches sent per target tier, bytes the finished prefetches
loaded, and prefetch latency (sent to done) in fixed buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AdvisoryStats"]

_OUTCOMES = ("used", "late", "wasted", "cancelled")
# Upper bounds (seconds) of the prefetch latency histogram's buckets; +Inf is implied.
PREFETCH_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class _KindStats:
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_OUTCOMES, 0))
    lead_s_total: float = 0.0
    lead_count: int = 0
    wasted_bytes: int = 0
    skipped: int = 0
    signals: int = 0


@dataclass(slots=True)
class PrefetchLatency:
    """A histogram of prefetch latencies as plain counts: one per bucket (the last is +Inf), their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(PREFETCH_LATENCY_BUCKETS) + 1))
    total_s: float = 0.0

    def observe(self, seconds: float) -> None:
        index = next((i for i, bound in enumerate(PREFETCH_LATENCY_BUCKETS) if seconds <= bound), -1)
        self.counts[index] += 1
        self.total_s += seconds


@dataclass(slots=True)
class AdvisoryStats:
    kinds: dict[str, _KindStats] = field(default_factory=dict)
    missed: int = 0
    claimed: int = 0
    prefetches_sent: dict[str, int] = field(default_factory=dict)  # by target tier
    prefetch_bytes: int = 0
    prefetch_latency: PrefetchLatency = field(default_factory=PrefetchLatency)
    # The tool-call KV lifecycle (toolkv.py): decisions ("keep", "offload", "keep_then_offload"), keep_then_offload
    # retains that lapsed with no request, their prefetch now scheduled ("retain_lapsed"), scheduled prefetches
    # fired early by a tool result ("early") or dropped because the tenant's turns follow their results too closely
    # for one to land ("early_skipped"), and keeps whose worker held none of the KV ("retain_fallback").
    tool_kv: dict[str, int] = field(default_factory=dict)

    def _kind(self, kind: str) -> _KindStats:
        return self.kinds.setdefault(kind, _KindStats())

    def settled(self, kind: str, outcome: str, *, lead_s: float | None = None, bytes_loaded: int | None = None) -> None:
        stats = self._kind(kind)
        stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
        if outcome == "used" and lead_s is not None:
            stats.lead_s_total += lead_s
            stats.lead_count += 1
        if outcome == "wasted" and bytes_loaded:
            stats.wasted_bytes += bytes_loaded

    def tool_kv_event(self, event: str) -> None:
        self.tool_kv[event] = self.tool_kv.get(event, 0) + 1

    def skipped(self, kind: str) -> None:
        self._kind(kind).skipped += 1

    def signal(self, kind: str) -> None:
        self._kind(kind).signals += 1

    def prefetch_sent(self, target: str) -> None:
        self.prefetches_sent[target] = self.prefetches_sent.get(target, 0) + 1

    def prefetch_done(self, seconds: float, bytes_loaded: int) -> None:
        self.prefetch_latency.observe(seconds)
        self.prefetch_bytes += bytes_loaded

    @staticmethod
    def deltas(
        kind: str, outcome: str, *, lead_s: float | None = None, bytes_loaded: int | None = None
    ) -> dict[str, float]:
        """What `settled` adds, as named counters (the replicas' shared hash: `from_counters` reads it back)."""
        counts: dict[str, float] = {f"{kind}:{outcome}": 1}
        if outcome == "used" and lead_s is not None:
            counts |= {f"{kind}:lead_s_total": lead_s, f"{kind}:lead_count": 1}
        if outcome == "wasted" and bytes_loaded:
            counts[f"{kind}:wasted_bytes"] = bytes_loaded
        return counts

    @classmethod
    def from_counters(cls, counters: dict[str, float]) -> AdvisoryStats:
        """Statistics from named counters: `claimed`, `missed`, and `<kind>:<outcome | signals | skipped |
        lead_s_total | lead_count | wasted_bytes>`."""
        stats = cls(missed=int(counters.get("missed", 0)), claimed=int(counters.get("claimed", 0)))
        for name, value in counters.items():
            kind, _, what = name.rpartition(":")
            if not kind:
                continue
            each = stats._kind(kind)
            if what in _OUTCOMES:
                each.outcomes[what] = int(value)
            elif what == "lead_s_total":
                each.lead_s_total = value
            elif what in ("lead_count", "wasted_bytes", "skipped", "signals"):
                setattr(each, what, int(value))
        return stats

    def report(self) -> dict[str, Any]:
        requests = self.claimed + self.missed
        kinds: dict[str, Any] = {}
        for kind, s in sorted(self.kinds.items()):
            used, late, wasted = s.outcomes["used"], s.outcomes["late"], s.outcomes["wasted"]
            judged = used + late + wasted
            kinds[kind] = {
                "outcomes": dict(s.outcomes),
                "skipped": s.skipped,
                "precision": used / judged if judged else None,
                "recall": (used + late) / requests if requests else None,
                "mean_lead_time_s": s.lead_s_total / s.lead_count if s.lead_count else None,
                "wasted_bytes": s.wasted_bytes,
            }
        total_foreseen = sum(s.outcomes["used"] + s.outcomes["late"] for s in self.kinds.values())
        return {
            "object": "advisory.stats",
            "requests": requests,
            "missed": self.missed,
            "recall": total_foreseen / requests if requests else None,
            "kinds": kinds,
            "tool_kv": dict(self.tool_kv),
        }

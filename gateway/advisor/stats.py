"""Advisory statistics per signal kind, counted by this replica since it started (soft state).

    precision  = used / (used + late + wasted)          how often a hint's prefetch served the request
    recall     = (used + late) / requests              share of follow-up requests that some hint foresaw
                 (requests = claimed advisories + missed)
    lead time  = request arrival - prefetch finished,  mean over used advisories
    wasted bytes = bytes the worker loaded for advisories that ended wasted (when it reported them)

The per-advisory records (kind, worker, outcome) are in the store (`GET /v1/admin/sessions/{id}`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AdvisoryStats"]

_OUTCOMES = ("used", "late", "wasted", "cancelled")


@dataclass(slots=True)
class _KindStats:
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_OUTCOMES, 0))
    lead_s_total: float = 0.0
    lead_count: int = 0
    wasted_bytes: int = 0
    skipped: int = 0


@dataclass(slots=True)
class AdvisoryStats:
    kinds: dict[str, _KindStats] = field(default_factory=dict)
    missed: int = 0
    claimed: int = 0

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

    def skipped(self, kind: str) -> None:
        self._kind(kind).skipped += 1

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
        }

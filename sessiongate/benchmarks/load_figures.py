"""The load test's figures, from what its client recorded: percentiles, per-session service shares, and memory; and
from the gateway's own histogram, how long admitted turns waited in its queue.

Pure functions of lists, so they are tested without a gateway (`tests/benchmarks/test_load_figures.py`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["fairness", "percentiles", "queue_waits", "rss_figures"]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, max, mean and n (an empty dict for no values)."""
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
        "n": len(ordered),
    }


def fairness(served: Sequence[float]) -> dict[str, float]:
    """Each session's service against the fair share (the mean: every session wants service all the time in a
    closed loop without think time): the least, the 1st percentile and the most, as fractions of the fair share."""
    if not served:
        return {}
    fair = statistics.fmean(served)
    if fair <= 0:
        return {"fair_share": 0.0}
    ordered = sorted(served)
    return {
        "fair_share": fair,
        "min_share_of_fair": ordered[0] / fair,
        "p1_share_of_fair": ordered[int(0.01 * len(ordered))] / fair,
        "max_share_of_fair": ordered[-1] / fair,
        "sessions_below_half": sum(1 for s in ordered if s < fair / 2),
    }


def rss_figures(samples: Sequence[tuple[float, float]], *, sessions: int, warmup_s: float) -> dict[str, float]:
    """From (seconds, MB) samples of the gateway's RSS: at the start (before the load), after the warm-up, at the end
    and the most; what the sessions took per 1,000 of them (warm-up minus start), and the growth after warm-up (flat
    memory: about 0)."""
    if not samples:
        return {}
    start = samples[0][1]
    warm = next((mb for at, mb in samples if at >= warmup_s), samples[-1][1])
    end = samples[-1][1]
    return {
        "start_mb": start,
        "after_warmup_mb": warm,
        "end_mb": end,
        "max_mb": max(mb for _, mb in samples),
        "growth_after_warmup_mb": end - warm,
        "mb_per_1000_sessions": (warm - start) / max(sessions / 1000, 1e-9),
    }


def queue_waits(before: dict[float, float], after: dict[float, float], bound_s: float) -> dict[str, float]:
    """From two readings of the gateway's `sessiongate_admission_wait_seconds` buckets ({upper bound: turns that
    waited at most that, cumulative}, +Inf as `math.inf`): the turns admitted between them, the bucket bounds their
    p50 and p99 waits fall under, and the share that waited no more than `bound_s` (a bucket's edge)."""
    counts = {edge: after[edge] - before.get(edge, 0.0) for edge in sorted(after)}
    total = counts.get(math.inf, 0.0)
    if total <= 0:
        return {}

    def under(q: float) -> float:
        return next(edge for edge, n in counts.items() if n >= q * total)

    within = max((n for edge, n in counts.items() if edge <= bound_s), default=0.0)
    return {"admitted": total, "p50_under_s": under(0.5), "p99_under_s": under(0.99), "within_bound": within / total}

"""The load test's figures (benchmarks/load_figures.py): shares against the fair share, memory after warm-up."""

from __future__ import annotations

import math

import pytest

from sessiongate.benchmarks.load_figures import fairness, percentiles, queue_waits, rss_figures


def test_percentiles_of_nothing_and_of_a_hundred() -> None:
    assert percentiles([]) == {}
    figures = percentiles([float(v) for v in range(100, 0, -1)])
    assert (figures["p50"], figures["p99"], figures["max"], figures["n"]) == (51.0, 100.0, 100.0, 100)


def test_fairness_is_each_sessions_service_against_the_mean() -> None:
    figures = fairness([100, 100, 100, 40, 160])
    assert figures["fair_share"] == 100
    assert figures["min_share_of_fair"] == pytest.approx(0.4)
    assert figures["max_share_of_fair"] == pytest.approx(1.6)
    assert figures["sessions_below_half"] == 1
    assert fairness([0, 0]) == {"fair_share": 0.0}


def test_rss_after_warmup_growth_and_per_thousand_sessions() -> None:
    samples = [(0.0, 100.0), (5.0, 140.0), (10.0, 150.0), (20.0, 151.0), (30.0, 150.5)]
    figures = rss_figures(samples, sessions=10_000, warmup_s=10.0)
    assert figures["after_warmup_mb"] == 150.0
    assert figures["growth_after_warmup_mb"] == pytest.approx(0.5)
    assert figures["mb_per_1000_sessions"] == pytest.approx(5.0)
    assert figures["max_mb"] == 151.0


def test_queue_waits_between_two_readings_of_the_gateways_histogram() -> None:
    before = {0.1: 10.0, 1.0: 10.0, 2.0: 10.0, 4.0: 10.0, math.inf: 10.0}  # the warm-up's ten
    # Since: 50 within 0.1 s, 40 more within 1 s, 8 more within 2 s, 2 within 4 s.
    after = {0.1: 60.0, 1.0: 100.0, 2.0: 108.0, 4.0: 110.0, math.inf: 110.0}
    figures = queue_waits(before, after, bound_s=2.0)
    assert figures == {"admitted": 100.0, "p50_under_s": 0.1, "p99_under_s": 4.0, "within_bound": 0.98}
    assert queue_waits(before, before, bound_s=2.0) == {}  # nothing admitted between them
    assert queue_waits({}, {}, bound_s=2.0) == {}  # a gateway without the histogram

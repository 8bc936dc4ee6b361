"""The soak's judgements (benchmarks/soak_report.py), on made-up samples: memory growth after the warm-up, the spot
checks' summary, and which faults the replicas' /metrics showed. The soak itself needs the network-namespace
cluster (minutes); these are the rules its report applies."""

from __future__ import annotations

from typing import Any

import pytest

from sessiongate.benchmarks.netns_cluster import NODES
from sessiongate.benchmarks.soak import SoakConfig, spot_system_prompt
from sessiongate.benchmarks.soak_report import fault_visible, memory_growth, spot_summary


def samples(memory: dict[str, list[float]], every_s: float = 60.0) -> list[dict[str, Any]]:
    count = len(next(iter(memory.values())))
    return [
        {"t": i * every_s, "pss_mb": {role: memory.get(role, [100.0] * count)[i] for role in NODES}}
        for i in range(count)
    ]


def growth_of(memory: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Judged as the soak judges it, with its default warm-up and tolerance."""
    config = SoakConfig()
    return memory_growth(memory, warmup_share=config.warmup_share, flat_tolerance=config.flat_tolerance)


def test_a_node_that_fills_its_buffers_during_the_warm_up_then_holds_is_flat() -> None:
    # Ten minutes sampled each minute; the warm-up is the first 30%: 100 -> 400 MB, then 400-410.
    filling = [100.0, 250.0, 380.0, 400.0, 402.0, 405.0, 403.0, 406.0, 408.0, 410.0, 409.0]
    growth = growth_of(samples({"mc": filling}))
    assert growth["mc"]["warm_mb"] == 400.0
    assert growth["mc"]["growth_after_warmup_mb"] == 9.0
    assert growth["mc"]["flat"] is True
    assert 0 < growth["mc"]["slope_mb_per_min"] < 2


def test_a_node_that_keeps_growing_after_the_warm_up_is_not_flat() -> None:
    leaking = [100.0 + 10 * i for i in range(11)]  # +10 MB a minute, all along
    growth = growth_of(samples({"gw1": leaking}))
    assert growth["gw1"]["flat"] is False
    assert growth["gw1"]["slope_mb_per_min"] == pytest.approx(10.0)
    assert growth["gw2"]["flat"] is True  # the others held at 100 MB


def test_the_spot_check_summary_counts_wrong_answers_and_the_tiers_that_served_them() -> None:
    checks: list[dict[str, Any]] = [
        {"answered": True, "equal": True, "cached_tokens_details": {"device": 0, "host": 0, "storage": 512}},
        {"answered": True, "equal": False, "cached_tokens_details": {"device": 640, "storage": 0}},
        {"answered": True, "equal": None},  # no worker answered the recompute: not compared
        {"answered": False},
    ]
    summary = spot_summary(checks)
    assert summary == {
        "turns": 4,
        "compared": 2,
        "wrong": 1,
        "unanswered": 1,
        "turns_with_cached_tokens_from": {"storage": 1, "device": 1},
    }


def test_each_spot_check_has_a_system_prompt_of_its_own() -> None:
    first, second = spot_system_prompt(0), spot_system_prompt(1)
    assert first != second
    assert len(first) > 4 * 64 * 4  # several 64-token pages at about four characters a token


def scraped(t: float, **metrics: float) -> dict[str, Any]:
    return {"t": t, "metrics": {"gw1": {"sessiongate_store_oldest_call_seconds": 0.0, **metrics}, "gw2": None}}


def test_a_database_cut_is_visible_by_a_store_call_stuck_even_without_a_503() -> None:
    fault = {"name": "PostgreSQL link cut", "start": 10.0, "end": 20.0}
    quiet = [scraped(t) for t in (8.0, 12.0, 16.0, 22.0)]
    stuck = [scraped(8.0), scraped(12.0, sessiongate_store_oldest_call_seconds=2.5), scraped(16.0)]
    refused = [scraped(8.0), scraped(14.0, sessiongate_store_unavailable_total=1.0)]
    assert fault_visible(fault, quiet, cluster=None) is False  # type: ignore[arg-type]
    assert fault_visible(fault, stuck, cluster=None) is True  # type: ignore[arg-type]
    assert fault_visible(fault, refused, cluster=None) is True  # type: ignore[arg-type]


def test_a_slow_pool_link_is_visible_by_the_workers_pool_call_times() -> None:
    fault = {"name": "pool link 50 ms, 5% loss", "start": 40.0, "end": 50.0}
    calls, seconds = (
        f'sessiongate_worker_pool_{n}{{op="write",worker="w1"}}' for n in ("calls_total", "call_seconds_total")
    )

    def at(t: float, made: float, spent: float) -> dict[str, Any]:
        return {"t": t, "metrics": {"gw1": {calls: made, seconds: spent}, "gw2": None}}

    # 10 writes in the 30 s before at 5 ms each, one of them a 0.5 s outlier.
    usual = [at(10.0, 0, 0.0), at(25.0, 5, 0.02), at(38.0, 10, 0.54)]
    assert fault_visible(fault, [*usual, at(44.0, 12, 2.54), at(52.0, 14, 4.54)], cluster=None) is True  # type: ignore[arg-type]
    assert fault_visible(fault, [*usual, at(44.0, 12, 0.56), at(52.0, 14, 0.58)], cluster=None) is False  # type: ignore[arg-type]
    assert fault_visible(fault, [*usual, at(44.0, 10, 0.54)], cluster=None) is False  # type: ignore[arg-type]  # no call
    # A pool that was as slow before is not made visible by staying as slow.
    slow = [at(10.0, 0, 0.0), at(38.0, 10, 10.0)]
    assert fault_visible(fault, [*slow, at(52.0, 14, 14.0)], cluster=None) is False  # type: ignore[arg-type]


def test_shared_memory_filling_is_not_counted_as_growth() -> None:
    # PostgreSQL: its shared buffers fill as the turns table grows (100 -> 190 MB of PSS), its own memory holds.
    memory = samples({"pg": [40.0 + 10 * i for i in range(10)]})
    for i, sample in enumerate(memory):
        sample["shmem_mb"] = {role: 0.0 for role in NODES} | {"pg": 10.0 * i}
    growth = growth_of(memory)
    assert growth["pg"]["last_mb"] == 130.0
    assert growth["pg"]["shmem_last_mb"] == 90.0
    assert growth["pg"]["growth_after_warmup_mb"] == 0.0
    assert growth["pg"]["flat"] is True

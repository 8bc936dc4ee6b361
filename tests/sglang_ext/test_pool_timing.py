"""The pool backends' call timing (`sglang_ext.pool_timing`): cumulative figures, the recent mean, its window, threads,
and what it costs a call; then the verified `file` backend timing its real calls into a real pool directory."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessiongate.sglang_ext.pool_timing import POOL_CALL_KINDS, RECENT_WINDOW_S, PoolCallTimer, PoolTiming
from sessiongate.sglang_ext.protocol import LoadReport, PoolCalls


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_timer_adds_up_calls_pages_and_seconds_and_gives_the_recent_mean() -> None:
    clock = Clock()
    timer = PoolCallTimer(clock=clock)
    assert timer.figures().recent_ms is None
    timer.record(0.010, 4)
    clock.now += 1.0
    timer.record(0.030, 2)
    figures = timer.figures()
    assert (figures.calls, figures.pages) == (2, 6)
    assert figures.seconds == pytest.approx(0.040)
    assert figures.recent_ms == pytest.approx(20.0)


def test_the_recent_mean_forgets_calls_past_its_window_and_the_totals_do_not() -> None:
    clock = Clock()
    timer = PoolCallTimer(clock=clock)
    timer.record(0.002, 1)  # a fast pool
    clock.now += RECENT_WINDOW_S / 2
    timer.record(0.002, 1)
    clock.now += RECENT_WINDOW_S / 2 + 0.01
    timer.record(0.200, 1)  # the link slowed down: only the newer calls count
    assert timer.figures().recent_ms == pytest.approx(101.0)
    clock.now += RECENT_WINDOW_S / 2
    assert timer.figures().recent_ms == pytest.approx(200.0)
    clock.now += RECENT_WINDOW_S
    figures = timer.figures()
    assert figures.recent_ms is None  # no call recently
    assert (figures.calls, figures.seconds) == (3, pytest.approx(0.204))


def test_a_slot_reused_after_a_full_turn_of_the_ring_starts_again() -> None:
    clock = Clock()
    timer = PoolCallTimer(clock=clock)
    timer.record(1.0, 1)
    clock.now += RECENT_WINDOW_S  # the same slot, one turn later
    timer.record(0.001, 1)
    assert timer.figures().recent_ms == pytest.approx(1.0)


def test_calls_from_many_threads_are_all_counted() -> None:
    timer = PoolCallTimer()
    threads = [threading.Thread(target=lambda: [timer.record(0.001, 2) for _ in range(5000)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures = timer.figures()
    assert (figures.calls, figures.pages) == (20_000, 40_000)
    assert figures.seconds == pytest.approx(20.0)
    assert figures.recent_ms == pytest.approx(1.0)


def test_timed_returns_the_calls_answer_and_counts_one_that_raises() -> None:
    timer = PoolCallTimer()
    assert timer.timed(3, lambda a, b: a + b, 1, 2) == 3

    def fails() -> None:
        raise OSError("the pool is gone")

    with pytest.raises(OSError, match="gone"):
        timer.timed(5, fails)
    figures = timer.figures()
    assert (figures.calls, figures.pages) == (2, 8)
    assert figures.seconds > 0


def test_timing_a_call_costs_microseconds() -> None:
    """The read path's price: a batch get of pages costs tens of microseconds per page at the very least."""

    def nothing() -> None:
        return None

    timer = PoolCallTimer()
    calls = 50_000
    started = time.perf_counter()
    for _ in range(calls):
        timer.timed(1, nothing)
    timed_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(calls):
        nothing()
    bare_s = time.perf_counter() - started
    per_call_us = (timed_s - bare_s) / calls * 1e6
    print(f"timing a call costs {per_call_us:.2f} µs")
    assert per_call_us < 20


def test_the_report_is_the_wire_format() -> None:
    clock = Clock()
    timing = PoolTiming(clock=clock)
    timing.read.record(0.004, 8)
    report = timing.report()
    assert set(report) == set(POOL_CALL_KINDS) == {"read", "write", "lookup"}
    assert PoolCalls(**report["read"]) == PoolCalls(calls=1, pages=8, seconds=0.004, recent_ms=4.0)
    assert PoolCalls(**report["write"]) == PoolCalls()


def test_a_load_report_with_pool_calls_round_trips_and_an_older_one_still_parses() -> None:
    base: dict[str, Any] = {
        "at": 1.0,
        "running_requests": 0,
        "queued_requests": 0,
        "device_kv_tokens_total": 100,
        "device_kv_tokens_used": 0,
        "prefill_tokens_per_s": 0.0,
        "decode_tokens_per_s": 0.0,
        "page_size": 64,
    }
    assert LoadReport.model_validate(base).pool_calls == {}  # a worker from before the field
    pool_calls = {"read": PoolCalls(calls=3, pages=30, seconds=0.6, recent_ms=200.0), "lookup": PoolCalls(calls=1)}
    report = LoadReport(**base, pool_calls=pool_calls)
    again = LoadReport.model_validate_json(report.model_dump_json())
    assert again == report
    assert again.pool_calls["read"].recent_ms == 200.0
    assert again.pool_calls["lookup"].recent_ms is None


# --- the verified `file` backend, in-process on SGLang's own HiCacheFile --------------------------------------------

PAGE_BYTES = 64 * 512


def test_the_file_pool_times_its_batch_calls(cpu_compat: bool, tmp_path: Path) -> None:
    import torch

    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore
    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    store = CheckedFileStore(single_rank_storage_config("tiny", {"file_storage_path": str(tmp_path)}))
    keys = [f"timed-page-{i}" for i in range(6)]
    pages = [torch.full((PAGE_BYTES // 4,), float(i)) for i in range(len(keys))]
    assert store.batch_set(keys, pages)
    assert store.batch_exists([*keys, "absent"]) == len(keys)
    targets = [torch.zeros(PAGE_BYTES // 4) for _ in keys]
    assert all(got is not None for got in store.batch_get(keys, targets))
    assert torch.equal(targets[5], pages[5])

    report = {kind: PoolCalls(**figures) for kind, figures in store.pool_timing.report().items()}
    assert (report["write"].calls, report["write"].pages) == (1, 6)
    assert (report["lookup"].calls, report["lookup"].pages) == (1, 7)
    assert (report["read"].calls, report["read"].pages) == (1, 6)
    for figures in report.values():
        assert figures.seconds > 0
        assert figures.recent_ms == pytest.approx(figures.seconds * 1000)
    # Single pages read or written outside a batch (SGLang's own `set` checks `exists` first) are not calls.
    assert store.set("single", pages[0])
    assert store.pool_timing.report()["write"]["calls"] == 1
    assert store.pool_timing.report()["lookup"]["calls"] == 1

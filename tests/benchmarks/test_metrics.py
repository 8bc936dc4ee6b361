"""Metrics on hand-made records: percentiles, summaries, sessions served at an SLO."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from pathlib import Path

import pytest

from sessiongate.benchmarks.metrics import (
    RunSummary,
    Stats,
    TurnRecord,
    percentile,
    read_records,
    served_at_slo,
    stats,
    summarize,
    summary_from_dict,
    write_records,
)


def _record(turn: int, *, sent: float, first: float | None, done: float | None, **kw: object) -> TurnRecord:
    fields: dict[str, object] = {
        "system": "s",
        "session_id": "a",
        "turn": turn,
        "sent_s": sent,
        "first_token_s": first,
        "done_s": done,
        "prompt_tokens": 100,
        "output_tokens": 11,
        "cached_device": 0,
        "cached_host": 0,
        "cached_pool": 0,
    }
    fields.update(kw)
    return TurnRecord(**fields)  # type: ignore[arg-type]


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert math.isnan(percentile([], 50))


def test_stats_skips_missing_values() -> None:
    result = stats([1.0, None, 3.0])
    assert (result.mean, result.p50, result.count) == (2.0, 2.0, 2)
    assert math.isnan(stats([None]).mean)


def test_turn_record_derived_times() -> None:
    r = _record(0, sent=10.0, first=10.5, done=11.5, cached_device=30, cached_host=20, cached_pool=10)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.e2e_s == pytest.approx(1.5)
    assert r.tpot_s == pytest.approx(0.1)  # 1.0 s over the 10 tokens after the first
    assert r.recomputed_tokens == 40
    failed = _record(1, sent=1.0, first=None, done=None, error="503")
    assert failed.ttft_s is None
    assert failed.e2e_s is None
    assert failed.tpot_s is None
    assert _record(2, sent=0.0, first=1.0, done=1.0, output_tokens=1).tpot_s is None


def test_summarize_counts_errors_and_token_sources() -> None:
    records = [
        _record(0, sent=0.0, first=1.0, done=2.0),
        _record(1, sent=3.0, first=3.2, done=4.0, cached_device=60, cached_host=10),
        _record(2, sent=5.0, first=5.1, done=6.0, cached_pool=90),
        _record(3, sent=7.0, first=None, done=None, error="timeout", cached_device=99),
    ]
    summary = summarize("kv_aware", 4, "sessions", records, advisories={"used": 2}, label="real CPU")
    assert (summary.requests, summary.errors) == (4, 1)
    assert summary.ttft.mean == pytest.approx((1.0 + 0.2 + 0.1) / 3)
    assert summary.ttft.p50 == pytest.approx(0.2)
    assert summary.tokens_by_source == {"device": 60, "host": 10, "pool": 90, "recomputed": 140}
    assert summary.recomputed_share == pytest.approx(140 / 300)
    assert summary.duration_s == pytest.approx(6.0)
    assert summary.advisories == {"used": 2}
    assert summary.label == "real CPU"


def _summary(system: str, load: float, p99: float, errors: int = 0) -> RunSummary:
    return RunSummary(
        system=system,
        load=load,
        load_unit="sessions",
        requests=10,
        errors=errors,
        ttft=Stats(p99 / 2, p99 / 2, p99, 10),
        tpot=Stats.empty(),
        e2e=Stats.empty(),
        tokens_by_source={},
        bytes_moved={},
        advisories={},
    )


def test_served_at_slo_stops_at_the_first_miss() -> None:
    summaries = [
        _summary("a", 8, 0.9),
        _summary("a", 2, 0.1),
        _summary("a", 4, 0.4),
        _summary("a", 16, 0.3),  # a lucky pass after a miss does not count
        _summary("b", 2, 0.6),
        _summary("c", 2, 0.1),
        _summary("c", 4, 0.2, errors=1),
    ]
    assert served_at_slo(summaries, p99_ttft_s=0.5) == {"a": 4, "b": 0, "c": 2}


def test_records_round_trip_as_json_lines(tmp_path: Path) -> None:
    records = [_record(0, sent=0.0, first=0.5, done=1.0, worker="w1"), _record(1, sent=1, first=None, done=None)]
    path = tmp_path / "runs" / "records.jsonl"
    write_records(path, records)
    assert read_records(path) == records


def test_records_round_trip_gzip_compressed(tmp_path: Path) -> None:
    records = [_record(0, sent=0.0, first=0.5, done=1.0, worker="w1"), _record(1, sent=1, first=None, done=None)]
    path = tmp_path / "records.jsonl.gz"
    write_records(path, records)
    assert gzip.decompress(path.read_bytes()).decode().count("\n") == 2
    assert read_records(path) == records


def test_summary_round_trips_through_json() -> None:
    records = [_record(0, sent=0.0, first=0.4, done=1.0), _record(1, sent=2.0, first=2.1, done=3.0, cached_host=50)]
    summary = summarize("sticky", 2, "sessions", records, bytes_moved={"host->device": 10}, label="real CPU")
    assert summary_from_dict(json.loads(json.dumps(dataclasses.asdict(summary)))) == summary

"""The Markdown report and its figures, written from hand-made summaries."""

from __future__ import annotations

from pathlib import Path

from sessiongate.benchmarks.metrics import TurnRecord, summarize
from sessiongate.benchmarks.report import write_report


def _records(system: str, ttft: float, cached: int) -> list[TurnRecord]:
    firsts = [i + ttft * (1 + i / 10) for i in range(10)]
    return [
        TurnRecord(system, f"s{i}", 1, float(i), first, first + 1.9, 200, 20, cached, 0, 0)
        for i, first in enumerate(firsts)
    ]


def test_report_writes_tables_and_figures(tmp_path: Path) -> None:
    summaries = [summarize("recompute", load, "sessions", _records("recompute", 0.3 * load, 0)) for load in (2, 4)] + [
        summarize("kv_aware", load, "sessions", _records("kv_aware", 0.1 * load, 150), advisories={"used": 3})
        for load in (2, 4)
    ]
    path = write_report(tmp_path / "out", "Test run", summaries, notes=["noisy machine"], slo_p99_ttft_s=1.0)
    text = path.read_text()
    assert path == tmp_path / "out" / "report.md"
    assert "# Test run" in text
    assert "- noisy machine" in text
    assert "| recompute |  | 2 sessions | 10 | 0 |" in text
    assert "| kv_aware | 4 sessions |" in text  # served at the SLO: kv_aware's p99 at 4 sessions is under 1 s
    assert "| recompute | 0 sessions |" in text  # 0.6 s * 1.9 at 2 sessions already misses
    assert "used: 3" in text
    losses = text.split("## Where each system loses")[1]
    assert "**kv_aware**: best or tied" in losses
    assert "mean TTFT" in losses.split("**recompute**")[1]
    for figure in ("latency_vs_load.png", "token_sources.png"):
        data = (tmp_path / "out" / figure).read_bytes()
        assert data.startswith(b"\x89PNG")
        assert len(data) > 5000

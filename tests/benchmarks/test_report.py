"""The Markdown report and its figures, written from hand-made summaries."""

from __future__ import annotations

from pathlib import Path

from sessiongate.benchmarks.metrics import RunSummary, TurnRecord, summarize
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


def _second_turns_at(*systems: tuple[str, float]) -> list[RunSummary]:
    """Each system's run at 8 sessions: ten second turns (the turns a hint can foresee) of this TTFT."""
    return [
        summarize(
            system,
            8,
            "sessions",
            [TurnRecord(system, f"s{i}", 1, 0.0, ttft, ttft + 1, 100, 10, 0, 0, 0) for i in range(10)],
        )
        for system, ttft in systems
    ]


def _oracle_section(tmp_path: Path, summaries: list[RunSummary]) -> str:
    text = write_report(tmp_path / "out", "Hints", summaries).read_text()
    return text.split("## Hints against the oracle")[1].split("## ")[0]


def test_report_sets_each_hinted_system_against_the_oracle(tmp_path: Path) -> None:
    # Turns after the first (turn 1 here) have TTFTs 0.2 / 0.1 / 0.05 s on average: ours gains 2x over kv_aware, the
    # oracle 4x; ours reaches (0.2 - 0.1) / (0.2 - 0.05) = 67% of the oracle's gain.
    summaries = _second_turns_at(("kv_aware", 0.2), ("kv_aware+advisories", 0.1), ("kv_aware+oracle", 0.05))
    assert summaries[0].later_ttft.mean == summaries[0].ttft.mean
    section = _oracle_section(tmp_path, summaries)
    assert "| kv_aware+advisories | 8 sessions | 2.00x (67%) | 2.00x (67%) | 2.00x (67%) | 2.00x (67%) |" in section
    assert "| kv_aware+oracle | 8 sessions | 4.00x | 4.00x | 4.00x | 4.00x |" in section


def test_report_sets_hints_on_the_dynamo_cost_router_against_that_routers_oracle(tmp_path: Path) -> None:
    # dynamo_cost 0.1 s, with typing hints 0.08, with the oracle's 0.05: 1.25x, 40% of the oracle's 2x.
    section = _oracle_section(
        tmp_path,
        _second_turns_at(
            ("kv_aware", 0.2), ("dynamo_cost", 0.1), ("dynamo_cost+advisories", 0.08), ("dynamo_cost+oracle", 0.05)
        ),
    )
    assert "| dynamo_cost+advisories | 8 sessions | 1.25x (40%) | 1.25x (40%) | 1.25x (40%) | 1.25x (40%) |" in section
    assert "| dynamo_cost+oracle | 8 sessions | 2.00x | 2.00x | 2.00x | 2.00x |" in section
    assert "kv_aware |" not in section  # kv_aware ran without its oracle: nothing to set it against

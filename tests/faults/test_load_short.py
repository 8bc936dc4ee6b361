"""The load test, short (seconds): concurrent sessions, streamed and not, through a real gateway process in front
of fake worker processes; no errors, and every answered turn is a row in the store (nothing lost, nothing
left pending)."""

from __future__ import annotations

from pathlib import Path

from sessiongate.benchmarks.load_test import LoadConfig, run_load


def test_short_load_loses_nothing(tmp_path: Path) -> None:
    report = run_load(LoadConfig(sessions=30, duration_s=3.0, workers=2, baseline_requests=60), work_dir=tmp_path)
    assert report.errors == {}
    assert report.turns_ok == report.turns_sent > 30
    assert report.rows["turns_ok"] == report.turns_ok
    assert "turns_pending" not in report.rows
    assert report.rows["sessions"] == 30
    assert report.latency_ms["p99"] > 0
    assert report.rss_mb
    assert report.shed == {}  # 30 sessions are far from the admission's bound
    # The gateway's own queue-wait histogram, read after the warm-up and at the end: every turn within the bound.
    assert report.queue_wait["admitted"] > 0
    assert report.queue_wait["within_bound"] == 1.0
    assert report.fairness_turns["min_share_of_fair"] > 0
    assert report.rss["end_mb"] > 0


def test_the_shed_probe_times_refusals_from_its_own_process(tmp_path: Path) -> None:
    # Two turns active at once and a 50 ms bound: the probe's new sessions meet a queue and are refused; whatever it
    # gets admitted is a turn in the store like the sessions' own.
    settings = (
        ("SESSIONGATE_ADMISSION_MAX_ACTIVE_PER_WORKER", "1"),
        ("SESSIONGATE_ADMISSION_MAX_WAIT_S", "0.05"),
        ("SESSIONGATE_ADMISSION_LOOP_LAG_TARGET_MS", "0"),
    )
    config = LoadConfig(
        sessions=40, duration_s=6.0, warmup_s=1.0, baseline_requests=20, gateway_env=settings, shed_probe_rate=20.0
    )
    report = run_load(config, work_dir=tmp_path)
    probe = report.shed_probe
    assert probe["errors"] == {}
    assert probe["sent"] >= 40
    assert probe["shed_ms"]["n"] > 0
    assert probe["shed_ms"]["p50"] > 0
    assert probe["shed_ms"]["n"] + probe["admitted"] == probe["sent"]
    assert report.rows["turns_ok"] == report.turns_ok + probe["admitted"]
    assert "quiet client" in report.summary()

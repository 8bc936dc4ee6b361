"""The cluster simulator: hand-computed timings, determinism, and that it drives the gateway's own objects."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sessiongate import gateway
from sessiongate.benchmarks.metrics import TurnRecord, read_records, write_records
from sessiongate.benchmarks.sim import SYSTEMS, Calibration, cpu_profile, main, simulate
from sessiongate.benchmarks.sim.calibrate_cpu import fit_decode, fit_move, fit_prefill
from sessiongate.benchmarks.sim.experiments import closed_loop_sessions, sessions_from_records, validate, workload
from sessiongate.benchmarks.workloads import HintModel, SessionTrace, Turn

# forward(n) = 10 ms + 1 ms per token of the step; nothing else costs time except the copies.
SIMPLE = Calibration(
    name="hand",
    label="simulated hand",
    kv_bytes_per_token=1000,
    forward_points=((0, 0.010), (1000, 1.010)),
    attention_s_per_pair=0.0,
    kv_read_s_per_token=0.0,
    per_seq_s=0.0,
    host_to_device_bytes_per_s=1e6,  # 1,000 tokens/s
    pool_to_host_bytes_per_s=1e6,
    device_kv_tokens=10_000,
    host_kv_tokens=10_000,
    pool_kv_tokens_per_worker=100_000,
    chunk_tokens=1000,
    max_running=8,
    page_tokens=1,
)


def _session(sid: str, start: float, *turns: tuple[int, int, float]) -> SessionTrace:
    built = tuple(Turn(a, o, g, "first" if k == 0 else "user") for k, (a, o, g) in enumerate(turns))
    return SessionTrace(sid, "synthetic", start, built)


def _by_session(records: list[TurnRecord]) -> dict[tuple[str, int], TurnRecord]:
    return {(r.session_id, r.turn): r for r in records}


def test_two_sessions_on_one_worker_by_hand() -> None:
    # A (t=0): 100-token prompt, 3 output tokens. B (t=0.05): 200-token prompt, 2 output tokens.
    #   0     -> 0.110  prefill A (100 tokens): 10 + 100 ms.      A's first token at 0.110: TTFT 0.110
    #   0.110 -> 0.321  prefill B (200) + decode A (1): 10 + 201 ms.  B's first token: TTFT 0.321 - 0.05 = 0.271
    #   0.321 -> 0.333  decode A and B (2 tokens): 10 + 2 ms.     both end at 0.333
    records = simulate(
        "recompute", [_session("A", 0.0, (100, 3, 0.0)), _session("B", 0.05, (200, 2, 0.0))], SIMPLE, workers=1
    ).records
    a, b = _by_session(records)[("A", 0)], _by_session(records)[("B", 0)]
    assert a.ttft_s == pytest.approx(0.110)
    assert b.ttft_s == pytest.approx(0.271)
    assert a.done_s == pytest.approx(0.333)
    assert b.done_s == pytest.approx(0.333)
    assert (a.cached_device, a.cached_host, a.cached_pool) == (0, 0, 0)


def test_workers_sharing_a_machine_slow_each_other_by_hand() -> None:
    # Two workers on one machine, a step 1.5x as long while the other computes. A and B (100 tokens, 1 output)
    # at t=0 go to w00 and w01 (round robin): w00's step starts with w01 idle, 110 ms; w01's starts with w00
    # busy, 165 ms. C at t=1 finds both idle again: 110 ms. Without the shared machine all three take 110 ms.
    shared = dataclasses.replace(SIMPLE, cores=2, shared_prefill_slowdown=1.5, shared_decode_slowdown=1.5)
    sessions = [_session(s, t, (100, 1, 0.0)) for s, t in (("A", 0.0), ("B", 0.0), ("C", 1.0))]
    records = _by_session(simulate("recompute", sessions, shared, workers=2).records)
    assert [records[(s, 0)].ttft_s for s in "ABC"] == pytest.approx([0.110, 0.165, 0.110])
    alone = _by_session(simulate("recompute", sessions, SIMPLE, workers=2).records)
    assert [alone[(s, 0)].ttft_s for s in "ABC"] == pytest.approx([0.110, 0.110, 0.110])
    # One worker has nobody to share with.
    single = _by_session(simulate("recompute", sessions[:1], shared, workers=1).records)
    assert single[("A", 0)].ttft_s == pytest.approx(0.110)


def test_the_fronts_cpu_slows_workers_that_have_no_core_to_spare_by_hand() -> None:
    # One worker on one core; each turn costs the front 0.5 s of CPU, charged when sent, over a 1 s window: the
    # worker and the front want 1.5 cores of 1, so A's 110 ms step takes 165 ms. B at t=5 finds A's charge gone
    # and brings its own. With 2 cores there is room for both, and nothing slows.
    one_core = dataclasses.replace(SIMPLE, cores=1, front_cpu_s_per_turn=0.5)
    sessions = [_session("A", 0.0, (100, 1, 0.0)), _session("B", 5.0, (100, 1, 0.0))]
    records = _by_session(simulate("recompute", sessions, one_core, workers=1).records)
    assert [records[(s, 0)].ttft_s for s in "AB"] == pytest.approx([0.165, 0.165])
    two_cores = _by_session(simulate("recompute", sessions, dataclasses.replace(one_core, cores=2), workers=1).records)
    assert [two_cores[(s, 0)].ttft_s for s in "AB"] == pytest.approx([0.110, 0.110])


def test_device_hit_in_whole_pages_by_hand() -> None:
    # Turn 0: 100 tokens, 1 output: first (and last) token at 0.110. Turn 1 sent 1 s later with 100 + 1 + 50 = 151
    # tokens; the device holds 101, i.e. 96 in 16-token pages, so 55 are computed: 10 + 55 ms.
    cal = dataclasses.replace(SIMPLE, page_tokens=16)
    records = simulate("recompute", [_session("A", 0.0, (100, 1, 0.0), (50, 1, 1.0))], cal, workers=1).records
    second = _by_session(records)[("A", 1)]
    assert second.sent_s == pytest.approx(1.110)
    assert (second.prompt_tokens, second.cached_device, second.recomputed_tokens) == (151, 96, 55)
    assert second.ttft_s == pytest.approx(0.065)


def test_host_hit_after_eviction_by_hand() -> None:
    # Device KV of 300 tokens. X (t=0): 100 tokens, 1 output; ends at 0.110 and keeps 101 tokens on the device
    # and in host. Y (t=0.5): 250 tokens needs 251, so X's device entry is evicted; Y's TTFT 10 + 250 ms.
    # X's next turn (sent at 1.0, 151 tokens) evicts Y, copies X's 101 tokens from host at 1,000 tokens/s
    # (0.101 s) layer by layer under the prefill of its 50 new tokens (0.060 s), which the copy hides: TTFT 0.101
    # (0.161 with the copy before the prefill, as on a CPU worker below).
    cal = dataclasses.replace(SIMPLE, device_kv_tokens=300)
    sessions = [_session("X", 0.0, (100, 1, 0.0), (50, 1, 0.89)), _session("Y", 0.5, (250, 1, 0.0))]
    result = simulate("sticky", sessions, cal, workers=1)
    records = _by_session(result.records)
    assert records[("Y", 0)].ttft_s == pytest.approx(0.260)
    second = records[("X", 1)]
    assert (second.cached_device, second.cached_host, second.recomputed_tokens) == (0, 101, 50)
    assert second.ttft_s == pytest.approx(0.101)
    assert result.bytes_moved["host->device"] == 101 * 1000


def test_copies_on_the_workers_core_by_hand() -> None:
    # As the host-hit case, with copies on the worker's core (CPU) and 5 ms of hit overhead. The core idles when
    # X's copy starts: it is busy with it for 0.101 s, once; then the hit's 5 ms, then 50 tokens: 0.166.
    cal = dataclasses.replace(SIMPLE, device_kv_tokens=300, moves_on_compute=True, hit_overhead_s=0.005)
    sessions = [_session("X", 0.0, (100, 1, 0.0), (50, 1, 0.89)), _session("Y", 0.5, (250, 1, 0.0))]
    assert _by_session(simulate("sticky", sessions, cal, workers=1).records)[("X", 1)].ttft_s == pytest.approx(0.166)
    # Now Z decodes 200 tokens when X's copy is made (a 500-token device: Y's 400 tokens still evict X's copy,
    # and Z and X then fit side by side): the core shares the copy's 0.101 s between them. X waits for its copy
    # and for the core time the copy took from Z's step; Z ends 0.101 s later than with copies off the core.
    roomy = dataclasses.replace(cal, device_kv_tokens=500)
    busy = [_session("X", 0.0, (100, 1, 0.0), (50, 1, 0.89)), _session("Y", 0.5, (400, 1, 0.0))]
    busy.append(_session("Z", 0.95, (10, 200, 0.0)))
    on = _by_session(simulate("sticky", busy, roomy, workers=1).records)
    off = _by_session(simulate("sticky", busy, dataclasses.replace(roomy, moves_on_compute=False), workers=1).records)
    assert on[("X", 1)].cached_host == off[("X", 1)].cached_host == 101
    assert (on[("Z", 0)].done_s or 0) - (off[("Z", 0)].done_s or 0) == pytest.approx(0.101, abs=0.011)
    # Off the core the copy also hides under X's prefill of 50 tokens (0.060 s of it).
    assert (on[("X", 1)].ttft_s or 0) - (off[("X", 1)].ttft_s or 0) == pytest.approx(0.161, abs=0.011)


def test_recompute_has_no_host_tier() -> None:
    cal = dataclasses.replace(SIMPLE, device_kv_tokens=300)
    sessions = [_session("X", 0.0, (100, 1, 0.0), (50, 1, 0.89)), _session("Y", 0.5, (250, 1, 0.0))]
    second = _by_session(simulate("recompute", sessions, cal, workers=1).records)[("X", 1)]
    assert (second.cached_device, second.cached_host, second.recomputed_tokens) == (0, 0, 151)


def test_advisory_prefetch_turns_a_pool_read_into_a_device_hit() -> None:
    # Two workers; X's second turn comes 20 s after its first. With a hint 11.3 s ahead, the advisor prefetches X's
    # context to the worker kv_aware would pick, so the request finds it there instead of reading the pool.
    sessions = [_session("X", 0.0, (400, 1, 0.0), (20, 1, 20.0))]
    plain = _by_session(simulate("kv_aware", sessions, SIMPLE, workers=2).records)[("X", 1)]
    advised = simulate("kv_aware+advisories", sessions, SIMPLE, workers=2, hints=HintModel(lead_s=11.3))
    second = _by_session(advised.records)[("X", 1)]
    assert advised.advisories["used"] == 1
    assert advised.advisories["missed"] == 0
    assert second.cached_device + second.cached_host >= plain.cached_device + plain.cached_host
    assert second.ttft_s is not None
    assert plain.ttft_s is not None
    assert second.ttft_s <= plain.ttft_s


def test_missed_hints_are_counted() -> None:
    sessions = [_session(f"S{i}", 0.1 * i, (100, 1, 0.0), (20, 1, 5.0), (20, 1, 5.0)) for i in range(4)]
    result = simulate("kv_aware+advisories", sessions, SIMPLE, workers=2, hints=HintModel(missed_rate=1.0))
    assert result.advisories["missed"] == 8
    assert result.advisories["used"] == result.advisories["late"] == result.advisories["wasted"] == 0


def test_deterministic_for_a_seed() -> None:
    work = workload("sharegpt", 12, seed=4, sessions_per_user=2, think_time_s=3.0)
    hints = HintModel(lead_s=2.0, false_rate=0.3, missed_rate=0.1)
    runs = [
        simulate(
            "kv_aware+advisories", work.sessions, SIMPLE, workers=3, hints=hints, seed=7, follow_ups=work.follow_ups
        )
        for _ in range(2)
    ]
    assert runs[0].records == runs[1].records
    assert runs[0].advisories == runs[1].advisories
    assert len(runs[0].records) == sum(len(s.turns) for s in work.sessions)
    other = simulate(
        "kv_aware+advisories", work.sessions, SIMPLE, workers=3, hints=hints, seed=8, follow_ups=work.follow_ups
    )
    assert other.advisories != runs[0].advisories or other.records != runs[0].records


@pytest.mark.parametrize(
    ("system", "policy_class"),
    [
        ("recompute", gateway.routing.RoundRobin),
        ("sticky", gateway.routing.Sticky),
        ("cache_aware", gateway.routing.CacheAware),
        ("kv_aware", gateway.routing.KVAware),
        ("kv_aware+advisories", gateway.routing.KVAware),
        ("dynamo_cost", gateway.routing.DynamoCost),
    ],
)
def test_systems_use_the_gateways_policies(system: str, policy_class: type) -> None:
    sessions = [_session(f"S{i}", 0.0, (100, 4, 0.0), (30, 4, 2.0)) for i in range(6)]
    result = simulate(system, sessions, SIMPLE, workers=3)
    assert type(result.policy) is policy_class
    assert SYSTEMS[system].policy == result.policy.name


def test_the_gateways_advisor_book_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    claim = gateway.advisor.core.AdvisorBook.claim

    def spy(self: gateway.advisor.core.AdvisorBook, session_id: str, worker_id: str, now: float) -> object:
        calls.append(session_id)
        return claim(self, session_id, worker_id, now)

    monkeypatch.setattr(gateway.advisor.core.AdvisorBook, "claim", spy)
    sessions = [_session(f"S{i}", 0.0, (100, 4, 0.0), (30, 4, 2.0)) for i in range(3)]
    simulate("kv_aware+advisories", sessions, SIMPLE, workers=2)
    assert sorted(calls) == sorted(s.id for s in sessions for _ in s.turns)


def test_validation_of_the_simulator_against_itself_is_exact() -> None:
    work = workload("sharegpt", 6, seed=2, sessions_per_user=2, think_time_s=2.0)
    real = simulate("kv_aware", work.sessions, SIMPLE, workers=2, follow_ups=work.follow_ups).records
    rebuilt = sessions_from_records(real)
    assert sum(len(s.turns) for s in rebuilt) == len(real)
    (row,) = validate(real, SIMPLE, hints=HintModel(), seed=0)
    assert row["turns"] == len(real)
    assert row["abs_error_s"]["p99"] == pytest.approx(0.0, abs=1e-9)


def test_closed_loop_validation_recovers_the_slots_and_is_exact_against_itself() -> None:
    work = workload("sharegpt", 4, seed=3, sessions_per_user=3, think_time_s=1.0)
    chained = {sid: (nxt, 0.0) for sid, (nxt, _) in work.follow_ups.items()}  # a replay slot starts the next at once
    real = simulate("kv_aware", work.sessions, SIMPLE, workers=2, follow_ups=chained).records
    sessions, follow_ups = closed_loop_sessions(real)
    assert {sid: nxt for sid, (nxt, _) in follow_ups.items()} == {sid: nxt for sid, (nxt, _) in chained.items()}
    assert sum(len(s.turns) for s in sessions) == len(real)
    (row,) = validate(real, SIMPLE, hints=HintModel(), seed=0, loop="closed")
    assert (row["loop"], row["turns"]) == ("closed", len(real))
    assert row["abs_error_s"]["p99"] == pytest.approx(0.0, abs=1e-9)


def test_calibration_fits_recover_known_coefficients() -> None:
    prefill = fit_prefill([(n, 0.2 + 1e-4 * n + 1e-7 * n * n) for n in (16, 128, 512, 1024, 1536)])
    assert prefill == pytest.approx({"a_s": 0.2, "per_token_s": 1e-4, "per_token_sq_s": 1e-7}, rel=1e-6)
    # A negative term (noise) is dropped, never kept.
    assert fit_prefill([(16, 0.5), (512, 0.4), (1024, 0.45)])["per_token_s"] >= 0.0
    decode = fit_decode([(b, c, 0.05 + 0.01 * b + 1e-5 * b * c) for b in (1, 2, 4, 8) for c in (40, 200)])
    assert decode == pytest.approx({"base_s": 0.05, "per_seq_s": 0.01, "per_kv_token_s": 1e-5}, rel=1e-6)
    move = fit_move([(1_000_000, 0.06), (4_000_000, 0.09)])
    assert move == pytest.approx({"latency_s": 0.05, "bytes_per_s": 1e8}, rel=1e-6)


def test_h100_calibration_matches_its_sources() -> None:
    from sessiongate.benchmarks.sim import h100_llama8b

    cal = h100_llama8b()
    # vidur: the whole 7B model, 1 token 5.6 ms; x1.08 for Llama-3-8B.
    assert cal.forward_s(1) == pytest.approx(5.6e-3 * 1.08, rel=0.02)
    assert 2048 / cal.prefill_s(2048) == pytest.approx(40_000, rel=1e-6)
    # A decode step of 32 sequences of 4k tokens: the forward pass plus 16 GiB of KV at 2.7 TB/s.
    assert cal.step_s(32, 0, 32 * 4096, 32) == pytest.approx(cal.forward_s(32) + 32 * 4096 * 131072 / 2.7e12)
    cost = cal.cost_model()
    assert cost.kv_bytes_per_token == 131_072
    assert cost.host_to_device_bytes_per_s == 55e9


def test_cli_writes_a_report(tmp_path: Path) -> None:
    code = main(
        [
            "--calibration", "h100", "--workers", "2", "--trace", "sharegpt", "--loads", "4", "8",
            "--sessions-per-user", "2", "--system", "recompute", "kv_aware", "--out", str(tmp_path), "--seed", "1",
        ]
    )  # fmt: skip
    assert code == 0
    report = (tmp_path / "2w" / "report.md").read_text()
    assert "simulated H100" in report
    assert (tmp_path / "2w" / "latency_vs_load.png").stat().st_size > 0
    records = read_records(tmp_path / "2w" / "records" / "records-kv_aware-sharegpt-2w-8.jsonl")
    assert records
    assert all(r.system == "kv_aware" for r in records)


def _profile(path: Path) -> Path:
    profile = {
        "kind": "cpu",
        "model_size": "tiny",
        "measured_at": "2026-01-01T00:00:00+00:00",
        "machine": {"platform": "test", "processor": "", "cpus": 2},
        "worker": {
            "max_total_tokens": 2048,
            "chunked_prefill_size": 1024,
            "max_running_requests": 8,
            "page_size": 16,
            "hicache_ratio": 4.0,
        },
        "prefill": {"points": [], "fit": {"a_s": 0.3, "per_token_s": 1e-4, "per_token_sq_s": 1e-7}},
        "decode": {"points": [], "fit": {"base_s": 0.05, "per_seq_s": 0.01, "per_kv_token_s": 1e-6}},
        "moves": {
            "pool_to_host": {"latency_s": 0.02, "bytes_per_s": 5e8},
            "host_to_device": {"latency_s": 0.01, "bytes_per_s": 1e9},
            "kv_bytes_per_token": 4096,
        },
    }
    path.write_text(json.dumps(profile))
    return path


def test_cpu_profile_reproduces_the_measured_prefill(tmp_path: Path) -> None:
    cal = cpu_profile(_profile(tmp_path / "cpu.json"))
    assert cal.label == "simulated CPU"
    assert (cal.device_kv_tokens, cal.host_kv_tokens, cal.page_tokens) == (2048, 8192, 16)
    # A lone prefill of n tokens on an idle worker, plus the request overhead, is the fitted a + b*n + c*n^2 while
    # it fits one chunk; each further chunk is one more step (its fixed cost, 0.05 s, on top).
    for n in (100, 1000):
        assert cal.request_overhead_s + cal.prefill_s(n) == pytest.approx(0.3 + 1e-4 * n + 1e-7 * n * n)
    assert cal.request_overhead_s + cal.prefill_s(1500) == pytest.approx(0.3 + 0.15 + 0.225 + 0.05)
    # One decode step of B sequences reading K tokens of KV: base + per_seq*B + per_kv*K.
    assert cal.step_s(4, 0, 400, 4) == pytest.approx(0.05 + 0.01 * 4 + 1e-6 * 400)
    # What the gateway adds to a turn is request overhead too; kv_aware's cost model gets the moves' latencies.
    profile = json.loads((tmp_path / "cpu.json").read_text())
    with_front = tmp_path / "front.json"
    with_front.write_text(json.dumps({**profile, "front": {"overhead_s": 0.04}}))
    assert cpu_profile(with_front).request_overhead_s == pytest.approx(cal.request_overhead_s + 0.04)
    cost = cal.cost_model()
    assert (cost.host_to_device_latency_s, cost.pool_to_device_latency_s) == pytest.approx((0.01, 0.03))


def test_cli_validates_against_replay_records(tmp_path: Path) -> None:
    profile = _profile(tmp_path / "cpu.json")
    cal = cpu_profile(profile)
    work = workload("sharegpt", 3, seed=1, sessions_per_user=1, think_time_s=1.0, max_context_tokens=1500)
    real = simulate("sticky", work.sessions, cal, workers=2).records
    records = tmp_path / "replay.jsonl"
    write_records(records, [dataclasses.replace(r, first_token_s=r.sent_s + 2 * (r.ttft_s or 0)) for r in real])
    out = tmp_path / "out"
    assert (
        main(["--calibration", "cpu", "--cpu-profile", str(profile), "--validate", str(records), "--out", str(out)])
        == 0
    )
    (row,) = json.loads((out / "validation.json").read_text())
    # The "real" TTFTs were twice the simulated ones: the simulation is 50% low.
    assert row["system"] == "sticky"
    assert row["relative_error"]["mean"] == pytest.approx(-0.5, abs=1e-6)
    assert "TTFT prediction error" in (out / "validation.md").read_text()


def test_the_kept_replay_records_reproduce_the_documented_validation(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/simulator.md's validation table, row kv_aware at 4 sessions, from the gzip-compressed records the
    repository keeps for it (benchmarks/results/replay-sharegpt-cpu/records/)."""
    repo = Path(__file__).resolve().parents[2]
    records = repo / "benchmarks" / "results" / "replay-sharegpt-cpu" / "records" / "kv_aware-4.jsonl.gz"
    profile = repo / "sessiongate" / "benchmarks" / "sim" / "profiles" / "cpu_tiny.json"
    argv = ["--calibration", "cpu", "--workers", "2", "--cpu-profile", str(profile), "--validate", str(records)]
    assert main(argv) == 0
    assert "| kv_aware | 2 | 142 | 32 / 29 / 93 | 21 / 17 / 47 | -35% / -41% / -49% |" in capsys.readouterr().out
    documented = (repo / "docs" / "simulator.md").read_text()
    assert "| kv_aware | 4 | 142 | 32 / 93 | 21 / 47 | -35% / -49% |" in documented

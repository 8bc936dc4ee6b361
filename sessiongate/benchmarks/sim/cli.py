"""`python -m sessiongate.benchmarks.sim` / `sessiongate bench sim`: load sweeps, hint sweeps and validation from the
shell.

# every system on 16 simulated H100s, the Mooncake hour at its recorded rate (prints the wall time)
python -m sessiongate.benchmarks.sim --calibration h100 --workers 16 --trace mooncake --out results/sim-mooncake
# SYMPHONY's experiment: closed-loop ShareGPT users against latency, 16 workers
python -m sessiongate.benchmarks.sim --calibration h100 --workers 16 --trace sharegpt --loads 256 512 1024 2048 --out \
    DIR
# hint quality: lead time 0-16 s (also: false, missed)
python -m sessiongate.benchmarks.sim --calibration h100 --workers 16 --trace sharegpt --loads 1024 --sweep lead --out \
    DIR
# TTFT prediction error against a real replay's records, with the measured CPU profile
python -m sessiongate.benchmarks.sim --calibration cpu --validate results/replay/records.jsonl --out DIR
# issue 15: long-context agents with tool calls (32k-128k), the tool-call KV lifecycle against the baselines
python -m sessiongate.benchmarks.sim --experiment toolkv --workers 16 --loads 32 64 128 192 256 --tool-scale 1 20 \
    --out DIR
# the same, the agents posting each tool's result when it returns, the turn 0.2 s + Exp(mean 1.8 s) later
python -m sessiongate.benchmarks.sim --experiment toolkv --workers 16 --loads 32 64 --result-gap 0.2 1.8 --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from sessiongate.benchmarks.metrics import read_records
from sessiongate.benchmarks.workloads import HintModel

from .agent_long import ResultGap
from .calibration import PROFILES_DIR, Calibration, cpu_profile, h100_llama8b
from .cluster import SYSTEMS
from .experiments import EXPERIMENTS, SWEEPS, hint_sweep, load_sweep, validate, validation_markdown

__all__ = ["DEFAULT_CPU_PROFILE", "main"]

DEFAULT_CPU_PROFILE = PROFILES_DIR / "cpu_tiny.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessiongate bench sim", description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", choices=("h100", "cpu"), default="h100")
    parser.add_argument("--cpu-profile", type=Path, default=DEFAULT_CPU_PROFILE, help="from calibrate_cpu.py")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=None,
        help="default 16; with --validate, default the number of workers named in the records (a router that"
        " reports none, like sglang-router, needs it given)",
    )
    parser.add_argument("--trace", choices=("mooncake", "sharegpt", "agent", "agent-long"), default="mooncake")
    parser.add_argument("--system", nargs="+", choices=sorted(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument(
        "--loads",
        type=float,
        nargs="+",
        default=None,
        help="Mooncake: multiples of the recorded rate (default 1); ShareGPT/agent: concurrent users (default 256)",
    )
    parser.add_argument("--duration", type=float, default=None, help="Mooncake: seconds of the trace (default all)")
    parser.add_argument("--sessions-per-user", type=int, default=8)
    parser.add_argument("--think-time", type=float, default=20.0, help="mean seconds between a user's sessions/turns")
    parser.add_argument("--token-scale", type=float, default=1.0, help="multiply every token count (small models)")
    parser.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="cut sessions past this many tokens (default: the model's context window)",
    )
    parser.add_argument(
        "--min-context",
        type=int,
        default=32_768,
        help="agent-long: each session's context is stretched towards a length drawn in [this, --max-context]",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="agent-long: rounds a session (the trajectory's later rounds repeat; default: as recorded, 21-32)",
    )
    parser.add_argument("--device-kv-tokens", type=int, default=None, help="override the calibration's device KV")
    parser.add_argument("--host-kv-tokens", type=int, default=None)
    parser.add_argument(
        "--pool-link-gbps",
        type=float,
        default=None,
        help="the pool link's rate in Gb/s (pool -> host), e.g. 100 (default: the calibration's)",
    )
    parser.add_argument("--lead", type=float, default=HintModel().lead_s)
    parser.add_argument(
        "--lead-sigma",
        type=float,
        default=HintModel().lead_sigma,
        help="spread of each hint's lead (log-normal sigma around --lead; 0: every lead is --lead)",
    )
    parser.add_argument("--false-rate", type=float, default=0.0)
    parser.add_argument(
        "--false-seeds", type=int, default=3, help="toolkv: samples of sessions the false-hint cost is the mean of"
    )
    parser.add_argument("--missed-rate", type=float, default=0.0)
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default=None)
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default=None, help="a named experiment")
    parser.add_argument(
        "--tool-scale", type=float, nargs="+", default=[1.0], help="toolkv, agent-long: multiply the trace's tool times"
    )
    parser.add_argument(
        "--result-gap",
        type=float,
        nargs="+",
        default=None,
        metavar=("MIN_S", "TAIL_MEAN_S"),
        help="toolkv: the agents post each tool's result when it returns and send the turn MIN_S (plus an"
        " exponential tail of mean TAIL_MEAN_S) later; default: the result comes inside the next request",
    )
    parser.add_argument("--validate", type=Path, default=None, help="JSONL of TurnRecords from a real replay")
    parser.add_argument(
        "--validate-loop",
        choices=("open", "closed"),
        default="closed",
        help="closed: the replay's closed loop (think times, session order); open: each turn at its recorded time",
    )
    parser.add_argument("--slo-p99-ttft", type=float, default=None, help="seconds; adds sessions served at the SLO")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _calibration(args: argparse.Namespace) -> Calibration:
    cal = h100_llama8b() if args.calibration == "h100" else cpu_profile(args.cpu_profile)
    if args.pool_link_gbps is not None:
        cal = dataclasses.replace(cal, pool_to_host_bytes_per_s=args.pool_link_gbps * 1e9 / 8)
    return cal.with_capacity(device_kv_tokens=args.device_kv_tokens, host_kv_tokens=args.host_kv_tokens)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.result_gap is not None and len(args.result_gap) > 2:
        parser.error("--result-gap takes MIN_S and at most one TAIL_MEAN_S")
    cal = _calibration(args)
    worker_counts: list[int] = args.workers or [16]
    hints = HintModel(
        lead_s=args.lead, false_rate=args.false_rate, missed_rate=args.missed_rate, lead_sigma=args.lead_sigma
    )
    began = time.perf_counter()
    if args.experiment is not None:
        systems = args.system if args.system != list(SYSTEMS) else None
        text = EXPERIMENTS[args.experiment](
            cal,
            workers=worker_counts,
            loads=[int(load) for load in (args.loads or [32, 64, 128, 256])],
            tool_scales=args.tool_scale,
            result_gap=None if args.result_gap is None else ResultGap(*args.result_gap),
            **({"systems": systems} if systems else {}),
            slo_p99_ttft_s=args.slo_p99_ttft or 10.0,
            false_rate=args.false_rate or 0.6,
            false_seeds=args.false_seeds,
            sessions_per_user=args.sessions_per_user,
            think_time_s=args.think_time,
            seed=args.seed,
            out_dir=args.out,
            command="python -m sessiongate.benchmarks.sim " + " ".join(argv if argv is not None else sys.argv[1:]),
        )
        print(text)
        print(f"wall time {time.perf_counter() - began:.1f} s")
        return 0
    if args.validate is not None:
        workers = args.workers[0] if args.workers else None
        records = read_records(args.validate)
        rows = validate(records, cal, hints=hints, seed=args.seed, workers=workers, loop=args.validate_loop)
        text = validation_markdown(rows, cal, args.validate)
        print(text)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "validation.md").write_text(text)
            (args.out / "validation.json").write_text(json.dumps(rows, indent=1))
        return 0
    options = {
        "sessions_per_user": args.sessions_per_user,
        "think_time_s": args.think_time,
        "duration_s": args.duration,
        "token_scale": args.token_scale,
        "max_context_tokens": args.max_context or cal.max_context_tokens,
    }
    if args.trace == "agent-long":
        options |= {"tool_scale": args.tool_scale[0], "min_context_tokens": args.min_context, "rounds": args.rounds}
    loads = args.loads or ([1.0] if args.trace == "mooncake" else [256.0])
    if args.sweep is not None:
        out = args.out or Path("sim-sweep")
        for workers in worker_counts:
            table = hint_sweep(
                args.sweep,
                args.trace,
                loads[0],
                cal,
                workers=workers,
                base=hints,
                seed=args.seed,
                out_dir=out / f"{workers}w",
                **options,
            )
            print(table.read_text())
        print(f"wall time {time.perf_counter() - began:.1f} s")
        return 0
    from sessiongate.benchmarks.report import write_report

    for workers in worker_counts:
        summaries = load_sweep(
            args.trace,
            loads,
            args.system,
            cal,
            workers=workers,
            hints=hints,
            seed=args.seed,
            out_dir=args.out / f"{workers}w" if args.out else None,
            **options,
        )
        if args.out is not None:
            notes = [
                f"{cal.label}: {cal.name} ({cal.source}); {workers} workers; trace {args.trace}; seed {args.seed}",
                f"device KV {cal.device_kv_tokens} tokens, host {cal.host_kv_tokens} tokens per worker; hints {hints}",
                "simulated, not measured: see docs/simulator.md for the model and its limits",
            ]
            report = write_report(
                args.out / f"{workers}w",
                f"{cal.label}: {args.trace}, {workers} workers",
                summaries,
                notes=notes,
                slo_p99_ttft_s=args.slo_p99_ttft,
            )
            print(f"report: {report}")
    print(f"wall time {time.perf_counter() - began:.1f} s")
    return 0

"""`sessiongate bench replay`: replay a trace against each system at each load, then write the report.

    sessiongate bench replay --workload sharegpt --loads 2,4 --out benchmarks/results/replay-sharegpt
    sessiongate bench replay --busy-worker --out benchmarks/results/busy-worker
    sessiongate bench replay --url http://127.0.0.1:8000 --systems kv_aware   # a stack you started yourself
    sessiongate bench replay --workload agent --loads 4,8 --dry-run   # check flags, traces, profile; run nothing
    sessiongate bench replay --workload agent-long --tool-scale 20 --tool-time-scale 1 \
        --systems recompute,smg,kv_aware+toolkv   # long-context agents whose tools run for seconds (issue 15)

For each system the harness starts fresh workers (cold caches, an empty pool) and its front, then runs the loads
in increasing order on them; each load draws its own sessions (other seeds), so no load reuses another's prefixes.
Each run writes `records/<system>-<load>.jsonl` (one `TurnRecord` a line) and the report is rewritten after every
run, so an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx

from sessiongate.benchmarks.metrics import RunSummary, summarize, summary_from_dict, write_records
from sessiongate.benchmarks.pool_link import link_unavailable
from sessiongate.benchmarks.report import write_report
from sessiongate.benchmarks.workloads import SessionTrace, TracesMissingError
from sessiongate.gateway.routing import CostModel
from sessiongate.sglang_ext.models import MODEL_NAMES
from sessiongate.sglang_ext.mooncake import mooncake_unavailable

from .common import (
    LABEL,
    advisory_counts,
    cluster_config,
    estimated_bytes,
    hint_model,
    in_window,
    load_sessions,
    model_name,
    prefetch_bytes_moved,
    run_notes,
    save,
    synthetic_text,
    tool_calls_on,
    work_dir,
)
from .driver import ReplayOptions, ReplayResult, replay
from .systems import SYSTEMS, running_stack

__all__ = ["build_parser", "cluster_config", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sessiongate bench replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("sharegpt", "agent", "agent-long", "mooncake"), default="sharegpt")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, run in this order")
    p.add_argument("--loads", default="2,4", help="concurrent sessions (closed loop), comma-separated")
    p.add_argument(
        "--sessions-per-slot",
        type=int,
        default=10,
        help="sessions drawn per unit of load: enough that no slot runs out before --duration-s",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=240.0,
        help="the measurement window: turns sent after it are not counted, and no session starts after it",
    )
    p.add_argument("--time-scale", type=float, default=0.25, help="multiplies think, tool and arrival times")
    p.add_argument(
        "--tool-time-scale",
        type=float,
        default=None,
        help="multiplies tool times instead of --time-scale (default: --time-scale); 1: tools take their time",
    )
    p.add_argument(
        "--tool-scale",
        type=float,
        default=20.0,
        help="agent-long: the recorded tool times times this (the simulator's --tool-scale; a what-if)",
    )
    p.add_argument(
        "--min-context-tokens",
        type=int,
        default=4096,
        help="agent-long: each session's context is stretched towards a length drawn in [this, --max-context-tokens]",
    )
    p.add_argument(
        "--no-tool-calls",
        action="store_true",
        help="agent workloads: plain text answers and user messages instead of real tool calls and tool results",
    )
    p.add_argument("--think-time-s", type=float, default=20.0, help="ShareGPT: mean think time between turns")
    p.add_argument("--token-scale", type=float, default=0.5, help="multiplies every token count of the trace")
    p.add_argument("--max-context-tokens", type=int, default=1536, help="after scaling; longer sessions are cut")
    p.add_argument(
        "--max-output-tokens", type=int, default=48, help="answers capped (after scaling): CPU decode is slow"
    )
    p.add_argument("--system-tokens", type=int, default=1200, help="ShareGPT: a system prompt before turn 0")
    p.add_argument("--min-turns", type=int, default=2, help="only sessions with at least this many turns")
    p.add_argument("--hint-lead-s", type=float, default=11.3)
    p.add_argument("--false-hints", type=float, default=0.0, help="share of hints that no request follows")
    p.add_argument("--missed-hints", type=float, default=0.0, help="share of turns that get no hint")
    p.add_argument("--model-size", "--model", dest="model_size", choices=MODEL_NAMES, default="tiny")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--max-total-tokens", type=int, default=2048, help="device KV pool per worker, in tokens")
    p.add_argument("--slo-p99-ttft-s", type=float, default=1.0)
    p.add_argument(
        "--state-dir", type=Path, default=Path(".sessiongate/bench"), help="the model, and each run's logs and pools"
    )
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/replay-<workload>")
    p.add_argument("--url", default=None, help="replay against this running stack (one system) instead")
    p.add_argument("--busy-worker", action="store_true", help="the busy-worker scenario (see busy.py)")
    p.add_argument("--busy-streams", type=int, default=2, help="busy worker: background generations at a time")
    p.add_argument("--busy-output-tokens", type=int, default=128, help="busy worker: tokens per generation")
    p.add_argument(
        "--cpu-profile",
        default=None,
        help="calibrate_cpu's profile of these workers, whose cost model kv_aware uses (as the simulator does); "
        "default sessiongate/benchmarks/sim/profiles/cpu_<model-size>.json when it exists; 'none': the gateway's "
        "defaults",
    )
    p.add_argument(
        "--pool-link",
        default=None,
        metavar="MBIT|auto",
        help="put the shared pool behind an emulated network link of this rate (a Mooncake Store in a network "
        "namespace; root): Mbit/s, or 'auto' for the rate at which a pool read costs the share of a prefill it "
        "costs an H100 (sessiongate/benchmarks/pool_link.py); default: a pool directory on this machine",
    )
    p.add_argument("--pool-link-delay-ms", type=float, default=0.5, help="with --pool-link: the delay each way")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rerender", action="store_true", help="only rewrite the report from <out>/summaries.json")
    p.add_argument("--note", action="append", default=[], help="with --rerender: a note to add to the report")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the flags, the trace files and the CPU profile, print the plan and exit; start and write nothing",
    )
    return p


async def replay_on(
    url: str,
    system: str,
    sessions: list[SessionTrace],
    args: argparse.Namespace,
    *,
    load: int,
    hints: bool,
    tool_results: bool = False,
    oracle_lead_s: Callable[[int], float] | None = None,
) -> ReplayResult:
    async with httpx.AsyncClient(
        base_url=url, timeout=httpx.Timeout(600.0, connect=10.0), limits=httpx.Limits(max_connections=256)
    ) as client:
        options = ReplayOptions(
            system=system,
            concurrency=load,
            time_scale=args.time_scale,
            hints=hint_model(args) if hints else None,
            max_duration_s=args.duration_s,
            model=await model_name(client),
            text=synthetic_text(args),
            seed=args.seed,
            progress=not args.no_progress,
            tool_time_scale=args.tool_time_scale,
            tool_calls=tool_calls_on(args),
            post_tool_results=tool_results,
            oracle_lead_s=oracle_lead_s,
        )
        return await replay(client, sessions, options)


def oracle_lead(cost: CostModel | None) -> Callable[[int], float]:
    """The oracle's ideal lead for a context of n tokens on these workers: its load from the pool to the device at
    the cost model's rates, half as much again, plus 0.3 s for a hint's and a prefetch's round trips on CPU."""
    model = cost or CostModel()

    def lead(tokens: int) -> float:
        load = model.pool_to_device_latency_s + tokens * model.kv_bytes_per_token / model.pool_to_device_bytes_per_s
        return 1.5 * load + 0.3

    return lead


def measure(
    stack_url: str,
    system: str,
    load: int,
    args: argparse.Namespace,
    out: Path,
    *,
    hints: bool,
    tool_results: bool = False,
    stats: Callable[[], dict[str, Any] | None] = lambda: None,
    oracle_lead_s: Callable[[int], float] | None = None,
) -> RunSummary:
    sessions = load_sessions(args, args.sessions_per_slot * load, seed=args.seed * 1000 + load)
    stats_before = stats()
    result = anyio.run(
        functools.partial(
            replay_on,
            stack_url,
            system,
            sessions,
            args,
            load=load,
            hints=hints,
            tool_results=tool_results,
            oracle_lead_s=oracle_lead_s,
        )
    )
    stats_after = stats()
    before, after = advisory_counts(stats_before), advisory_counts(stats_after)
    advisories = {k: after[k] - before.get(k, 0) for k in after}
    if hints or oracle_lead_s is not None:
        advisories["hints sent"] = sum(result.hints_sent.values())
    if hints or tool_results or oracle_lead_s is not None:
        advisories["hint errors"] = sum(result.hint_errors.values())
    if tool_results:
        advisories["tool results posted"] = result.tools["posted"]
    moved_before, moved_after = prefetch_bytes_moved(stats_before), prefetch_bytes_moved(stats_after)
    prefetched = {k: moved_after[k] - moved_before.get(k, 0) for k in moved_after}
    write_records(out / "records" / f"{system.replace('+', '-')}-{load}.jsonl", result.records)
    counted = in_window(result, sessions, args)
    summary = summarize(
        system,
        load,
        "sessions",
        counted,
        bytes_moved=estimated_bytes(counted, args.model_size) | prefetched,
        advisories=advisories,
        label=LABEL,
    )
    if tool_calls_on(args):
        summary.extra.update(
            {"tool calls": result.tools["calls"], "forced turns without a call": result.tools["no call"]}
        )
    errors = [r.error for r in counted if r.error]
    print(
        f"{system} @ {load}: {summary.requests} turns, {summary.errors} errors, TTFT mean "
        f"{summary.ttft.mean * 1000:.0f} ms p99 {summary.ttft.p99 * 1000:.0f} ms, recomputed "
        f"{summary.recomputed_share:.0%}" + (f"; first error: {errors[0]}" if errors else ""),
        flush=True,
    )
    return summary


def rerender(out: Path, args: argparse.Namespace) -> None:
    """The report again from the saved summaries (another SLO bound, more notes), keeping its title and notes."""
    saved = json.loads((out / "summaries.json").read_text())
    lines = (out / "report.md").read_text().splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if line.startswith("## "))]
    notes = [line[2:] for line in header if line.startswith("- ")]
    notes += [note for note in args.note if note not in notes]
    summaries = [summary_from_dict(s) for s in saved]
    write_report(out, lines[0].lstrip("# "), summaries, notes=notes, slo_p99_ttft_s=args.slo_p99_ttft_s)


def dry_run(args: argparse.Namespace, systems: list[str], loads: list[int], out: Path) -> int:
    """Everything a run would read before its first worker starts, read now: a sweep that would fail an hour in
    on a missing trace or profile fails here instead."""
    if args.cpu_profile is not None and args.cpu_profile.lower() != "none" and not Path(args.cpu_profile).is_file():
        raise SystemExit(f"--cpu-profile {args.cpu_profile}: no such file")
    cluster = cluster_config(args)  # parses the CPU profile into kv_aware's cost model, and --pool-link
    if cluster.pool_link is not None:
        why = link_unavailable() or mooncake_unavailable()
        if why is not None:
            raise SystemExit(f"--pool-link: {why}")
    for load in loads:
        try:
            sessions = load_sessions(args, args.sessions_per_slot * load, seed=args.seed * 1000 + load)
        except TracesMissingError as exc:
            raise SystemExit(str(exc)) from exc
        if not sessions:
            raise SystemExit(f"the {args.workload} trace gives no session of {args.min_turns}+ turns at load {load}")
        print(f"load {load}: {len(sessions)} sessions, {sum(len(s.turns) for s in sessions)} turns", flush=True)
    target = args.url or f"{args.workers} fresh {args.model_size} worker(s) per system"
    print(f"systems {', '.join(systems)} against {target}; report in {out}")
    for note in run_notes(args):
        print(f"- {note}")
    print("dry run: nothing started, nothing written")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv or [])
    args.load_at_start = os.getloadavg()[0]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS and args.url is None]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    loads = sorted(int(x) for x in args.loads.split(","))
    out: Path = args.out or Path("benchmarks/results") / f"replay-{args.workload}"
    if args.dry_run:
        return dry_run(args, systems, loads, out)
    out.mkdir(parents=True, exist_ok=True)
    if args.rerender:
        rerender(out, args)
        return 0
    if args.busy_worker:
        from .busy import run_busy_worker

        return run_busy_worker(args, out)
    title = f"Trace replay: {args.workload} on {args.workers} CPU workers"
    summaries: list[RunSummary] = []
    notes = run_notes(args)
    if args.url is not None:
        for load in loads:
            summaries.append(measure(args.url, systems[0], load, args, out, hints=False))
            save(out, title, summaries, notes, args)
        return 0
    cluster = cluster_config(args)
    for system in systems:
        spec = SYSTEMS[system]
        with running_stack(spec, cluster, work_dir(args, out)) as stack:
            for load in loads:
                summaries.append(
                    measure(
                        stack.url,
                        system,
                        load,
                        args,
                        out,
                        hints=spec.hints,
                        tool_results=spec.tool_results,
                        stats=stack.advisory_stats,
                        oracle_lead_s=oracle_lead(cluster.cost) if spec.oracle else None,
                    )
                )
                save(out, title, summaries, notes, args)
    print(f"report: {out / 'report.md'}")
    return 0

"""What the replay runs share (`runner.py`, every system at each load; `busy.py`, the busy-worker scenario): the
sessions a run replays, its cluster and work directory, hint model and synthetic text, the figures drawn from its
records, and the report it writes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from sessiongate.benchmarks.metrics import RunSummary, TurnRecord
from sessiongate.benchmarks.pool_link import link_spec
from sessiongate.benchmarks.report import write_report
from sessiongate.benchmarks.sim.agent_long import long_agent_sessions
from sessiongate.benchmarks.sim.calibration import PROFILES_DIR, cpu_profile
from sessiongate.benchmarks.workloads import (
    HintModel,
    SessionTrace,
    agent_sessions,
    mooncake_sessions,
    scale_tokens,
    sharegpt_sessions,
)
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.models import MODELS, model_dir

from .driver import TOOL_CALL_MAX_TOKENS, ReplayResult
from .systems import ClusterConfig, kv_bytes_per_token
from .text import SyntheticText

__all__ = [
    "LABEL",
    "advisory_counts",
    "cluster_config",
    "estimated_bytes",
    "hint_model",
    "in_window",
    "load_sessions",
    "model_name",
    "prefetch_bytes_moved",
    "run_notes",
    "save",
    "synthetic_text",
    "tool_calls_on",
    "tool_time_scale",
    "work_dir",
]

LABEL = "real CPU"


def load_sessions(args: argparse.Namespace, count: int, seed: int) -> list[SessionTrace]:
    """`count` sessions of the workload with at least `--min-turns` turns, scaled to the model: token counts
    times `--token-scale`, answers capped at `--max-output-tokens`, context cut at `--max-context-tokens`."""
    limit = math.floor(args.max_context_tokens / args.token_scale)
    drawn = count * 8  # enough to keep `count` multi-turn ones (a third of ShareGPT conversations have one turn)
    if args.workload == "sharegpt":
        raw = sharegpt_sessions(
            count=drawn,
            seed=seed,
            think_time_s=args.think_time_s,
            system_tokens=args.system_tokens,
            max_context_tokens=limit,
        )
    elif args.workload == "agent":
        raw = agent_sessions(count=drawn, seed=seed, max_context_tokens=limit)
    elif args.workload == "agent-long":
        # The simulator's toolkv workload (sim/agent_long.py): rounds stretched towards a context drawn in
        # [min, max], tool times x `--tool-scale`; the rounds past `--max-context-tokens` are cut.
        raw = long_agent_sessions(
            count=drawn,
            seed=seed,
            min_context=math.floor(args.min_context_tokens / args.token_scale),
            max_context=limit,
            tool_scale=args.tool_scale,
        )
    else:
        raw = mooncake_sessions(duration_s=args.duration_s / args.time_scale, max_context_tokens=limit)
    capped = [
        dataclasses.replace(
            s,
            turns=tuple(
                dataclasses.replace(t, output_tokens=min(t.output_tokens, args.max_output_tokens)) for t in s.turns
            ),
        )
        for s in scale_tokens(raw, args.token_scale)
    ]
    return [s for s in capped if len(s.turns) >= args.min_turns][:count]


def tool_time_scale(args: argparse.Namespace) -> float:
    scale: float | None = args.tool_time_scale
    return args.time_scale if scale is None else scale


def cpu_profile_path(args: argparse.Namespace) -> Path | None:
    if args.cpu_profile is not None:
        return None if args.cpu_profile.lower() == "none" else Path(args.cpu_profile)
    default = PROFILES_DIR / f"cpu_{args.model_size}.json"
    return default if default.is_file() else None


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    profile = cpu_profile_path(args)
    cost = cpu_profile(profile).cost_model() if profile is not None else None
    link = None
    if getattr(args, "pool_link", None) is not None:
        try:
            link = link_spec(args.pool_link, args.model_size, args.pool_link_delay_ms)
        except ValueError as exc:
            raise SystemExit(f"--pool-link: {exc}") from exc
        if cost is not None:
            # The profile measured a pool on this machine; behind the link a page comes no faster than the link.
            link_bytes_per_s = link.rate_mbit * 1e6 / 8
            cost = dataclasses.replace(
                cost, pool_to_device_bytes_per_s=min(cost.pool_to_device_bytes_per_s, link_bytes_per_s)
            )
    return ClusterConfig(
        state_dir=args.state_dir.resolve(),
        model_size=args.model_size,
        workers=args.workers,
        max_total_tokens=args.max_total_tokens,
        cost=cost,
        pool_link=link,
    )


def work_dir(args: argparse.Namespace, out: Path) -> Path:
    """Logs, pool directories and gateway databases: under the state dir, not next to the report."""
    state_dir: Path = args.state_dir
    return state_dir.resolve() / "runs" / out.name


def hint_model(args: argparse.Namespace) -> HintModel:
    return HintModel(lead_s=args.hint_lead_s, false_rate=args.false_hints, missed_rate=args.missed_hints)


async def model_name(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    data = response.json().get("data") if response.status_code == 200 else None
    return str(data[0]["id"]) if data else "default"


def synthetic_text(args: argparse.Namespace) -> SyntheticText:
    tokenizer = model_dir(args.state_dir, args.model_size) / "tokenizer.json"
    return SyntheticText.for_tokenizer(tokenizer) if tokenizer.is_file() else SyntheticText()


def tool_calls_on(args: argparse.Namespace) -> bool:
    """The agent workloads' turns end in real tool calls unless `--no-tool-calls`."""
    return args.workload in ("agent", "agent-long") and not args.no_tool_calls


def advisory_counts(stats: dict[str, Any] | None) -> dict[str, int]:
    """The advisory outcomes of the gateway's stats, summed over signal kinds, and the tool-call KV lifecycle's
    events ("toolkv keep", "toolkv offload", "toolkv keep_then_offload", "toolkv early", "toolkv early_skipped",
    "toolkv retain_lapsed", "toolkv retain_fallback")."""
    if stats is None:
        return {}
    counts = {"used": 0, "late": 0, "wasted": 0, "missed": int(stats.get("missed") or 0)}
    for kind in (stats.get("kinds") or {}).values():
        for outcome in ("used", "late", "wasted"):
            counts[outcome] += int((kind.get("outcomes") or {}).get(outcome) or 0)
    for event, count in (stats.get("tool_kv") or {}).items():
        counts[f"toolkv {event}"] = int(count)
    return counts


def prefetch_bytes_moved(stats: dict[str, Any] | None) -> dict[str, int]:
    """KV bytes the gateway's prefetches loaded (the workers' reports) and those its wasted advisories loaded."""
    if stats is None:
        return {}
    wasted = sum(int(kind.get("wasted_bytes") or 0) for kind in (stats.get("kinds") or {}).values())
    return {"prefetched": int(stats.get("prefetch_bytes") or 0), "prefetched, wasted": wasted}


def estimated_bytes(records: Sequence[TurnRecord], model_size: str) -> dict[str, int]:
    """KV bytes moved into the device, estimated as tokens found per tier times the model's KV bytes per token
    (the workers do not report bytes): a pool hit is read pool -> host -> device."""
    per_token = kv_bytes_per_token(model_size)
    ok = [r for r in records if r.error is None]
    pool = sum(r.cached_pool for r in ok)
    return {"pool->host": pool * per_token, "host->device": (sum(r.cached_host for r in ok) + pool) * per_token}


def in_window(result: ReplayResult, sessions: Sequence[SessionTrace], args: argparse.Namespace) -> list[TurnRecord]:
    """The turns sent within the measurement window, while the load was at its target (the driver sends none after
    it; a turn in flight at the end finishes, in the records file). Warns when the slots ran out of sessions
    before the end: the load then fell inside the window."""
    if result.sessions_started >= len(sessions) and result.wall_s < args.duration_s:
        print(
            f"warning: {result.records[0].system if result.records else 'run'}: every drawn session ended before "
            f"{args.duration_s:g} s; the load fell inside the window (raise --sessions-per-slot)",
            flush=True,
        )
    return [r for r in result.records if r.sent_s < args.duration_s]


def save(out: Path, title: str, summaries: list[RunSummary], notes: list[str], args: argparse.Namespace) -> None:
    (out / "summaries.json").write_text(json.dumps([dataclasses.asdict(s) for s in summaries], indent=1))
    write_report(out, title, summaries, notes=notes, slo_p99_ttft_s=args.slo_p99_ttft_s)


def _model_words(model_size: str) -> str:
    return "SmolLM2-135M-Instruct" if MODELS[model_size].real else f"{model_size} random-weight Llama"


def run_notes(args: argparse.Namespace) -> list[str]:
    profile = cpu_profile_path(args)
    return [
        f"Real SGLang CPU workers ({args.workers} x {_model_words(args.model_size)}, float32, device KV pool "
        f"{args.max_total_tokens} tokens each); {os.cpu_count()} CPU cores shared by the workers, the front and this "
        f"client; 1-minute load average {args.load_at_start:.1f} when the run started (other work on the machine "
        "makes every timing noisy).",
        f"Workload: {args.workload} (sessions of {args.min_turns}+ turns"
        + (f", a {args.system_tokens}-token system prompt before scaling" if args.workload == "sharegpt" else "")
        + (
            f", contexts stretched towards [{args.min_context_tokens}, {args.max_context_tokens}] tokens, recorded "
            f"tool times x{args.tool_scale:g}"
            if args.workload == "agent-long"
            else ""
        )
        + f"), token counts x{args.token_scale}, answers capped at {args.max_output_tokens} tokens, context cut at "
        f"{args.max_context_tokens} tokens, think and arrival times x{args.time_scale}, tool times "
        f"x{tool_time_scale(args):g}; closed loop, {args.sessions_per_slot} "
        f"sessions per unit of load; the turns sent in the first {args.duration_s:g} s are counted, and no turn is "
        "sent after it.",
        *(
            [
                "Tool calls: every request carries one tool (`run_tool`, an integer-enum argument); a turn the trace "
                "follows with a tool names it in `tool_choice` and the worker answers with a real tool call "
                "(constrained decoding; such a turn is sent without ignore_eos, with up to "
                f"{TOOL_CALL_MAX_TOKENS} answer tokens); the next turn carries the call and a tool message of the "
                "trace's length. The same bodies go to every system; only kv_aware+toolkv also posts each result "
                "to /v1/sessions/{id}/tool_results when the tool returns, just before that turn."
            ]
            if tool_calls_on(args)
            else []
        ),
        f"Hints (kv_aware+advisories only): lead {args.hint_lead_s:g} s (before time scaling), false "
        f"{args.false_hints:.0%}, missed {args.missed_hints:.0%}.",
        f"Workers ({cores_per_worker(args.workers)} CPU thread(s) each) restarted and warmed up for every system, then "
        "flushed (cold device, host and pool); loads run in increasing order on the same workers, each with its own "
        "sessions.",
        *(
            [
                f"The shared pool: a Mooncake Store (master and storage node) in a network namespace behind an "
                f"emulated link of {link_spec(args.pool_link, args.model_size).rate_mbit:g} Mbit/s and "
                f"{args.pool_link_delay_ms:g} ms each way (scripts/pool-link.sh), the workers lending it no memory: "
                "every pool read crosses the link (docs/benchmarks.md, an emulated pool link)."
            ]
            if getattr(args, "pool_link", None) is not None
            else []
        ),
        "Bytes moved are estimates (tokens found in host or pool x KV bytes per token), not measurements.",
        f"kv_aware's cost model: {f'from {profile.name}, as the simulator' if profile else 'the gateway defaults'}.",
        f"Command: sessiongate bench replay {' '.join(args.argv)}",
    ]

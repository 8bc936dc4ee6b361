"""The simulator's experiments: load sweeps of every system, hint-quality sweeps, and validation against a replay.

- `load_sweep`: for each load (concurrent users for ShareGPT and agent sessions, a multiple of the recorded
  request rate for Mooncake) and each system, one simulated run summarised as a `RunSummary`; the summaries go to
  `benchmarks.report.write_report`, with each system's mean E2E over recompute's at the same load in `extra`.
- `hint_sweep`: `kv_aware+advisories` at one load while one hint parameter moves (lead 0-16 s, false hints
  0-60%, missed hints 0-20%), against `kv_aware` at the same load: a Markdown table and a PNG.
- `toolkv` (`EXPERIMENTS`, `toolkv_experiment.py`): issue 15's long-context agents with tool calls, the advisor's
  tool-call KV lifecycle against cache_aware, Dynamo's cost, recompute and sticky, with its targets stated.
- `validate`: sessions rebuilt from a real replay's TurnRecords (token counts and send times), simulated with
  the CPU calibration, and the TTFT error per system: statistics of the simulated against the measured TTFTs,
  and the per-turn error.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessiongate.benchmarks.metrics import RunSummary, TurnRecord, percentile, summarize, write_records
from sessiongate.benchmarks.workloads import (
    HintModel,
    SessionTrace,
    Turn,
    agent_sessions,
    mooncake_sessions,
    scale_tokens,
    sharegpt_sessions,
)

from .agent_long import long_agent_sessions
from .calibration import Calibration
from .cluster import SYSTEMS, SimResult, simulate
from .toolkv_experiment import toolkv_experiment

__all__ = [
    "EXPERIMENTS",
    "SWEEPS",
    "Workload",
    "closed_loop_sessions",
    "hint_sweep",
    "load_sweep",
    "run_one",
    "sessions_from_records",
    "validate",
    "validation_markdown",
    "workload",
]

SWEEPS: dict[str, tuple[str, tuple[float, ...]]] = {
    "lead": ("lead_s", (0.0, 1.0, 2.0, 4.0, 8.0, 11.3, 16.0)),
    "false": ("false_rate", (0.0, 0.2, 0.4, 0.6)),
    "missed": ("missed_rate", (0.0, 0.05, 0.1, 0.2)),
}
# Named experiments (`python -m sessiongate.benchmarks.sim --experiment NAME`).
EXPERIMENTS = {"toolkv": toolkv_experiment}
# A replay names SGLang's router by its program; the simulator runs the same policy under the policy's name.
REPLAY_SYSTEM_NAMES = {"sglang-router": "cache_aware"}


@dataclass(frozen=True, slots=True)
class Workload:
    sessions: list[SessionTrace]
    follow_ups: dict[str, tuple[str, float]]
    load: float
    load_unit: str


def workload(
    trace: str,
    load: float,
    *,
    seed: int,
    sessions_per_user: int = 8,
    think_time_s: float = 20.0,
    duration_s: float | None = None,
    token_scale: float = 1.0,
    max_context_tokens: int | None = None,
    tool_scale: float = 1.0,
    min_context_tokens: int = 32_768,
    rounds: int | None = None,
) -> Workload:
    """Mooncake: the trace at `load` times its recorded rate. ShareGPT / agent / agent-long: `load` closed-loop
    users, each running `sessions_per_user` sessions one after another (an exponential think time between them).
    agent-long: the SWE-agent rounds stretched to contexts in [`min_context_tokens`, `max_context_tokens`] (default
    128k), tool times x `tool_scale`, `rounds` rounds a session when given (`agent_long.long_agent_sessions`)."""
    if trace == "mooncake":
        recorded = mooncake_sessions(
            duration_s=duration_s, time_scale=1.0 / load, max_context_tokens=max_context_tokens
        )
        return Workload(_scaled(recorded, token_scale), {}, load, "x trace rate")
    users = max(int(load), 1)
    count = users * sessions_per_user
    if trace == "sharegpt":
        pool = sharegpt_sessions(
            count=count, seed=seed, think_time_s=think_time_s, max_context_tokens=max_context_tokens
        )
    elif trace == "agent":
        pool = agent_sessions(count=count, seed=seed, max_context_tokens=max_context_tokens)
    elif trace == "agent-long":
        pool = long_agent_sessions(
            count=count,
            seed=seed,
            min_context=min_context_tokens,
            max_context=max_context_tokens or 131_072,
            tool_scale=tool_scale,
            rounds=rounds,
        )
    else:
        raise ValueError(f"unknown trace {trace!r}")
    rng = random.Random(seed)
    sessions: list[SessionTrace] = []
    follow_ups: dict[str, tuple[str, float]] = {}
    for user in range(users):
        mine = pool[user::users]
        first = dataclasses.replace(mine[0], start_s=rng.uniform(0.0, think_time_s))
        sessions.append(first)
        sessions.extend(mine[1:])
        for before, after in itertools.pairwise(mine):
            follow_ups[before.id] = (after.id, rng.expovariate(1.0 / think_time_s))
    return Workload(_scaled(sessions, token_scale), follow_ups, load, "users")


def _scaled(sessions: list[SessionTrace], factor: float) -> list[SessionTrace]:
    return sessions if factor == 1.0 else scale_tokens(sessions, factor)


def _progress(label: str, horizon_s: float) -> tuple[Callable[[float], None], Callable[[], None]]:
    from tqdm import tqdm  # type: ignore[import-untyped]

    bar = tqdm(total=round(horizon_s), desc=label, unit="sim s", leave=False, disable=None)

    def update(now: float) -> None:
        bar.update(max(round(now) - bar.n, 0))

    return update, bar.close


def run_one(
    system: str,
    work: Workload,
    cal: Calibration,
    *,
    workers: int,
    hints: HintModel,
    seed: int,
    progress: bool = True,
) -> tuple[SimResult, RunSummary, float]:
    """One simulated run and its summary; the third value is the wall time it took."""
    horizon = max((s.start_s for s in work.sessions), default=0.0) + 60.0
    update, close = _progress(f"{system} {work.load:g} {work.load_unit}", horizon) if progress else (None, None)
    began = time.perf_counter()
    try:
        result = simulate(
            system,
            work.sessions,
            cal,
            workers=workers,
            hints=hints,
            seed=seed,
            follow_ups=work.follow_ups,
            progress=update,
        )
    finally:
        if close is not None:
            close()
    wall = time.perf_counter() - began
    summary = summarize(
        system,
        work.load,
        work.load_unit,
        result.records,
        bytes_moved=result.bytes_moved,
        advisories=result.advisories,
        label=cal.label,
    )
    return result, summary, wall


def load_sweep(
    trace: str,
    loads: Sequence[float],
    systems: Sequence[str],
    cal: Calibration,
    *,
    workers: int,
    hints: HintModel,
    seed: int,
    out_dir: Path | None,
    log: Callable[[str], None] = print,
    **workload_options: Any,
) -> list[RunSummary]:
    summaries: list[RunSummary] = []
    for load in loads:
        work = workload(trace, load, seed=seed, **workload_options)
        baseline_e2e: float | None = None
        for system in systems:
            result, summary, wall = run_one(system, work, cal, workers=workers, hints=hints, seed=seed)
            if system == "recompute":
                baseline_e2e = summary.e2e.mean
            if baseline_e2e:
                summary.extra["e2e_vs_recompute"] = summary.e2e.mean / baseline_e2e
            summary.extra["sim_wall_s"] = wall
            summaries.append(summary)
            log(
                f"{cal.label} {trace} {workers} workers, {system} at {load:g} {work.load_unit}: "
                f"{summary.requests} requests, TTFT mean {summary.ttft.mean * 1e3:.0f} ms p99 "
                f"{summary.ttft.p99 * 1e3:.0f} ms, E2E mean {summary.e2e.mean:.2f} s; {result.events} events, "
                f"wall {wall:.1f} s"
            )
            if out_dir is not None:
                name = f"records-{system.replace('+', '-')}-{trace}-{workers}w-{load:g}.jsonl"
                write_records(out_dir / "records" / name, result.records)
    return summaries


def hint_sweep(
    parameter: str,
    trace: str,
    load: float,
    cal: Calibration,
    *,
    workers: int,
    base: HintModel,
    seed: int,
    out_dir: Path,
    log: Callable[[str], None] = print,
    **workload_options: Any,
) -> Path:
    """Markdown table and PNG of kv_aware+advisories while one hint parameter moves; returns the table's path."""
    field, values = SWEEPS[parameter]
    work = workload(trace, load, seed=seed, **workload_options)
    _, reference, _ = run_one("kv_aware", work, cal, workers=workers, hints=base, seed=seed)
    _, recompute, _ = run_one("recompute", work, cal, workers=workers, hints=base, seed=seed)
    rows: list[tuple[float, RunSummary]] = []
    for value in values:
        model = dataclasses.replace(base, **{field: value})
        _, summary, wall = run_one("kv_aware+advisories", work, cal, workers=workers, hints=model, seed=seed)
        rows.append((value, summary))
        log(f"sweep {parameter}={value:g}: TTFT mean {summary.ttft.mean * 1e3:.1f} ms, wall {wall:.1f} s")
    lines = [
        f"## {cal.label}: hint {parameter} sweep ({trace}, {workers} workers, {load:g} {work.load_unit})",
        "",
        f"kv_aware+advisories with `{field}` varied, the rest of the hint model {base}. Reference rows: kv_aware "
        "(no hints) and recompute at the same load.",
        "",
        f"| {field} | TTFT mean ms | TTFT p99 ms | E2E mean s | E2E vs recompute | recomputed | used | late "
        "| wasted | missed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, summary in [("kv_aware", reference), ("recompute", recompute)] + [(f"{v:g}", s) for v, s in rows]:
        adv = summary.advisories
        lines.append(
            f"| {label} | {summary.ttft.mean * 1e3:.1f} | {summary.ttft.p99 * 1e3:.0f} | {summary.e2e.mean:.2f} "
            f"| {summary.e2e.mean / recompute.e2e.mean:.2f} | {summary.recomputed_share * 100:.0f}% "
            f"| {adv.get('used', '-')} | {adv.get('late', '-')} | {adv.get('wasted', '-')} | {adv.get('missed', '-')} |"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    table = out_dir / f"sweep_{parameter}.md"
    table.write_text("\n".join(lines) + "\n")
    _plot_sweep(out_dir / f"sweep_{parameter}.png", field, rows, reference, recompute, cal.label)
    return table


def _plot_sweep(
    path: Path,
    field: str,
    rows: Sequence[tuple[float, RunSummary]],
    reference: RunSummary,
    recompute: RunSummary,
    label: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    xs = [v for v, _ in rows]
    axis.plot(xs, [s.ttft.mean * 1e3 for _, s in rows], marker="o", label="kv_aware+advisories")
    axis.axhline(reference.ttft.mean * 1e3, color="gray", linestyle="--", label="kv_aware (no hints)")
    axis.axhline(recompute.ttft.mean * 1e3, color="red", linestyle=":", label="recompute")
    axis.set_xlabel(field)
    axis.set_ylabel("mean TTFT (ms)")
    axis.set_title(f"{label}: hint {field}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# --- validation ----------------------------------------------------------------------------------------------


def sessions_from_records(records: Iterable[TurnRecord]) -> list[SessionTrace]:
    """The sessions a replay sent, as open-loop traces: each turn at its real send time, its real token counts.

    A turn's append is its prompt minus the previous prompt and answer (the chat template's tokens land there; a
    prompt that does not extend the previous one exactly is modelled as a one-token append).
    """
    return [session for session, _ in _rebuilt(records, closed_loop=False)]


def closed_loop_sessions(records: Iterable[TurnRecord]) -> tuple[list[SessionTrace], dict[str, tuple[str, float]]]:
    """The sessions a closed-loop replay sent, as it sent them: each turn after its real think time (from the
    previous answer's end, not at its send time), and each session after the one its slot ran before it.

    Slots are not recorded; a session that started within 50 ms of another one's end is taken to follow it (the
    latest such), the others start at their real start time. Returns the sessions and `simulate`'s `follow_ups`.
    Simulated slower or faster than real, the next turns come later or sooner, as they would.
    """
    rebuilt = _rebuilt(records, closed_loop=True)
    ends = sorted((turns[-1].done_s or turns[-1].sent_s, session.id) for session, turns in rebuilt)
    follow_ups: dict[str, tuple[str, float]] = {}
    for session, _ in rebuilt:
        start = session.start_s
        candidates = [
            (end, sid) for end, sid in ends if abs(end - start) <= 0.05 and sid != session.id and sid not in follow_ups
        ]
        if candidates:
            end, previous_id = max(candidates)
            follow_ups[previous_id] = (session.id, max(start - end, 0.0))
    return [session for session, _ in rebuilt], follow_ups


def _rebuilt(records: Iterable[TurnRecord], *, closed_loop: bool) -> list[tuple[SessionTrace, list[TurnRecord]]]:
    """Each session of `records` (in start order) with its turns; a turn's gap is its think time after the
    previous answer (closed loop) or the time since the previous send, with its send time as `at_s` (open)."""
    by_session: dict[str, list[TurnRecord]] = {}
    for record in records:
        by_session.setdefault(record.session_id, []).append(record)
    rebuilt = []
    for session_id, turns in by_session.items():
        turns.sort(key=lambda r: r.turn)
        built: list[Turn] = []
        context = 0
        for k, record in enumerate(turns):
            append = record.prompt_tokens if k == 0 else max(record.prompt_tokens - context, 1)
            output = max(record.output_tokens, 1)
            previous = turns[k - 1] if k else None
            if previous is None:
                gap = 0.0
            elif closed_loop:
                gap = max(record.sent_s - (previous.done_s or previous.sent_s), 0.0)
            else:
                gap = record.sent_s - previous.sent_s
            kind = "first" if k == 0 else "user"
            built.append(Turn(append, output, gap, kind, None if closed_loop else record.sent_s))
            context += append + output
        rebuilt.append((SessionTrace(session_id, "replay", turns[0].sent_s, tuple(built)), turns))
    rebuilt.sort(key=lambda pair: (pair[0].start_s, pair[0].id))
    return rebuilt


def validate(
    records: Sequence[TurnRecord],
    cal: Calibration,
    *,
    hints: HintModel,
    seed: int,
    workers: int | None = None,
    loop: str = "open",
) -> list[dict[str, Any]]:
    """Per system in `records`: the measured and simulated TTFT statistics and the per-turn error.

    `loop="open"` sends every turn at its recorded time (`sessions_from_records`); near saturation a small error in
    the simulated capacity then grows queues without bound (or empties them). `loop="closed"` keeps the replay's
    closed loop (`closed_loop_sessions`): think times and session order, not send times."""
    by_system: dict[str, list[TurnRecord]] = {}
    for record in records:
        if record.error is None and record.first_token_s is not None:
            by_system.setdefault(record.system, []).append(record)
    rows = []
    for system, real in by_system.items():
        simulated_system = REPLAY_SYSTEM_NAMES.get(system, system)
        if simulated_system not in SYSTEMS:
            continue
        count = workers or len({r.worker for r in real if r.worker}) or 1
        if loop == "closed":
            sessions, follow_ups = closed_loop_sessions(real)
        else:
            sessions, follow_ups = sessions_from_records(real), {}
        result = simulate(simulated_system, sessions, cal, workers=count, hints=hints, seed=seed, follow_ups=follow_ups)
        simulated = {(r.session_id, r.turn): r.ttft_s for r in result.records if r.ttft_s is not None}
        pairs = [(r.ttft_s, simulated[(r.session_id, r.turn)]) for r in real if (r.session_id, r.turn) in simulated]
        measured = [m for m, _ in pairs if m is not None]
        predicted = [p for m, p in pairs if m is not None]
        errors = [abs(p - m) for m, p in pairs if m is not None]
        rows.append(
            {
                "system": system,
                "loop": loop,
                "workers": count,
                "turns": len(errors),
                "measured": _three(measured),
                "simulated": _three(predicted),
                "relative_error": {
                    k: (s - m) / m if m else math.nan
                    for (k, m), s in zip(_three(measured).items(), _three(predicted).values(), strict=True)
                },
                "abs_error_s": _three(errors),
                "signed_mean_error_s": sum(p - m for m, p in zip(measured, predicted, strict=True)) / len(errors)
                if errors
                else math.nan,
            }
        )
    return rows


def _three(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}


def validation_markdown(rows: Sequence[dict[str, Any]], cal: Calibration, source: Path) -> str:
    lines = [
        f"## TTFT prediction error: {cal.label} ({cal.source}) against the real replay in `{source}`, "
        f"{rows[0]['loop'] if rows else 'open'} loop",
        "",
        "| system | workers | turns | measured mean / p50 / p99 ms | simulated mean / p50 / p99 ms "
        "| error of mean / p50 / p99 | per-turn abs error mean / p50 / p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m, s, r, e = row["measured"], row["simulated"], row["relative_error"], row["abs_error_s"]
        lines.append(
            f"| {row['system']} | {row['workers']} | {row['turns']} "
            f"| {m['mean'] * 1e3:.0f} / {m['p50'] * 1e3:.0f} / {m['p99'] * 1e3:.0f} "
            f"| {s['mean'] * 1e3:.0f} / {s['p50'] * 1e3:.0f} / {s['p99'] * 1e3:.0f} "
            f"| {r['mean'] * 100:+.0f}% / {r['p50'] * 100:+.0f}% / {r['p99'] * 100:+.0f}% "
            f"| {e['mean'] * 1e3:.0f} / {e['p50'] * 1e3:.0f} / {e['p99'] * 1e3:.0f} |"
        )
    return "\n".join(lines) + "\n"

"""The benchmark report: a Markdown file with the main table, sessions served at an SLO and where each system loses,
plus two PNG figures (latency against load, where prompt tokens came from). Used by the replay and the simulator."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sessiongate.benchmarks.metrics import TOKEN_SOURCES, RunSummary, served_at_slo

__all__ = ["write_report"]

LATENCY_FIGURE = "latency_vs_load.png"
TOKENS_FIGURE = "token_sources.png"


def write_report(
    out_dir: Path,
    title: str,
    summaries: list[RunSummary],
    *,
    notes: Sequence[str] = (),
    slo_p99_ttft_s: float | None = None,
) -> Path:
    """Writes report.md and the figures into `out_dir`; returns the path of report.md."""
    if not summaries:
        raise ValueError("write_report needs at least one RunSummary")
    out_dir.mkdir(parents=True, exist_ok=True)
    ordered = sorted(summaries, key=lambda s: (_system_order(summaries, s.system), s.load))
    _plot_latency(out_dir / LATENCY_FIGURE, ordered)
    _plot_token_sources(out_dir / TOKENS_FIGURE, ordered)
    lines = [f"# {title}", ""]
    lines += [f"- {note}" for note in notes]
    if notes:
        lines.append("")
    lines += _main_table(ordered)
    if slo_p99_ttft_s is not None:
        lines += _slo_section(ordered, slo_p99_ttft_s)
    lines += _oracle_section(ordered)
    lines += _losses_section(ordered)
    lines += _extras_section(ordered)
    lines += ["## Figures", "", f"![latency against load]({LATENCY_FIGURE})", ""]
    lines += [f"![prompt token sources]({TOKENS_FIGURE})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _system_order(summaries: Sequence[RunSummary], system: str) -> int:
    """Systems keep the order they were run in (baselines first, by the caller's convention)."""
    return next(i for i, s in enumerate(summaries) if s.system == system)


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def _pct(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{share * 100:.0f}%"


def _load(s: RunSummary) -> str:
    return f"{s.load:g} {s.load_unit}"


def _main_table(ordered: Sequence[RunSummary]) -> list[str]:
    lines = [
        "## Main table",
        "",
        "Latencies in milliseconds over the turns that succeeded. Token sources: share of prompt tokens found on the "
        "device, in host memory, in the shared pool, or recomputed.",
        "",
        "| system | label | load | requests | errors | TTFT mean | TTFT p50 | TTFT p99 | TPOT mean | TPOT p99 "
        "| E2E mean | E2E p99 | device | host | pool | recomputed |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in ordered:
        total = sum(s.tokens_by_source.values())
        shares = [_pct(s.tokens_by_source.get(k, 0) / total if total else math.nan) for k in TOKEN_SOURCES]
        lines.append(
            f"| {s.system} | {s.label} | {_load(s)} | {s.requests} | {s.errors} | {_ms(s.ttft.mean)} | "
            f"{_ms(s.ttft.p50)} | {_ms(s.ttft.p99)} | {_ms(s.tpot.mean)} | {_ms(s.tpot.p99)} | {_ms(s.e2e.mean)} | "
            f"{_ms(s.e2e.p99)} | " + " | ".join(shares) + " |"
        )
    return [*lines, ""]


def _slo_section(ordered: Sequence[RunSummary], bound_s: float) -> list[str]:
    served = served_at_slo(ordered, p99_ttft_s=bound_s)
    units = {s.system: s.load_unit for s in ordered}
    lines = [
        f"## Served at the SLO (p99 TTFT <= {bound_s * 1000:.0f} ms)",
        "",
        "The most load at which p99 TTFT stayed under the bound with no errors, sweeping load upward; "
        "0 means the lightest load tried already missed it.",
        "",
        "| system | served | loads tried |",
        "|---|---:|---|",
    ]
    for system, load in served.items():
        loads = ", ".join(f"{x:g}" for x in sorted({s.load for s in ordered if s.system == system}))
        lines.append(f"| {system} | {load:g} {units[system]} | {loads} |")
    return [*lines, ""]


# The routers whose runs come with hints: each hinted system "<router>+<hints>" is set against the same router
# without hints and with the oracle's, so the ceiling is measured on top of the strongest baseline's router as well
# as ours.
ROUTERS_WITH_HINTS = ("kv_aware", "dynamo_cost")
HINTS = ("+advisories", "+advisories-timed", "+advisories-exact", "+toolkv", "+oracle")
ORACLE_SUFFIX = "+oracle"
_ORACLE_METRICS: tuple[Callable[[RunSummary], float], ...] = (
    lambda r: r.ttft.mean,
    lambda r: r.ttft.p99,
    lambda r: r.later_ttft.mean,
    lambda r: r.later_ttft.p99,
)


def _oracle_section(ordered: Sequence[RunSummary]) -> list[str]:
    """At each load, for each router run both without hints and with the oracle's: each of its hinted systems' TTFT
    gain over the router alone (its TTFT over the router's), over all turns and over the turns after a session's
    first (those a hint can foresee), and its share of the oracle's gain ((router - it) / (router - oracle))."""
    by_load: dict[float, dict[str, RunSummary]] = {}
    for s in ordered:
        by_load.setdefault(s.load, {})[s.system] = s
    rows: list[str] = []
    for router in ROUTERS_WITH_HINTS:
        for runs in by_load.values():
            base, oracle = runs.get(router), runs.get(router + ORACLE_SUFFIX)
            if base is None or oracle is None:
                continue
            for system in (router + hints for hints in HINTS if router + hints in runs):
                run = runs[system]
                cells = []
                for metric in _ORACLE_METRICS:
                    mine, theirs, best = metric(run), metric(base), metric(oracle)
                    gain = theirs / mine if mine > 0 else math.nan
                    share = (theirs - mine) / (theirs - best) if theirs > best else math.nan
                    cells.append(f"{gain:.2f}x" + ("" if run is oracle else f" ({_pct(share)})"))
                rows.append(f"| {system} | {_load(run)} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "## Hints against the oracle",
        "",
        "TTFT of the same router without hints over each hinted system's (higher is better; `kv_aware+...` against "
        "kv_aware, `dynamo_cost+...` against dynamo_cost), in brackets the share of that router's oracle's gain it "
        "reaches. Later turns: those after a session's first, the turns a hint can foresee.",
        "",
        "| system | load | mean TTFT | p99 TTFT | later turns' mean TTFT | later turns' p99 TTFT |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


def _losses_section(ordered: Sequence[RunSummary]) -> list[str]:
    """For each system, the loads and metrics where another system did better, with the margin."""
    lines = ["## Where each system loses", ""]
    by_load: dict[tuple[float, str], list[RunSummary]] = {}
    for s in ordered:
        by_load.setdefault((s.load, s.load_unit), []).append(s)
    systems = list(dict.fromkeys(s.system for s in ordered))
    metrics: dict[str, Callable[[RunSummary], float]] = {
        "mean TTFT": lambda r: r.ttft.mean,
        "p99 TTFT": lambda r: r.ttft.p99,
        "mean E2E": lambda r: r.e2e.mean,
        "mean TPOT": lambda r: r.tpot.mean,
        "recomputed share": lambda r: r.recomputed_share,
    }
    for system in systems:
        losses: list[str] = []
        compared = 0
        for (load, unit), runs in by_load.items():
            mine = next((r for r in runs if r.system == system), None)
            if mine is None or len(runs) < 2:
                continue
            compared += 1
            if mine.errors:
                losses.append(f"{load:g} {unit}: {mine.errors} of {mine.requests} requests failed")
            for name, metric in metrics.items():
                rivals = [(metric(r), r.system) for r in runs if r.system != system and not math.isnan(metric(r))]
                value = metric(mine)
                if not rivals or math.isnan(value):
                    continue
                best, winner = min(rivals)
                if value > best:
                    margin = f"{value / best:.2f}x" if best > 0 else f"{value:.3g} vs 0"
                    shown = _pct(value) if name == "recomputed share" else f"{_ms(value)} ms"
                    best_shown = _pct(best) if name == "recomputed share" else f"{_ms(best)} ms"
                    losses.append(f"{load:g} {unit}: {name} {shown} vs {best_shown} for {winner} ({margin})")
        if not compared:
            verdict = ": no other system ran at the same load."
        else:
            verdict = ":" if losses else ": best or tied on every metric at every load compared."
        lines.append(f"**{system}**{verdict}")
        lines += [f"- {loss}" for loss in losses]
        lines.append("")
    return lines


def _extras_section(ordered: Sequence[RunSummary]) -> list[str]:
    rows = [s for s in ordered if s.bytes_moved or s.advisories or s.extra]
    if not rows:
        return []
    lines = ["## Bytes moved and advisory outcomes", "", "| system | load | bytes moved | advisories | other |"]
    lines.append("|---|---|---|---|---|")
    for s in rows:
        moved = ", ".join(f"{k}: {_bytes(v)}" for k, v in sorted(s.bytes_moved.items())) or "-"
        adv = ", ".join(f"{k}: {v}" for k, v in sorted(s.advisories.items())) or "-"
        extra = ", ".join(f"{k}: {v:g}" for k, v in sorted(s.extra.items())) or "-"
        lines.append(f"| {s.system} | {_load(s)} | {moved} | {adv} | {extra} |")
    return [*lines, ""]


def _bytes(n: int) -> str:
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: the report is written by headless runs
    import matplotlib.pyplot as plt

    return plt


def _plot_latency(path: Path, ordered: Sequence[RunSummary]) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    systems = list(dict.fromkeys(s.system for s in ordered))
    colors = plt.get_cmap("tab10")
    for i, system in enumerate(systems):
        runs = [s for s in ordered if s.system == system]
        loads = [s.load for s in runs]
        for ax, metric in zip(axes, ("ttft", "e2e"), strict=True):
            p99 = [getattr(s, metric).p99 * 1000 for s in runs]
            mean = [getattr(s, metric).mean * 1000 for s in runs]
            ax.plot(loads, p99, marker="o", color=colors(i), label=f"{system} p99")
            ax.plot(loads, mean, marker="x", linestyle="--", color=colors(i), label=f"{system} mean")
    unit = ordered[0].load_unit
    for ax, name in zip(axes, ("TTFT", "end-to-end latency"), strict=True):
        ax.set_xlabel(f"load ({unit})")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} against load")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_token_sources(path: Path, ordered: Sequence[RunSummary]) -> None:
    plt = _pyplot()
    labels = [f"{s.system}\n{_load(s)}" for s in ordered]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(ordered) + 2), 4.5))
    bottoms = [0.0] * len(ordered)
    colors = {"device": "#2b8a3e", "host": "#74b816", "pool": "#1c7ed6", "recomputed": "#e03131"}
    for source in TOKEN_SOURCES:
        shares = []
        for s in ordered:
            total = sum(s.tokens_by_source.values())
            shares.append(100.0 * s.tokens_by_source.get(source, 0) / total if total else 0.0)
        ax.bar(range(len(ordered)), shares, bottom=bottoms, color=colors[source], label=source)
        bottoms = [b + v for b, v in zip(bottoms, shares, strict=True)]
    ax.set_xticks(range(len(ordered)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("share of prompt tokens (%)")
    ax.set_title("Where prompt tokens came from")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""The soak's report: which faults the replicas' /metrics showed, memory growth after the warm-up, the spot checks'
summary, and the report's Markdown and plot (`benchmarks.soak` runs the soak and calls these on its samples).

A sample is `{"t": seconds, "answered": n, "pss_mb": {node: MB}, "shmem_mb": {node: MB}, "metrics": {replica:
{series: value} or None}}`, as `report.json` keeps them.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from .netns_cluster import NODES, NetnsCluster

__all__ = ["fault_visible", "markdown", "memory_growth", "plot", "pool_seconds_per_call", "spot_summary"]


def _worker_down(sample: dict[str, Any], worker_id: str) -> bool:
    return any(
        m is not None and m.get(f'sessiongate_worker_healthy{{worker="{worker_id}"}}') == 0
        for m in sample["metrics"].values()
    )


def fault_visible(fault: dict[str, Any], samples: list[dict[str, Any]], cluster: NetnsCluster) -> bool:
    """Whether a sample during the fault (or within 5 s after) shows it on a replica's /metrics."""
    window = [s for s in samples if fault["start"] <= s["t"] <= fault["end"] + 5]
    before = [s for s in samples if s["t"] < fault["start"]]
    name = fault["name"]
    if "wk1" in name or "wk2" in name:
        worker_id = cluster.worker_id("wk1" if "wk1" in name else "wk2")
        return any(_worker_down(s, worker_id) for s in window)
    if "Redis" in name:
        return any(
            m is not None and m.get("sessiongate_shared_state_available") == 0
            for s in window
            for m in s["metrics"].values()
        )
    if "PostgreSQL" in name:

        def refused(s: dict[str, Any]) -> float:
            return float(
                sum(
                    v
                    for m in s["metrics"].values()
                    if m is not None
                    for k, v in m.items()
                    if (k.startswith("sessiongate_http_requests_total") and 'status="503"' in k)
                    or k == "sessiongate_store_unavailable_total"
                )
            )

        stuck = any(
            m is not None and m.get("sessiongate_store_oldest_call_seconds", 0) >= 1
            for s in window
            for m in s["metrics"].values()
        )
        return stuck or (bool(window) and bool(before) and max(refused(s) for s in window) > refused(before[-1]))
    if "pool link" in name:
        # The mean time per pool call over the fault against the 30 s before it, from the workers' cumulative
        # counters: single slow calls (a big write on a busy machine) move a recent mean, not this.
        during = pool_seconds_per_call(before[-1:] + window)
        usual = pool_seconds_per_call([s for s in before if s["t"] >= fault["start"] - 30])
        return any(seconds >= max(0.05, 3 * usual.get(series, 0.0)) for series, seconds in during.items())
    if "gateway" in name:

        def served(s: dict[str, Any]) -> float | None:
            m = s["metrics"].get("gw2")
            if m is None:
                return None
            return float(sum(v for k, v in m.items() if k.startswith("sessiongate_http_requests_total")))

        seen = [served(s) for s in [*before[-1:], *window]]
        return None in seen or any(b is not None and a is not None and b < a for a, b in itertools.pairwise(seen))
    return False


def pool_seconds_per_call(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Per worker and kind of call (read, write, lookup): the seconds per pool call made between the first and the
    last of `samples`, from the workers' cumulative counters as a replica's /metrics shows them."""

    def counters(sample: dict[str, Any]) -> dict[str, float]:
        scraped: dict[str, float] = next((m for m in sample["metrics"].values() if m), {})
        return {k: v for k, v in scraped.items() if k.startswith("sessiongate_worker_pool_")}

    if len(samples) < 2:
        return {}
    first, last = counters(samples[0]), counters(samples[-1])
    out = {}
    for key, calls in last.items():
        if not key.startswith("sessiongate_worker_pool_calls_total{"):
            continue
        seconds_key = key.replace("_calls_total{", "_call_seconds_total{", 1)
        made = calls - first.get(key, 0.0)
        if made > 0 and seconds_key in last:
            series = key.split("{", 1)[1]
            out[series] = (last[seconds_key] - first.get(seconds_key, 0.0)) / made
    return out


def spot_summary(checks: list[dict[str, Any]]) -> dict[str, Any]:
    compared = [c for c in checks if c.get("equal") is not None]
    tiers: dict[str, int] = {}
    for check in compared:
        for tier, tokens in (check.get("cached_tokens_details") or {}).items():
            if isinstance(tokens, int) and tokens > 0:
                tiers[tier] = tiers.get(tier, 0) + 1
    return {
        "turns": len(checks),
        "compared": len(compared),
        "wrong": sum(1 for c in compared if not c["equal"]),
        "unanswered": sum(1 for c in checks if not c["answered"]),
        "turns_with_cached_tokens_from": tiers,
    }


def _own_mb(sample: dict[str, Any], role: str) -> float:
    """A node's memory less its shared memory: what its processes allocated for themselves."""
    return float(sample["pss_mb"][role] - sample.get("shmem_mb", {}).get(role, 0.0))


def memory_growth(
    samples: list[dict[str, Any]], *, warmup_share: float, flat_tolerance: float
) -> dict[str, dict[str, Any]]:
    """Per node: PSS first, after the warm-up and last (MB), its shared memory at the end, and the growth of its
    own memory (PSS less shared memory) after the warm-up, that growth's least-squares slope (MB per minute) and
    whether it is flat (grew by at most `flat_tolerance` of its warm value)."""
    if not samples:
        return {}
    end = samples[-1]["t"]
    after = [s for s in samples if s["t"] >= warmup_share * end] or samples[-1:]
    out = {}
    for role in NODES:
        warm, last = _own_mb(after[0], role), _own_mb(samples[-1], role)
        times = [s["t"] / 60 for s in after]
        values = [_own_mb(s, role) for s in after]
        mean_t, mean_v = sum(times) / len(times), sum(values) / len(values)
        spread = sum((t - mean_t) ** 2 for t in times)
        slope = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread if spread else 0.0
        out[role] = {
            "first_mb": samples[0]["pss_mb"][role],
            "warm_mb": after[0]["pss_mb"][role],
            "last_mb": samples[-1]["pss_mb"][role],
            "shmem_last_mb": samples[-1].get("shmem_mb", {}).get(role, 0.0),
            "own_warm_mb": round(warm, 1),
            "growth_after_warmup_mb": round(last - warm, 1),
            "slope_mb_per_min": round(slope, 2),
            "flat": last - warm <= flat_tolerance * warm,
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    config = report["config"]
    spot = report["spot_checks"]
    lines = [
        f"# Soak: {config['minutes']:g} min, a fault every {config['fault_every_s']:g} s (held {config['hold_s']:g} s),"
        f" {config['sessions']} clients",
        "",
        f"- cluster started in {report['cluster_started_in_s']} s",
        f"- answered turns: {report['answered_turns']}; given up after 120 s of retries: {report['given_up_turns']}",
        f"- store rows by status: {report['store_rows_by_status']}",
        f"- **lost accepted turns: {report['lost_accepted_turns']}**; doubled: {report['doubled_turns']}",
        f"- model: {config['model_size']}; spot checks (answers against a recompute, greedy,"
        f" {spot['max_tokens']} tokens): {spot['compared']} turns compared, **{spot['wrong']} wrong**,"
        f" {spot['unanswered']} unanswered; turns whose prompt was partly served from a cache, by tier:"
        f" {spot['turns_with_cached_tokens_from']}",
        "",
        "| fault | start (s) | end (s) | shown on /metrics by | visible |",
        "|---|---|---|---|---|",
    ]
    for fault, (key, seen) in zip(report["faults"], report["faults_visible_in_metrics"].items(), strict=True):
        del key
        lines.append(f"| {fault['name']} | {fault['start']:.0f} | {fault['end']:.0f} | {fault['metric']} | {seen} |")
    share = f"{config['warmup_share']:.0%}"
    tolerance = f"{config['flat_tolerance']:.0%}"
    lines += [
        "",
        f"Memory: PSS of each node's processes (MB), first, at warm = the first sample after {share} of the run, and"
        " last; shared memory at the end (PostgreSQL's shared buffers); own = PSS less shared memory; flat = own"
        f" memory grew by at most {tolerance} of its warm value after the warm-up.",
        "",
        "| node | PSS first | PSS warm | PSS last | shared last | own growth after warm-up | own slope MB/min | flat |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for role, m in report["memory"].items():
        lines.append(
            f"| {role} | {m['first_mb']} | {m['warm_mb']} | {m['last_mb']} | {m['shmem_last_mb']} |"
            f" {m['growth_after_warmup_mb']:+} | {m['slope_mb_per_min']:+} | {m['flat']} |"
        )
    return "\n".join(lines) + "\n"


def plot(samples: list[dict[str, Any]], faults: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not samples:
        return
    times = [s["t"] for s in samples]
    figure, (memory, turns) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for role in NODES:
        memory.plot(times, [s["pss_mb"][role] for s in samples], label=role)
    memory.set_ylabel("PSS of the node's processes (MB)")
    memory.set_yscale("log")
    memory.legend(ncol=4, fontsize=8)
    turns.plot(times, [s["answered"] for s in samples], color="black")
    turns.set_ylabel("answered turns (cumulative)")
    turns.set_xlabel("seconds")
    for fault in faults:
        for axis in (memory, turns):
            axis.axvspan(fault["start"], fault["end"], color="red", alpha=0.12)
        turns.text(fault["start"], 0, fault["name"], rotation=90, fontsize=7, va="bottom")
    figure.suptitle("sessiongate soak on a network-namespace cluster (red: a fault held)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

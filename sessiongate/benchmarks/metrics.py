"""What one benchmark run measured: a record per turn, a summary per (system, load), and sessions served at an SLO.

Shared by the trace replay (real engines) and the simulator, so both write the same JSON lines
(`dataclasses.asdict(TurnRecord)`) and a simulated run can be checked against a measured one.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

__all__ = [
    "TOKEN_SOURCES",
    "RunSummary",
    "Stats",
    "TurnRecord",
    "percentile",
    "read_records",
    "served_at_slo",
    "stats",
    "summarize",
    "summary_from_dict",
    "write_records",
]

# Where a prompt token came from, best first: the order of the stacked bars in the report.
TOKEN_SOURCES = ("device", "host", "pool", "recomputed")


@dataclass(frozen=True, slots=True)
class TurnRecord:
    system: str
    session_id: str
    turn: int
    sent_s: float  # run-clock seconds
    first_token_s: float | None
    done_s: float | None
    prompt_tokens: int
    output_tokens: int
    cached_device: int  # prompt tokens found per tier; the rest were recomputed
    cached_host: int
    cached_pool: int
    worker: str | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.done_s is None else self.done_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None when there is no second token to time."""
        if self.first_token_s is None or self.done_s is None or self.output_tokens < 2:
            return None
        return (self.done_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def recomputed_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_device - self.cached_host - self.cached_pool)


@dataclass(frozen=True, slots=True)
class Stats:
    mean: float
    p50: float
    p99: float
    count: int = 0

    @classmethod
    def empty(cls) -> Stats:
        return cls(math.nan, math.nan, math.nan, 0)


@dataclass(frozen=True, slots=True)
class RunSummary:
    system: str
    load: float
    load_unit: str  # "sessions" (concurrent, closed loop) | "req/s" (open loop)
    requests: int
    errors: int
    ttft: Stats
    tpot: Stats
    e2e: Stats
    tokens_by_source: dict[str, int]
    bytes_moved: dict[str, int]
    advisories: dict[str, int]
    label: str = ""  # e.g. "real CPU" | "simulated H100"
    duration_s: float = 0.0  # first send to last answer; 0 when unknown
    extra: dict[str, float] = field(default_factory=dict)
    # TTFT of the turns after each session's first: the turns a hint can foresee.
    later_ttft: Stats = field(default_factory=Stats.empty)

    @property
    def recomputed_share(self) -> float:
        total = sum(self.tokens_by_source.values())
        return self.tokens_by_source.get("recomputed", 0) / total if total else math.nan

    @property
    def throughput_rps(self) -> float:
        return (self.requests - self.errors) / self.duration_s if self.duration_s > 0 else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def stats(values: Iterable[float | None]) -> Stats:
    present = [v for v in values if v is not None]
    if not present:
        return Stats.empty()
    return Stats(sum(present) / len(present), percentile(present, 50), percentile(present, 99), len(present))


def summarize(
    system: str,
    load: float,
    load_unit: str,
    records: Sequence[TurnRecord],
    *,
    bytes_moved: Mapping[str, int] | None = None,
    advisories: Mapping[str, int] | None = None,
    label: str = "",
) -> RunSummary:
    """Latency stats over the turns that succeeded; token sources over the same turns (a failed turn has none)."""
    succeeded = [r for r in records if r.error is None]
    sources = dict.fromkeys(TOKEN_SOURCES, 0)
    for r in succeeded:
        sources["device"] += r.cached_device
        sources["host"] += r.cached_host
        sources["pool"] += r.cached_pool
        sources["recomputed"] += r.recomputed_tokens
    ends = [r.done_s for r in succeeded if r.done_s is not None]
    duration = max(ends) - min(r.sent_s for r in records) if ends else 0.0
    return RunSummary(
        system=system,
        load=load,
        load_unit=load_unit,
        requests=len(records),
        errors=len(records) - len(succeeded),
        ttft=stats(r.ttft_s for r in succeeded),
        later_ttft=stats(r.ttft_s for r in succeeded if r.turn > 0),
        tpot=stats(r.tpot_s for r in succeeded),
        e2e=stats(r.e2e_s for r in succeeded),
        tokens_by_source=sources,
        bytes_moved=dict(bytes_moved or {}),
        advisories=dict(advisories or {}),
        label=label,
        duration_s=duration,
    )


def served_at_slo(summaries: Iterable[RunSummary], *, p99_ttft_s: float) -> dict[str, float]:
    """Per system, the most load at which p99 TTFT stays under the bound, swept upward from the lightest load.

    The sweep stops at the first load that misses the SLO (or has errors): a lucky pass at a higher load after a
    miss is noise, not capacity. A system that misses at its lightest load serves 0.
    """
    by_system: dict[str, list[RunSummary]] = {}
    for s in summaries:
        by_system.setdefault(s.system, []).append(s)
    served: dict[str, float] = {}
    for system, runs in by_system.items():
        best = 0.0
        for run in sorted(runs, key=lambda r: r.load):
            if run.errors or not run.ttft.p99 <= p99_ttft_s:  # `not <=` also rejects NaN
                break
            best = run.load
        served[system] = best
    return served


def _open_text(path: Path, mode: Literal["r", "w"]) -> TextIO:
    """JSON lines, gzip-compressed when the name ends in .gz (the records kept in the repository are)."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt" if mode == "r" else "wt", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def write_records(path: Path, records: Iterable[TurnRecord]) -> None:
    """One `TurnRecord` a line, to `*.jsonl` or gzip-compressed to `*.jsonl.gz`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open_text(path, "w") as out:
        for r in records:
            out.write(json.dumps(dataclasses.asdict(r)) + "\n")


def read_records(path: Path) -> list[TurnRecord]:
    """What `write_records` wrote, from `*.jsonl` or `*.jsonl.gz`."""
    with _open_text(path, "r") as lines:
        return [TurnRecord(**json.loads(line)) for line in lines if line.strip()]


def summary_from_dict(data: Mapping[str, object]) -> RunSummary:
    """The inverse of `dataclasses.asdict(summary)`: summaries saved as JSON, read back for a report."""
    fields = dict(data)
    for name in ("ttft", "tpot", "e2e", "later_ttft"):
        if name in fields:  # later_ttft: absent from summaries saved before it existed
            fields[name] = Stats(**fields[name])  # type: ignore[arg-type]
    return RunSummary(**fields)  # type: ignore[arg-type]

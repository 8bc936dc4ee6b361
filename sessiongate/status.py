"""`sessiongate status`: a running gateway at a glance, in a terminal, redrawn every few seconds.

An operator on call asks which worker is slow, which sessions are live, what the advisor is doing and how the last
turns went; the admin API has each answer, spread over several endpoints. This reads them through the SDK's admin
client (`client.admin`: the admin key), so it needs nothing but `pip install sessiongate`, and draws one screen:
the workers (health, load, queue, device KV), the live sessions (most recently active first), the advisories in
flight and the outcomes so far, and the last turns with their worker, cached tokens by tier, TTFT and advisory.
The screen is plain text redrawn with two ANSI sequences (home, clear), so it works in any terminal and in tmux.

`fetch` (the admin calls) and `render` (the text, a pure function) are separate so that each can be tested alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from sessiongate.sdk import (
    AdminSession,
    AdvisoryStats,
    APIConnectionError,
    APIStatusError,
    PermissionDeniedError,
    SessionGate,
    WorkerInfo,
)

__all__ = ["Snapshot", "fetch", "render", "run_status"]

# Home the cursor and clear the screen: a whole redraw, no flicker worth a TUI library.
_REDRAW = "\x1b[H\x1b[2J"
_LAST_TURNS = 12


@dataclass(frozen=True)
class Snapshot:
    """What one refresh read from the gateway."""

    url: str
    taken_at: datetime
    workers: tuple[WorkerInfo, ...]
    sessions: tuple[AdminSession, ...]
    stats: AdvisoryStats


def fetch(client: SessionGate, *, sessions: int) -> Snapshot:
    """Read the gateway's state: workers, the `sessions` most recently active live sessions with their turns and
    advisories, and the advisory statistics."""
    workers = tuple(client.admin.workers.list())
    page = client.admin.sessions.list(state="active", limit=sessions)
    details = tuple(client.admin.sessions.get(s.id) for s in page.data)
    stats = client.admin.advisory_stats()
    return Snapshot(str(client.base_url), datetime.now(UTC), workers, details, stats)


def _ago(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "-"
    seconds = max((now - then).total_seconds(), 0.0)
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in (header, *rows)]


def _load(worker: WorkerInfo, key: str) -> str:
    value = (worker.load or {}).get(key)
    return str(value) if isinstance(value, int) else "-"


def _device_kv(worker: WorkerInfo) -> str:
    load = worker.load or {}
    used, total = load.get("device_kv_tokens_used"), load.get("device_kv_tokens_total")
    if isinstance(used, int) and isinstance(total, int) and total > 0:
        return f"{100 * used / total:.0f}%"
    return "-"


def render(snapshot: Snapshot, *, interval_s: float | None = None) -> list[str]:
    """The screen's lines."""
    now = snapshot.taken_at
    every = f"every {interval_s:g} s, Ctrl-C to stop" if interval_s else "once"
    lines = [f"sessiongate status  {snapshot.url}  {now:%Y-%m-%d %H:%M:%S} UTC  ({every})", ""]

    lines.append(f"WORKERS ({sum(w.routable for w in snapshot.workers)} of {len(snapshot.workers)} routable)")
    worker_rows = [
        (
            w.id,
            "draining" if w.draining else "healthy" if w.healthy else "down",
            str(w.in_flight),
            _load(w, "running_requests"),
            _load(w, "queued_requests"),
            _device_kv(w),
            _load(w, "prefetches_in_flight"),
            str(w.served),
            w.last_error or "",
        )
        for w in snapshot.workers
    ]
    worker_header = (
        "worker",
        "health",
        "in flight",
        "running",
        "queued",
        "device KV",
        "prefetching",
        "served",
        "last error",
    )
    lines += _table(worker_header, worker_rows)

    lines += ["", f"LIVE SESSIONS ({len(snapshot.sessions)} most recently active)"]
    pending = [(d.session.id, a) for d in snapshot.sessions for a in d.advisories if a.outcome == "pending"]
    session_rows = [
        (
            d.session.id,
            d.session.tenant_id or "-",
            str(d.session.turn_count),
            str(d.session.priority),
            _ago(d.session.last_active_at, now),
            str(d.kv.get("last_worker") or "-"),
        )
        for d in snapshot.sessions
    ]
    lines += _table(("session", "tenant", "turns", "priority", "last active", "last worker"), session_rows)

    stats = snapshot.stats
    lines += ["", f"ADVISORIES ({len(pending)} in flight)"]
    for session_id, live in pending:
        lines.append(f"  in flight: {live.kind} for {session_id} on {live.target_worker or '-'} ({live.id})")
    for kind, kind_stats in sorted(stats.kinds.items()):
        outcomes = ", ".join(f"{o} {n}" for o, n in sorted(kind_stats.outcomes.items()) if n)
        precision = "-" if kind_stats.precision is None else f"{kind_stats.precision:.2f}"
        lines.append(f"  {kind}: {outcomes or 'no outcome yet'}  (precision {precision})")
    recall = "-" if stats.recall is None else f"{stats.recall:.2f}"
    lines.append(f"  turns {stats.requests}, missed {stats.missed}, recall {recall}")

    turns = sorted(
        ((d.session.id, t) for d in snapshot.sessions for t in d.turns),
        key=lambda pair: pair[1].timings.received_at or datetime.min.replace(tzinfo=UTC),
        reverse=True,
    )[:_LAST_TURNS]
    lines += ["", f"LAST TURNS ({len(turns)})"]
    turn_rows = []
    for session_id, turn in turns:
        tiers = turn.cached_tokens_by_tier
        ttft = turn.timings.ttft_ms
        settled = f"{turn.advisory.kind} {turn.advisory.outcome}" if turn.advisory is not None else "-"
        turn_rows.append(
            (
                _ago(turn.timings.received_at, now),
                session_id,
                str(turn.seq),
                turn.status,
                turn.worker or "-",
                str(tiers.device),
                str(tiers.host),
                str(tiers.storage),
                "-" if ttft is None else f"{ttft:.0f}",
                settled,
            )
        )
    header = ("when", "session", "seq", "status", "worker", "device", "host", "pool", "TTFT ms", "advisory")
    lines += _table(header, turn_rows)
    return lines


def run_status(
    *,
    base_url: str | None,
    admin_key: str | None,
    interval_s: float,
    once: bool,
    sessions: int = 10,
    out: TextIO | None = None,
) -> int:
    """Draw the gateway's status once (`once`) or every `interval_s` until Ctrl-C; 1 when it cannot be read."""
    out = out or sys.stdout
    with SessionGate(base_url=base_url, admin_key=admin_key, timeout=10.0, max_retries=0) as client:
        try:
            while True:
                try:
                    lines = render(fetch(client, sessions=sessions), interval_s=None if once else interval_s)
                except PermissionDeniedError as exc:
                    print(f"sessiongate status: {exc.message} (the admin key: --admin-key or SESSIONGATE_ADMIN_KEY)")
                    return 2
                except (APIConnectionError, APIStatusError) as exc:
                    if once:
                        print(f"sessiongate status: cannot read {client.base_url}: {exc}", file=sys.stderr)
                        return 1
                    lines = [f"sessiongate status  {client.base_url}: cannot read it ({exc}); retrying"]
                if once:
                    out.write("\n".join(lines) + "\n")
                    return 0
                out.write(_REDRAW + "\n".join(lines) + "\n")
                out.flush()
                time.sleep(interval_s)
        except KeyboardInterrupt:
            return 0

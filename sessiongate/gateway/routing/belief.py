"""The gateway's belief of where each session's KV is: soft state, corrected by what the workers report.

Updated from two sources only:
- each finished turn: the worker that served it now holds the whole context (prompt and answer) on its device,
  and, when its load report or the turn's cache report names a storage backend (or the turn hit the pool), the
  pool holds it too (HiCache writes through); the report's device/host/storage split is kept as the last
  observation;
- each prefetch outcome: the worker holds what the prefetch brought to the tier it targeted.

Beliefs age, because other sessions evict them and the gateway does not see that: a device entry older than
`device_ttl_s` is believed to be in the host tier, a host entry older than `host_ttl_s` is believed gone (the pool
copy stays, the pool has its own eviction). Bounded to `max_sessions` (least recently touched dropped). Losing it
is safe: routing then pays recompute or pool costs until the next turn corrects it. Times are seconds on the
caller's monotonic clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .views import KVResidency

__all__ = ["KVBelief", "SessionKV"]


@dataclass(slots=True)
class SessionKV:
    # worker id -> (tokens, tier, observed at)
    workers: dict[str, tuple[int, str, float]] = field(default_factory=dict)
    pool: int = 0
    last_worker: str | None = None
    context_tokens: int = 0
    last_report: dict[str, Any] | None = None


class KVBelief:
    def __init__(self, *, device_ttl_s: float = 120.0, host_ttl_s: float = 1800.0, max_sessions: int = 100_000) -> None:
        self.device_ttl_s = device_ttl_s
        self.host_ttl_s = host_ttl_s
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, SessionKV] = OrderedDict()

    def _entry(self, session_id: str) -> SessionKV:
        entry = self._sessions.get(session_id)
        if entry is None:
            entry = self._sessions[session_id] = SessionKV()
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(session_id)
        return entry

    def residency(self, session_id: str, now: float) -> KVResidency:
        entry = self._sessions.get(session_id)
        if entry is None:
            return KVResidency()
        device: dict[str, int] = {}
        host: dict[str, int] = {}
        for worker_id, (tokens, tier, at) in entry.workers.items():
            age = now - at
            if tier == "device" and age <= self.device_ttl_s:
                device[worker_id] = tokens
            elif age <= self.host_ttl_s:
                host[worker_id] = tokens
        return KVResidency(device=device, host=host, pool=entry.pool, last_worker=entry.last_worker)

    def context_tokens(self, session_id: str) -> int:
        entry = self._sessions.get(session_id)
        return entry.context_tokens if entry is not None else 0

    def after_turn(
        self,
        session_id: str,
        worker_id: str,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        details: Mapping[str, Any] | None,
        now: float,
        writes_to_pool: bool = False,
    ) -> None:
        """`writes_to_pool`: the serving worker's load report names a pool it writes through to; needed because
        a turn whose prompt had no hits comes back without a cache report."""
        entry = self._entry(session_id)
        total = prompt_tokens + completion_tokens
        entry.workers[worker_id] = (total, "device", now)
        entry.last_worker = worker_id
        entry.context_tokens = total
        if details is not None:
            entry.last_report = dict(details)
        if writes_to_pool or (details is not None and (details.get("storage_backend") or _int(details.get("storage")))):
            entry.pool = total

    def after_prefetch(self, session_id: str, worker_id: str, *, tokens: int, tier: str, now: float) -> None:
        entry = self._entry(session_id)
        current = entry.workers.get(worker_id)
        if current is not None and current[1] == "device" and tier == "host" and now - current[2] <= self.device_ttl_s:
            return  # already believed closer than the prefetch brought it
        entry.workers[worker_id] = (tokens, tier, now)

    def after_drop(self, session_id: str, worker_id: str | None = None) -> None:
        """The application dropped the session's KV (on one worker, or everywhere with the pool)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return
        if worker_id is None:
            del self._sessions[session_id]
        else:
            entry.workers.pop(worker_id, None)

    def entry(self, session_id: str) -> SessionKV | None:
        """The session's entry as held (times on the caller's clock), for copying to other replicas."""
        return self._sessions.get(session_id)

    def replace(self, session_id: str, entry: SessionKV) -> None:
        """Take another replica's (newer) entry for the session instead of this one's."""
        self._entry(session_id)
        self._sessions[session_id] = entry

    def describe(self, session_id: str, now: float) -> dict[str, Any]:
        """The belief as JSON for the admin API."""
        kv = self.residency(session_id, now)
        entry = self._sessions.get(session_id)
        return {
            "device": kv.device,
            "host": kv.host,
            "pool": kv.pool,
            "last_worker": kv.last_worker,
            "context_tokens": entry.context_tokens if entry else 0,
            "last_cache_report": entry.last_report if entry else None,
        }


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0

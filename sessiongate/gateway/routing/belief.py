"""The gateway's belief of where each session's KV is: soft state, corrected by what the workers report.

Updated from two sources only:
- each finished turn: the worker that served it now holds the whole context (prompt and answer) on its device,
  and, when its load report or the turn's cache report names a storage backend (or the turn hit the pool), the
  pool holds it too (HiCache writes through); the report's device/host/storage split is kept as the last
  observation;
- each prefetch outcome: the worker holds what the prefetch brought to the tier it targeted.

Beliefs age, because other sessions evict them and the gateway does not see that happen. Two rules:

- **Capacity** (a worker whose KV capacities are known: `set_capacity`, from its load report's
  `device_kv_tokens_total` and `host_kv_tokens_total`; in the simulator from its calibration). Per worker the belief
  keeps the sessions served or prefetched there in recency order with their token counts: a shadow of the worker's
  LRU tiers. A session is believed on the device while it and the sessions touched there after it fit in the
  device capacity (its LRU stack distance), in the host tier while they fit in the host capacity (HiCache writes
  through, so the host holds a copy of what the device holds: `host_holds_device`; with a write-back tier the
  reach is device + host), else gone from that worker (the pool copy stays). So a long session on a worker crowded
  with others' long turns is believed evicted within one turn, as it is, and `kv_aware` moves it to an idle worker
  instead of believing its stay free (the issue 27 search's co-location, docs/simulator.md). The shadow is kept as
  the cache itself is, not recomputed: a touch moves the session to the most recent end and evicts from the old
  end until each tier fits (amortised O(1)), and a query is a dictionary look-up per worker the session was seen
  on; an entry once pushed out stays out even if a later drop frees room, as in the worker.
  Conservative where sessions share a prefix (a system prompt is counted once per session here, once in the
  worker's radix tree) and where the worker evicts a context's tail first and keeps its prefix (the shadow drops
  whole sessions), and where the worker ranks KV above LRU order (a live advisory's prefetch, a `retain`), which
  the shadow does not model: it may believe a session evicted too early. Optimistic by the KV of running requests
  (a turn's new tokens and output are counted when it ends, but while it runs they evict the neighbours' KV: the
  belief lags that by one turn) and by traffic it does not see: the shadow is this replica's (other gateway
  replicas' turns on the same worker are not in it, and a session's observation copied from another replica,
  `replace`, or from a forked parent ages by time instead).
- **Time** (a worker with unknown capacities, no load report; or an observation the shadow does not hold): a device
  entry older than `device_ttl_s` is believed to be in the host tier, a host entry older than `host_ttl_s` is
  believed gone.

Bounded to `max_sessions` (least recently touched dropped; their KV stays in the shadows, it still fills the
workers). Losing it is safe: routing then pays recompute or pool costs until the next turn corrects it. Times are
seconds on the caller's monotonic clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .views import KVResidency

__all__ = ["KVBelief", "SessionKV"]

# Two times of one observation that differ by less than this are the same observation (a copy through the shared
# state converts between clocks, which moves it by microseconds).
_SAME_OBSERVATION_S = 0.5
_NONE: list[tuple[str, float]] = []


@dataclass(slots=True)
class SessionKV:
    # worker id -> (tokens, tier, observed at)
    workers: dict[str, tuple[int, str, float]] = field(default_factory=dict)
    pool: int = 0
    last_worker: str | None = None
    context_tokens: int = 0
    last_report: dict[str, Any] | None = None


class _Tier:
    """One tier of a worker's shadow: session -> (tokens, touched at), least recent first."""

    __slots__ = ("capacity", "entries", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.entries: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def pop(self, session_id: str) -> tuple[int, float] | None:
        held = self.entries.pop(session_id, None)
        if held is not None:
            self.used -= held[0]
        return held

    def put(self, session_id: str, tokens: int, at: float) -> None:
        self.entries[session_id] = (tokens, at)
        self.used += tokens


class _WorkerShadow:
    """What this replica has put in one worker's device and host tiers, as the worker's LRU would keep it."""

    __slots__ = ("device", "host", "inclusive", "limit")

    def __init__(self, device_tokens: int, host_tokens: int, *, inclusive: bool, limit: int) -> None:
        self.device = _Tier(device_tokens)
        self.host = _Tier(host_tokens)
        self.inclusive = inclusive
        self.limit = limit

    def find(self, session_id: str) -> tuple[str, float] | None:
        """(tier, touched at) of the session's entry, None when it is not held."""
        held = self.device.entries.get(session_id)
        if held is not None:
            return "device", held[1]
        held = self.host.entries.get(session_id)
        return ("host", held[1]) if held is not None else None

    def drop(self, session_id: str) -> None:
        self.device.pop(session_id)
        self.host.pop(session_id)

    def touch(self, session_id: str, tokens: int, tier: str, at: float) -> list[tuple[str, float]]:
        """The session now holds `tokens` in `tier` (device: also in host when it holds the device's copy); returns
        the sessions pushed out of both tiers, with when they had been touched."""
        device, host = self.device, self.host
        held = device.entries.pop(session_id, None)
        if held is not None:
            device.used -= held[0]
        held = host.entries.pop(session_id, None)
        if held is not None:
            host.used -= held[0]
        if tokens > 0:
            if tier == "device":
                device.entries[session_id] = (tokens, at)
                device.used += tokens
            if tier != "device" or self.inclusive:
                host.entries[session_id] = (tokens, at)
                host.used += tokens
        if device.used > device.capacity or host.used > host.capacity or len(host.entries) > self.limit:
            return self.trim()
        return _NONE

    def resize(self, device_tokens: int, host_tokens: int) -> list[tuple[str, float]]:
        self.device.capacity, self.host.capacity = device_tokens, host_tokens
        return self.trim()

    def trim(self) -> list[tuple[str, float]]:
        """Evict the least recent entries until each tier fits (and holds at most `limit` entries)."""
        gone: list[tuple[str, float]] = []
        device, host, limit = self.device, self.host, self.limit
        while device.entries and (device.used > device.capacity or len(device.entries) > limit):
            session_id, (tokens, at) = device.entries.popitem(last=False)
            device.used -= tokens
            if not self.inclusive:
                host.put(session_id, tokens, at)  # a write-back tier takes what the device evicts
            elif session_id not in host.entries:
                gone.append((session_id, at))
        while host.entries and (host.used > host.capacity or len(host.entries) > limit):
            session_id, (tokens, at) = host.entries.popitem(last=False)
            host.used -= tokens
            if session_id not in device.entries:
                gone.append((session_id, at))
        return gone


class KVBelief:
    def __init__(
        self,
        *,
        device_ttl_s: float = 120.0,
        host_ttl_s: float = 1800.0,
        max_sessions: int = 100_000,
        host_holds_device: bool = True,
    ) -> None:
        self.device_ttl_s = device_ttl_s
        self.host_ttl_s = host_ttl_s
        self.max_sessions = max_sessions
        # HiCache's write-through (our launcher's policy) keeps a host copy of every device page; False: a write-back
        # host tier that holds only what the device evicted.
        self.host_holds_device = host_holds_device
        self._sessions: OrderedDict[str, SessionKV] = OrderedDict()
        self._shadows: dict[str, _WorkerShadow] = {}

    def _entry(self, session_id: str) -> SessionKV:
        entry = self._sessions.get(session_id)
        if entry is None:
            entry = self._sessions[session_id] = SessionKV()
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(session_id)
        return entry

    # capacities

    def set_capacity(self, worker_id: str, *, device_tokens: int | None, host_tokens: int | None) -> None:
        """The worker's device and host KV capacities in tokens (its load report's totals; None or 0 host: no host
        tier). Unknown device capacity (None, 0) changes nothing: a worker never reported ages by time. Sessions
        touched there from now on age by capacity."""
        if not device_tokens or device_tokens <= 0:
            return
        host = max(host_tokens or 0, 0)
        shadow = self._shadows.get(worker_id)
        if shadow is None:
            self._shadows[worker_id] = _WorkerShadow(
                device_tokens, host, inclusive=self.host_holds_device, limit=self.max_sessions
            )
        elif (shadow.device.capacity, shadow.host.capacity) != (device_tokens, host):
            self._forget(worker_id, shadow.resize(device_tokens, host))

    def capacity(self, worker_id: str) -> tuple[int, int] | None:
        """(device, host) tokens the belief counts for the worker; None: unknown, its beliefs age by time."""
        shadow = self._shadows.get(worker_id)
        return (shadow.device.capacity, shadow.host.capacity) if shadow is not None else None

    def _touch(self, session_id: str, worker_id: str, tokens: int, tier: str, now: float) -> None:
        shadow = self._shadows.get(worker_id)
        if shadow is not None:
            gone = shadow.touch(session_id, tokens, tier, now)
            if gone:
                self._forget(worker_id, gone)

    def _forget(self, worker_id: str, gone: list[tuple[str, float]]) -> None:
        """Pushed out of the worker's tiers: the observation made when it was touched there is no longer held."""
        for session_id, touched_at in gone:
            entry = self._sessions.get(session_id)
            if entry is None:
                continue
            observed = entry.workers.get(worker_id)
            if observed is not None and observed[2] <= touched_at + _SAME_OBSERVATION_S:
                del entry.workers[worker_id]

    # queries

    def _tier(self, session_id: str, worker_id: str, tier: str, at: float, now: float) -> str | None:
        """Where the observation (`tier` at `at`) of the session on the worker is believed to be now."""
        shadow = self._shadows.get(worker_id)
        if shadow is not None:
            held = shadow.find(session_id)
            if held is not None and held[1] >= at - _SAME_OBSERVATION_S:
                return held[0]
        age = now - at
        if tier == "device" and age <= self.device_ttl_s:
            return "device"
        return "host" if age <= self.host_ttl_s else None

    def residency(self, session_id: str, now: float) -> KVResidency:
        entry = self._sessions.get(session_id)
        if entry is None:
            return KVResidency()
        device: dict[str, int] = {}
        host: dict[str, int] = {}
        for worker_id, (tokens, tier, at) in entry.workers.items():
            where = self._tier(session_id, worker_id, tier, at, now)
            if where == "device":
                device[worker_id] = tokens
            elif where == "host":
                host[worker_id] = tokens
        return KVResidency(device=device, host=host, pool=entry.pool, last_worker=entry.last_worker)

    def context_tokens(self, session_id: str) -> int:
        entry = self._sessions.get(session_id)
        return entry.context_tokens if entry is not None else 0

    # updates

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
        self._touch(session_id, worker_id, total, "device", now)

    def after_prefetch(self, session_id: str, worker_id: str, *, tokens: int, tier: str, now: float) -> None:
        entry = self._entry(session_id)
        current = entry.workers.get(worker_id)
        if (
            current is not None
            and tier == "host"
            and self._tier(session_id, worker_id, current[1], current[2], now) == "device"
        ):
            return  # already believed closer than the prefetch brought it
        entry.workers[worker_id] = (tokens, tier, now)
        self._touch(session_id, worker_id, tokens, tier, now)

    def after_drop(self, session_id: str, worker_id: str | None = None) -> None:
        """The application dropped the session's KV (on one worker, or everywhere with the pool)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            return
        if worker_id is None:
            del self._sessions[session_id]
            for shadow in self._shadows.values():
                shadow.drop(session_id)
        else:
            entry.workers.pop(worker_id, None)
            on_worker = self._shadows.get(worker_id)
            if on_worker is not None:
                on_worker.drop(session_id)

    def entry(self, session_id: str) -> SessionKV | None:
        """The session's entry as held (times on the caller's clock), for copying to other replicas."""
        return self._sessions.get(session_id)

    def replace(self, session_id: str, entry: SessionKV) -> None:
        """Take another replica's (newer) entry for the session instead of this one's. The shadows stay this
        replica's: an observation in `entry` newer than this replica's touch of the worker ages by time."""
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

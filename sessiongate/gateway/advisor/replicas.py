"""The advisor's side of the replicas' shared state (`gateway.shared`): its live advisories there, the hint quality
samples every replica adds to, and the statistics counters they add up; all times here are Unix times.

`Advisor` owns one `SharedAdvisories` whatever the deployment. With one process (`state` None) the calls on the
advisor's common paths (`update`, `take_back`, `begin_turn`, `tier`, `count`, `flush_counts`, `counters`) are
no-ops or answer "nothing shared", and the rest are not called. A shared state that does not answer
(`SharedUnavailable`) is treated the same way, so each replica goes on with its own book. What the advisor asks:

- an advisory made here (this replica its owner): `put`, then `update` as its prefetch fires, finishes or fails
  (False: a turn on another replica claimed it), `take_back` when a later signal supersedes it, and `end` when
  this replica's copy expires (ended, extended by a signal elsewhere, or claimed elsewhere: "gone");
- a signal here for a session whose live advisory another replica owns: `extend` or `stop` that one;
- a turn here: `begin_turn`, the one atomic claim of the session's advisory (and its KV belief) before routing;
- the adaptive rule: `tier` from every replica's samples, `add_outcome` for each settled advisory;
- statistics: `count` adds to a batch that `flush_counts` writes at the next tick; `counters` reads the sum.

The advisor converts its monotonic times to these Unix times (`Advisor._to_unix`); `local` converts back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from sessiongate.gateway.shared import SharedAdvisory, SharedState, SharedTurn, SharedUnavailable
from sessiongate.gateway.shared.base import EndState

from .core import LiveAdvisory
from .quality import HintQuality, Tier

__all__ = ["SharedAdvisories"]

# How long a shared advisory is kept past its expiry, for its owner to find and settle it.
_KEEP_S = 60.0
# A time after every expiry: `end_advisory` at it ends an advisory whatever its expiry (a withdrawal).
_FOREVER = 1e12


class SharedAdvisories:
    def __init__(
        self, state: SharedState | None, *, replica: str, unix: Callable[[], float], quality: HintQuality
    ) -> None:
        # None with one process: a local shared state holds nothing another replica could read.
        self.state = state if state is not None and state.distributed else None
        self.replica = replica
        self.unix = unix
        self.quality = quality
        # Statistics counted since the last tick, added to the replicas' shared counters at the next one.
        self._counts: dict[str, float] = {}

    def local(self, record: SharedAdvisory, now: float) -> LiveAdvisory:
        """Another replica's advisory, claimed by a turn here, on the advisor's clock (`now` its reading)."""
        offset = now - self.unix()
        return LiveAdvisory(
            id=record.id,
            session_id=record.session_id,
            tenant_id=record.tenant_id,
            kind=record.kind,
            worker_id=record.worker_id,
            worker_url=record.worker_url,
            target=record.target,
            created_at=now,
            fire_at=now,
            expires_at=record.expires_at + offset,
            fired=record.fired,
            ready_at=None if record.ready_at is None else record.ready_at + offset,
            failed=record.failed,
            stopped=record.stopped,
            bytes_loaded=record.bytes_loaded,
        )

    async def put(self, advisory: LiveAdvisory, expires_at: float) -> None:
        """Share an advisory made here; marked `shared` once the shared state holds it."""
        assert self.state is not None
        record = SharedAdvisory(
            id=advisory.id,
            session_id=advisory.session_id,
            tenant_id=advisory.tenant_id,
            kind=advisory.kind,
            worker_id=advisory.worker_id,
            worker_url=advisory.worker_url or "",
            target=advisory.target,
            owner=self.replica,
            expires_at=expires_at,
            fired=advisory.fired,
            failed=advisory.failed,
        )
        try:
            await self.state.put_advisory(record, keep_s=_KEEP_S)
        except SharedUnavailable:
            return  # this replica's alone: only a turn here can claim it
        advisory.shared = True

    async def update(self, advisory: LiveAdvisory, **changes: object) -> bool:
        """Write changes of a shared advisory; False only when the shared state no longer holds it (claimed or
        replaced through another replica)."""
        if self.state is None or not advisory.shared:
            return True
        try:
            return await self.state.update_advisory(advisory.session_id, advisory.id, _KEEP_S, **changes)
        except SharedUnavailable:
            return True  # a turn on another replica judges the advisory by what it last found there

    async def take_back(self, advisory: LiveAdvisory) -> bool:
        """Remove a superseded advisory from the shared state before settling it here; False when a turn on
        another replica claimed it first (that replica settles it)."""
        if self.state is None or not advisory.shared:
            return True
        try:
            state, _ = await self.state.end_advisory(advisory.session_id, advisory.id, _FOREVER)
        except SharedUnavailable:
            return True
        return state != "gone"

    async def end(self, advisory: LiveAdvisory) -> tuple[EndState, SharedAdvisory | None]:
        """This replica's copy of a shared advisory expired: whether it ended (ended also while the shared state
        does not answer), was extended by a signal on another replica, or is gone (a turn claimed it)."""
        assert self.state is not None
        try:
            return await self.state.end_advisory(advisory.session_id, advisory.id, self.unix())
        except SharedUnavailable:
            return "ended", None

    async def extend(self, session_id: str, fire_in_s: float, ttl_s: float) -> tuple[SharedAdvisory, float] | None:
        """Extend the session's live advisory that another replica owns (debounce across replicas): it and its new
        expiry, in seconds from now. None when there is none (or the shared state is down)."""
        assert self.state is not None
        unix = self.unix()
        try:
            record = await self.state.get_advisory(session_id)
            if record is None or record.expires_at <= unix:
                return None
            expires_at = max(record.expires_at, unix + fire_in_s + ttl_s)
            if not await self.state.update_advisory(
                session_id, record.id, _KEEP_S, expires_at=expires_at, stopped=False
            ):
                return None
        except SharedUnavailable:
            return None
        return record, expires_at - unix

    async def stop(self, session_id: str, grace_s: float) -> tuple[SharedAdvisory, float] | None:
        """Typing stopped: end another replica's live advisory for the session after `grace_s`; it and its new
        expiry, in seconds from now. None when there is none (or the shared state is down)."""
        assert self.state is not None
        unix = self.unix()
        try:
            record = await self.state.get_advisory(session_id)
            if record is None or record.expires_at <= unix:
                return None
            expires_at = min(record.expires_at, unix + grace_s)
            await self.state.update_advisory(session_id, record.id, _KEEP_S, expires_at=expires_at, stopped=True)
        except SharedUnavailable:
            return None
        return record, expires_at - unix

    async def begin_turn(self, session_id: str) -> SharedTurn | None:
        """Claim the session's shared advisory for a turn here, with its KV belief; None with one process or
        while the shared state does not answer (the book decides)."""
        if self.state is None:
            return None
        try:
            return await self.state.begin_turn(session_id, self.unix())
        except SharedUnavailable:
            return None

    async def tier(self, session_id: str, tenant_id: str, kind: str) -> Tier | None:
        """The adaptive rule's tier by every replica's outcomes; None when they are not shared (or not reachable)."""
        if self.state is None:
            return None
        keys = [f"{a}:{b}" for a, b in self.quality.keys(session_id, tenant_id, kind)]
        try:
            return self.quality.tier_of(await self.state.samples(keys), self.unix())
        except SharedUnavailable:
            return None

    async def add_outcome(self, advisory: LiveAdvisory, wasted: bool) -> None:
        assert self.state is not None
        keys = [f"{a}:{b}" for a, b in self.quality.keys(advisory.session_id, advisory.tenant_id, advisory.kind)]
        with contextlib.suppress(SharedUnavailable):
            await self.state.add_sample(
                keys, (self.unix(), wasted), max_len=self.quality.max_samples, ttl_s=self.quality.window_s
            )

    @property
    def unflushed(self) -> bool:
        return bool(self._counts)

    def count(self, counts: dict[str, float]) -> None:
        if self.state is None:
            return
        for name, by in counts.items():
            self._counts[name] = self._counts.get(name, 0) + by

    async def flush_counts(self) -> None:
        counts, self._counts = self._counts, {}
        if self.state is None or not counts:
            return
        with contextlib.suppress(SharedUnavailable):  # statistics: a batch lost to an outage is not retried
            await self.state.incr("advisories", counts)

    async def counters(self) -> dict[str, float] | None:
        """Every replica's statistics counters; None with one process or while the shared state does not answer."""
        if self.state is None:
            return None
        try:
            counters = await self.state.counters("advisories")
        except SharedUnavailable:
            return None
        # This replica's counts not yet flushed belong in it too.
        for name, by in self._counts.items():
            counters[name] = counters.get(name, 0) + by
        return counters

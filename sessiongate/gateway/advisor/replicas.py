"""The advisor's side of the replicas' shared state (`gateway.shared`): its live advisories there, the hint quality
samples every replica adds to, and the statistics counters they add up; all times there are Unix times.

Whether the replicas share state is asked once, when the advisor is built (`advisories_for`): with one process
the advisor gets `LocalAdvisories`, whose calls are no-ops or answer "nothing shared"; with replicas,
`SharedAdvisories`. A shared state that does not answer (`SharedUnavailable`) is treated as with one process, so
each replica goes on with its own book. What the advisor asks:

- an advisory made here (this replica its owner): `put`, then `update` as its prefetch fires, finishes or fails
  (False: a turn on another replica claimed it), `take_back` when a later signal supersedes it, and `end_expired`
  when this replica's copy expires (ended, extended by a signal elsewhere, or claimed elsewhere);
- a signal here for a session whose live advisory another replica owns: `refresh_elsewhere` or `stop_elsewhere`;
  a tool result that can land: `fire_elsewhere`, which also asks the owner to fire it now if it is scheduled;
- the owner, at each tick while it holds a scheduled shared advisory (`awaits_fire_requests`): `fire_requests`,
  the advisories other replicas asked it to fire (one round trip for all of them, none while it holds none);
- a turn here: `begin_turn`, the one atomic claim of the session's advisory (and its KV belief) before routing,
  and `claim_into`, which puts the claimed advisory in this replica's book;
- the adaptive rule: `tier` from every replica's samples, `settled` for each settled advisory;
- statistics: `count` adds to a batch that `flush_counts` writes at the next tick; `counters` reads the sum.

The advisor's times are monotonic; `to_unix` converts them to these Unix times, `local` converts back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from sessiongate.gateway.shared import SharedAdvisory, SharedState, SharedTurn, SharedUnavailable
from sessiongate.gateway.shared.base import EndState

from .core import AdvisorBook, LiveAdvisory
from .decide import Elsewhere
from .quality import HintQuality, Tier
from .stats import AdvisoryStats

__all__ = ["LocalAdvisories", "SharedAdvisories", "advisories_for"]

log = structlog.get_logger(__name__)

# How long a shared advisory is kept past its expiry, for its owner to find and settle it.
_KEEP_S = 60.0
# A time after every expiry: `end_advisory` at it ends an advisory whatever its expiry (a withdrawal).
_FOREVER = 1e12

Spawn = Callable[[Coroutine[Any, Any, None]], None]


def advisories_for(
    state: SharedState | None, *, replica: str, unix: Callable[[], float], quality: HintQuality
) -> LocalAdvisories:
    """The one place the advisor asks whether replicas share its state."""
    if state is not None and state.distributed:
        return SharedAdvisories(state, replica=replica, unix=unix, quality=quality)
    return LocalAdvisories(unix=unix, quality=quality)


class LocalAdvisories:
    """One process: nothing is shared, so every call to the shared state is a no-op or answers "nothing shared".
    What the advisor does around those answers (`claim_into`, `end_expired`) is here too, for both."""

    def __init__(self, *, unix: Callable[[], float], quality: HintQuality) -> None:
        self.unix = unix
        self.quality = quality

    def to_unix(self, monotonic: float, now: float) -> float:
        """A time on the advisor's clock (`now` its reading) as a Unix time."""
        return monotonic - now + self.unix()

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
        return None

    async def update(self, advisory: LiveAdvisory, **changes: object) -> bool:
        return True

    async def take_back(self, advisory: LiveAdvisory) -> bool:
        return True

    async def end(self, advisory: LiveAdvisory) -> tuple[EndState, SharedAdvisory | None]:
        return "ended", None

    async def end_expired(self, book: AdvisorBook, advisory: LiveAdvisory, now: float) -> str | None:
        """This replica's copy of a shared advisory expired: the outcome to settle it with (cancelled or wasted),
        or None when a turn claimed it (anywhere) or a signal on another replica extended it (back in `book`)."""
        state, record = await self.end(advisory)
        if state == "gone":
            log.info("advisory_claimed_elsewhere", advisory_id=advisory.id)
            return None
        if record is not None:
            advisory.stopped = record.stopped
        if state == "extended" and record is not None and book.live.get(advisory.session_id) is None:
            advisory.expires_at = record.expires_at - self.unix() + now
            book.add(advisory)
            return None
        return "cancelled" if advisory.stopped else "wasted"

    async def refresh_elsewhere(self, session_id: str, fire_in_s: float, ttl_s: float, now: float) -> Elsewhere | None:
        return None

    async def fire_elsewhere(self, session_id: str, fire_in_s: float, ttl_s: float, now: float) -> Elsewhere | None:
        return None

    async def stop_elsewhere(self, session_id: str, grace_s: float, now: float) -> Elsewhere | None:
        return None

    def awaits_fire_requests(self, book: AdvisorBook) -> bool:
        """Whether another replica could ask this one to fire an advisory (it holds a scheduled shared one)."""
        return False

    async def fire_requests(self) -> list[tuple[str, str]]:
        return []

    async def begin_turn(self, session_id: str) -> SharedTurn | None:
        return None

    def claim_into(
        self, book: AdvisorBook, session_id: str, record: SharedAdvisory | None, now: float
    ) -> tuple[LiveAdvisory | None, LiveAdvisory | None]:
        """Put the advisory a turn here claimed (`record`, None: none) in `book`, where `reservation` and
        `on_request` find it as if made here. Returns (to end, to cancel): a shared copy here that was not claimable
        (claimed by a turn on another replica, or replaced there), whose end the shared state decides; one made
        here while the shared state was down, which the shared one replaces."""
        local = book.live.get(session_id)
        to_end = to_cancel = None
        if local is not None and record is not None and local.id == record.id:
            local.shared = False  # claimed out of the shared state: this replica's alone now
            return None, None
        if local is not None and local.shared:
            # Not claimable: claimed by a turn on another replica, expired, or replaced there. Its end (the shared
            # state says which) settles it, or leaves it to the replica that claimed it.
            if record is None:
                local.expires_at = min(local.expires_at, now)  # the next tick ends it
            else:
                book.withdraw(session_id)
                to_end = local
        elif local is not None and record is not None:
            book.withdraw(session_id)  # made here while the shared state was down: the shared one wins
            to_cancel = local
        if record is not None:
            book.add(self.local(record, now))
        return to_end, to_cancel

    async def tier(self, session_id: str, tenant_id: str, kind: str) -> Tier | None:
        return None

    def settled(self, advisory: LiveAdvisory, outcome: str, lead_s: float | None, spawn: Spawn) -> None:
        return None

    @property
    def unflushed(self) -> bool:
        return False

    def count(self, counts: dict[str, float]) -> None:
        return None

    async def flush_counts(self) -> None:
        return None

    async def counters(self) -> dict[str, float] | None:
        return None


class SharedAdvisories(LocalAdvisories):
    """Replicas: live advisories, quality samples and statistics in the shared state every replica reads."""

    def __init__(self, state: SharedState, *, replica: str, unix: Callable[[], float], quality: HintQuality) -> None:
        super().__init__(unix=unix, quality=quality)
        self.state = state
        self.replica = replica
        # Statistics counted since the last tick, added to the replicas' shared counters at the next one.
        self._counts: dict[str, float] = {}

    async def put(self, advisory: LiveAdvisory, expires_at: float) -> None:
        """Share an advisory made here; marked `shared` once the shared state holds it."""
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
        if not advisory.shared:
            return True
        try:
            return await self.state.update_advisory(advisory.session_id, advisory.id, _KEEP_S, **changes)
        except SharedUnavailable:
            return True  # a turn on another replica judges the advisory by what it last found there

    async def take_back(self, advisory: LiveAdvisory) -> bool:
        """Remove a superseded advisory from the shared state before settling it here; False when a turn on
        another replica claimed it first (that replica settles it)."""
        if not advisory.shared:
            return True
        try:
            state, _ = await self.state.end_advisory(advisory.session_id, advisory.id, _FOREVER)
        except SharedUnavailable:
            return True
        return state != "gone"

    async def end(self, advisory: LiveAdvisory) -> tuple[EndState, SharedAdvisory | None]:
        """This replica's copy of a shared advisory expired: whether it ended (ended also while the shared state
        does not answer), was extended by a signal on another replica, or is gone (a turn claimed it)."""
        try:
            return await self.state.end_advisory(advisory.session_id, advisory.id, self.unix())
        except SharedUnavailable:
            return "ended", None

    async def refresh_elsewhere(self, session_id: str, fire_in_s: float, ttl_s: float, now: float) -> Elsewhere | None:
        """Extend the session's live advisory that another replica owns (debounce across replicas): it and its new
        expiry, in seconds from now. None when there is none (or the shared state is down)."""
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
        return Elsewhere(self.local(record, now), round(expires_at - unix, 3))

    async def fire_elsewhere(self, session_id: str, fire_in_s: float, ttl_s: float, now: float) -> Elsewhere | None:
        """A tool result for a session whose live advisory another replica owns: if it is scheduled, mark it and ask
        its owner to fire it now (atomic, once: the owner alone fires it, at its next tick); else extend it as
        `refresh_elsewhere` does. None when there is none (or the shared state is down)."""
        unix = self.unix()
        try:
            record = await self.state.request_fire(
                session_id, expires_at=unix + fire_in_s + ttl_s, now=unix, keep_s=_KEEP_S
            )
        except SharedUnavailable:
            return None
        if record is None:  # none, fired, or asked for already
            return await self.refresh_elsewhere(session_id, fire_in_s, ttl_s, now)
        log.info("advisory_fire_requested", advisory_id=record.id, owner=record.owner)
        return Elsewhere(self.local(record, now), round(record.expires_at - unix, 3), fire_requested=True)

    def awaits_fire_requests(self, book: AdvisorBook) -> bool:
        return any(a.shared and not a.fired for a in book.live.values())

    async def fire_requests(self) -> list[tuple[str, str]]:
        """The (session, advisory id) other replicas asked this one to fire since the last call; none while the
        shared state does not answer (those advisories then fire at their own time)."""
        try:
            return await self.state.fire_requests(self.replica)
        except SharedUnavailable:
            return []

    async def stop_elsewhere(self, session_id: str, grace_s: float, now: float) -> Elsewhere | None:
        """Typing stopped: end another replica's live advisory for the session after `grace_s`; it and its new
        expiry, in seconds from now. None when there is none (or the shared state is down)."""
        unix = self.unix()
        try:
            record = await self.state.get_advisory(session_id)
            if record is None or record.expires_at <= unix:
                return None
            expires_at = min(record.expires_at, unix + grace_s)
            await self.state.update_advisory(session_id, record.id, _KEEP_S, expires_at=expires_at, stopped=True)
        except SharedUnavailable:
            return None
        return Elsewhere(self.local(record, now), round(expires_at - unix, 3))

    async def begin_turn(self, session_id: str) -> SharedTurn | None:
        """Claim the session's shared advisory for a turn here, with its KV belief; None while the shared state
        does not answer (the book decides)."""
        try:
            return await self.state.begin_turn(session_id, self.unix())
        except SharedUnavailable:
            return None

    async def tier(self, session_id: str, tenant_id: str, kind: str) -> Tier | None:
        """The adaptive rule's tier by every replica's outcomes; None while they are not reachable."""
        keys = [f"{a}:{b}" for a, b in self.quality.keys(session_id, tenant_id, kind)]
        try:
            return self.quality.tier_of(await self.state.samples(keys), self.unix())
        except SharedUnavailable:
            return None

    def settled(self, advisory: LiveAdvisory, outcome: str, lead_s: float | None, spawn: Spawn) -> None:
        """An advisory was settled here: its outcome joins the shared samples, and the shared counters."""
        if outcome in ("used", "late", "wasted"):
            spawn(self.add_outcome(advisory, self.quality.is_wasted(advisory.kind, outcome)))
        self.count(AdvisoryStats.deltas(advisory.kind, outcome, lead_s=lead_s, bytes_loaded=advisory.bytes_loaded))

    async def add_outcome(self, advisory: LiveAdvisory, wasted: bool) -> None:
        keys = [f"{a}:{b}" for a, b in self.quality.keys(advisory.session_id, advisory.tenant_id, advisory.kind)]
        with contextlib.suppress(SharedUnavailable):
            await self.state.add_sample(
                keys, (self.unix(), wasted), max_len=self.quality.max_samples, ttl_s=self.quality.window_s
            )

    @property
    def unflushed(self) -> bool:
        return bool(self._counts)

    def count(self, counts: dict[str, float]) -> None:
        for name, by in counts.items():
            self._counts[name] = self._counts.get(name, 0) + by

    async def flush_counts(self) -> None:
        counts, self._counts = self._counts, {}
        if not counts:
            return
        with contextlib.suppress(SharedUnavailable):  # statistics: a batch lost to an outage is not retried
            await self.state.incr("advisories", counts)

    async def counters(self) -> dict[str, float] | None:
        """Every replica's statistics counters; None while the shared state does not answer."""
        try:
            counters = await self.state.counters("advisories")
        except SharedUnavailable:
            return None
        # This replica's counts not yet flushed belong in it too.
        for name, by in self._counts.items():
            counters[name] = counters.get(name, 0) + by
        return counters

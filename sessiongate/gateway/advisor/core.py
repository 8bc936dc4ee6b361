"""The advisor's bookkeeping, without I/O: live advisories, their reservations, and how each one ends.

One live advisory per session at most. Its life:

    signal ──► scheduled (fire_at in the future: a tool expected to end later)
           ──► retained (a short tool's KV kept where it is; a keep_then_offload's retain lapses back to scheduled)
           ──► fired (the prefetch was asked for; the reservation holds) ──► ready (the prefetch finished)
    then exactly one of:
      the session's next request    ──► claimed, settled after the turn as
                                         used    went to the advisory's worker, which had finished the prefetch,
                                                 and the turn's cache report shows KV found there (device or host)
                                         late    went there before the prefetch finished (or before it fired)
                                         wasted  went elsewhere, or found nothing
      expiry with no request        ──► wasted (cancelled, if typing had stopped)
    A request with no live advisory (after the session's first turn) is recorded as `missed`.

A second signal while one is live refreshes it (a later expiry; fired now if it was waiting) instead of
starting another prefetch: repeated typing events are debounced to one advisory. Unless the router would now send
the request elsewhere (the advisory's worker got busy since): then the live advisory is withdrawn, settled as
cancelled, and a new one goes to the router's choice. All times are seconds on the caller's monotonic clock, so
tests drive it with a fake one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sessiongate.gateway.routing import Reservation

__all__ = ["AdvisorBook", "Claim", "LiveAdvisory", "prefetch_residency", "settle"]


@dataclass(slots=True)
class LiveAdvisory:
    id: str
    session_id: str
    tenant_id: str
    kind: str
    worker_id: str
    target: str  # "device" | "host"
    created_at: float
    fire_at: float
    expires_at: float
    # When its request is expected (a tool's predicted return, an advise's `expected_in_s`); None: not known.
    expected_at: float | None = None
    fired: bool = False
    ready_at: float | None = None
    failed: bool = False
    stopped: bool = False
    prefetch_id: str | None = None
    worker_url: str | None = None
    tokens: int = 0
    bytes_loaded: int | None = None
    # Also in the replicas' shared state (gateway.shared), where a turn on any replica may claim it.
    shared: bool = False
    # "prefetch" brings the KV to `worker_id`; "retain" keeps it on the device there for `retain_s` (a short
    # tool's KV, see toolkv.py), and falls back to a prefetch when the worker holds none of it.
    action: str = "prefetch"
    retain_s: float = 0.0
    # keep_then_offload: when the retain lapses with no request, a prefetch is scheduled for this time (`lapse`).
    then_fire_at: float | None = None
    # Fired before its time by a tool result (here, or asked for on another replica): written with the fire.
    fired_early: bool = False
    # The prefetch's trace (tracing on: its span's context), which the turn that claims the advisory links to.
    trace: object | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A request met a live advisory; `provisional` is its outcome unless the cache report says otherwise."""

    advisory: LiveAdvisory
    provisional: str  # "used" (to be confirmed by the cache report) | "late" | "wasted"
    lead_s: float | None  # how long before the request the prefetch finished


def settle(claim: Claim, cache_details: Mapping[str, Any] | None) -> str:
    """The final outcome of a claimed advisory, once the turn's cache report is known."""
    if claim.provisional != "used":
        return claim.provisional
    details = cache_details or {}
    # Host counts for a device-target advisory too: the worker loads prefetched pages to the device only into free
    # pages and leaves the rest in its host tier, which the request still finds on that worker.
    found = sum(v for k in ("device", "host") if isinstance(v := details.get(k), int))
    return "used" if found > 0 else "wasted"


def prefetch_residency(*, tokens: int, target: str, on_device: int, in_host: int, unavailable: int) -> tuple[int, str]:
    """What a finished prefetch left on its worker, for the KV belief: (tokens, tier).

    The context's full pages are on the device, in host memory, or found nowhere (its tail, or pages missing from
    the pool); tokens are counted in proportion. Pages the device had no free room for stay in host memory, so
    the tier is "device" only when all of them reached it.
    """
    found = on_device + in_host
    pages = found + unavailable
    resident = round(tokens * found / pages) if pages else 0
    return resident, "device" if target == "device" and in_host == 0 else "host"


@dataclass(slots=True)
class AdvisorBook:
    ttl_s: float = 30.0
    stop_grace_s: float = 3.0
    live: dict[str, LiveAdvisory] = field(default_factory=dict)

    def get(self, session_id: str, now: float) -> LiveAdvisory | None:
        advisory = self.live.get(session_id)
        return advisory if advisory is not None and advisory.expires_at > now else None

    def reservation(self, session_id: str, now: float) -> Reservation | None:
        """What the router honours: a fired prefetch's worker, until it expires.

        A retain leaves none: its KV is already resident on that worker, which the router's score sees, so a
        reservation would only add a bias toward a home that may have got busier since (in the simulator it cost
        2-18% mean TTFT against kv_aware alone: docs/simulator.md, "Tool results posted before the turn").
        """
        advisory = self.get(session_id, now)
        if advisory is None or not advisory.fired or advisory.failed or advisory.action == "retain":
            return None
        landed = advisory.ready_at is not None and advisory.ready_at <= now
        return Reservation(worker_id=advisory.worker_id, expires_at=advisory.expires_at, landed=landed)

    def refresh(self, session_id: str, now: float, *, fire_in_s: float = 0.0) -> LiveAdvisory | None:
        """Debounce: extend a live advisory instead of starting another; None when there is none."""
        advisory = self.get(session_id, now)
        if advisory is None:
            return None
        advisory.stopped = False
        advisory.expires_at = max(advisory.expires_at, now + fire_in_s + self.ttl_s)
        if not advisory.fired:
            advisory.fire_at = min(advisory.fire_at, now + fire_in_s)
        return advisory

    def add(self, advisory: LiveAdvisory) -> None:
        self.live[advisory.session_id] = advisory

    def withdraw(self, session_id: str) -> LiveAdvisory | None:
        """Take the live advisory away before any request claimed it (a later signal chose another worker)."""
        return self.live.pop(session_id, None)

    def stop(self, session_id: str, now: float) -> LiveAdvisory | None:
        """Typing stopped: keep the advisory a short grace (the message may be on its way), then cancel it."""
        advisory = self.get(session_id, now)
        if advisory is None:
            return None
        advisory.stopped = True
        advisory.expires_at = min(advisory.expires_at, now + self.stop_grace_s)
        return advisory

    def claim(self, session_id: str, worker_id: str, now: float) -> Claim | None:
        """The session's request arrived and goes to `worker_id`; the live advisory (if any) is taken."""
        advisory = self.live.pop(session_id, None)
        if advisory is None or advisory.expires_at <= now:
            if advisory is not None:
                self.live[session_id] = advisory  # left for `expire` to settle as wasted
            return None
        if advisory.worker_id != worker_id or advisory.failed:
            return Claim(advisory, "wasted", None)
        if not advisory.fired or advisory.ready_at is None or advisory.ready_at > now:
            return Claim(advisory, "late", None)
        return Claim(advisory, "used", now - advisory.ready_at)

    def expire(self, now: float) -> list[LiveAdvisory]:
        """Advisories whose expiry passed with no request: removed and returned (to settle and cancel)."""
        gone = [a for a in self.live.values() if a.expires_at <= now]
        for advisory in gone:
            del self.live[advisory.session_id]
        return gone

    def due(self, now: float) -> list[LiveAdvisory]:
        """Scheduled advisories whose time to fire has come (marked fired)."""
        ready = [a for a in self.live.values() if not a.fired and a.fire_at <= now]
        for advisory in ready:
            advisory.fired = True
        return ready

    def lapse(self, now: float) -> list[LiveAdvisory]:
        """Retains of keep_then_offload advisories that lapsed with no request (their retain answered): each
        becomes a prefetch scheduled for its `then_fire_at`, not fired, holding no reservation; returned."""
        lapsed = [
            a
            for a in self.live.values()
            if a.then_fire_at is not None
            and a.fired
            and (a.ready_at is not None or a.failed)
            and a.created_at + a.retain_s <= now < a.expires_at
        ]
        for advisory in lapsed:
            assert advisory.then_fire_at is not None
            advisory.action, advisory.fire_at, advisory.then_fire_at = "prefetch", advisory.then_fire_at, None
            advisory.fired, advisory.ready_at, advisory.failed = False, None, False
            advisory.prefetch_id, advisory.bytes_loaded = None, None
        return lapsed

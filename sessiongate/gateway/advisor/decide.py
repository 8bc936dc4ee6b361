"""What the advisor does with one signal, without I/O: a signal and a snapshot of what is known in, actions out.

`decide(signal, known)` returns either a `Decision` (the actions, in order, and the reply for the signal's HTTP
answer) or a `Need`: the name of one answer it lacks that costs something to get. Those answers are the router's
choice (which advances a round-robin policy, so it is asked only when needed), the shared advisory another replica
owns (extended when found), the adaptive rule's tier (a shared-state read with replicas) and the session's home
worker. The advisor (`service.Advisor`) asks, puts the answer in the snapshot and calls `decide` again; once it has
a `Decision` it hands the actions to its executor (`executor.Executor`). No answer depends on what the actions
change (the book, the store), so all of them are gathered first. The cases, in the order they are tried:

- a tool call's decision meets a live advisory: that one is a stale hint's, cancelled (`CancelStale`);
- a scheduled advisory (not fired) meets a signal: dropped when a tool result would fire it too late to land
  (`DropScheduled`), else refreshed, and fired now if its time has come (`Retarget`, `FireDue`,
  `RecordEarlyFire`);
- a fired advisory meets a signal: refreshed (`Refresh`, `ShareExpiry`) while the router would still send the
  turn to its worker (it is offered as a reservation), else superseded (`Supersede`) by a new one;
- no live advisory here, but another replica's: refreshed there (the `elsewhere` answer); a tool result that can
  land also asks that replica, its owner, to fire it now if it is scheduled (the `fire_elsewhere` answer: the
  owner fires it at its next tick, `fire_requested` below, and records the early fire);
- otherwise a new advisory (`Create`) unless the signal is ignored (`Ignore`): a tool result that cannot land, a
  hint whose kind, session or tenant is mostly wasted, no routable worker.

Every signal is counted first (`CountSignal`). Times are seconds on the advisor's monotonic clock.
`fire_requested(live, advisory_id)` is the owner's side of a fire asked for on another replica: the same actions
as a scheduled advisory's early fire here, without the signal (that replica counted it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from sessiongate.gateway.routing import WorkerView

from .core import LiveAdvisory
from .quality import Tier
from .toolkv import ToolKVDecision

__all__ = [
    "UNASKED",
    "Action",
    "CancelStale",
    "CountSignal",
    "Create",
    "Decision",
    "DropScheduled",
    "Elsewhere",
    "FireDue",
    "Ignore",
    "Known",
    "Need",
    "RecordEarlyFire",
    "Refresh",
    "Reply",
    "Retarget",
    "ReturnedInRetain",
    "ShareExpiry",
    "Signal",
    "Supersede",
    "decide",
    "fire_requested",
    "timing",
]


class _Unasked(enum.Enum):
    UNASKED = "unasked"


UNASKED: Final = _Unasked.UNASKED

Need = Literal["choice_keeping", "elsewhere", "fire_elsewhere", "tier", "home", "choice"]


@dataclass(frozen=True, slots=True)
class Signal:
    session_id: str
    tenant_id: str
    kind: str
    expected_in_s: float | None = None
    # A tool call's plan (toolkv.py): what holds the KV and when the session is expected back.
    decision: ToolKVDecision | None = None
    # How long before `expected_in_s` its prefetch fires, when not the advisor's `lead_s` (a typing hint's timed
    # turn: the context's load time from the pool and a margin, as a tool's).
    lead_s: float | None = None


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """Another replica's live advisory for the session, extended by this signal; its new expiry from now; and
    whether its owner was asked to fire it now (it was scheduled: `fire_elsewhere`)."""

    advisory: LiveAdvisory
    expires_in_s: float
    fire_requested: bool = False


@dataclass(frozen=True, slots=True)
class Known:
    """What the decision reads. The first fields are read up front (memory only); the rest are asked for."""

    now: float
    lead_s: float  # a hint's prefetch fires this long before its expected request
    ttl_s: float  # an advisory lives this long past its expected request
    live: LiveAdvisory | None  # the session's live advisory in this replica's book
    lands: bool  # a prefetch fired now could land before the next turn (always True but for a tool result)
    # The router's choice with the live advisory's worker offered as a reservation (a failed one offers none).
    choice_keeping: WorkerView | _Unasked | None = UNASKED
    elsewhere: Elsewhere | _Unasked | None = UNASKED
    fire_elsewhere: Elsewhere | _Unasked | None = UNASKED  # `elsewhere`, its owner asked to fire it if scheduled
    tier: Tier | _Unasked = UNASKED
    home: WorkerView | _Unasked | None = UNASKED  # the routable worker that served the session last
    choice: WorkerView | _Unasked | None = UNASKED  # the router's choice now, no reservation offered

    def answered(self, need: Need, answer: Any) -> Known:
        """This snapshot with the answer to `need` (the advisor asks; a test supplies it)."""
        changes: dict[str, Any] = {need: answer}
        return replace(self, **changes)


# actions, performed in order by `executor.Executor.perform`


@dataclass(frozen=True, slots=True)
class CountSignal:
    kind: str


@dataclass(frozen=True, slots=True)
class CancelStale:
    """Withdraw a live advisory a tool call's decision supersedes; settled cancelled."""

    advisory: LiveAdvisory


@dataclass(frozen=True, slots=True)
class DropScheduled:
    """Withdraw a scheduled prefetch a tool result would fire too late to land; its turn is foreseen."""

    advisory: LiveAdvisory


@dataclass(frozen=True, slots=True)
class Refresh:
    """Debounce: a later expiry (and an earlier fire time if not fired) for the live advisory."""

    advisory: LiveAdvisory
    fire_in_s: float


@dataclass(frozen=True, slots=True)
class ShareExpiry:
    """Write a refreshed advisory's expiry to the shared state (no-op unless shared)."""

    advisory: LiveAdvisory


@dataclass(frozen=True, slots=True)
class Retarget:
    """Point a not yet fired advisory at the worker the router would pick now."""

    advisory: LiveAdvisory


@dataclass(frozen=True, slots=True)
class FireDue:
    """Fire every scheduled advisory whose time has come."""


@dataclass(frozen=True, slots=True)
class RecordEarlyFire:
    """Log and count the early fire once, and mark the advisory so its fire writes it to the shared state."""

    advisory: LiveAdvisory
    signal_kind: str
    requested_elsewhere: bool = False  # the signal came to another replica, which asked this one, the owner


@dataclass(frozen=True, slots=True)
class ReturnedInRetain:
    """A tool result while a keep_then_offload's retain holds: its long-kind prefetch is dropped."""

    advisory: LiveAdvisory


@dataclass(frozen=True, slots=True)
class Supersede:
    """The router would now send the turn elsewhere: withdraw the live advisory (cancelled unless claimed)."""

    advisory: LiveAdvisory
    now_worker: str


@dataclass(frozen=True, slots=True)
class Ignore:
    session_id: str
    kind: str
    reason: Literal["cannot_land", "hints_mostly_wasted", "no_routable_worker"]


@dataclass(frozen=True, slots=True)
class Create:
    """A new advisory at `worker`, into `tier`, firing in `fire_in_s`, living `ttl_s`."""

    signal: Signal
    worker: WorkerView
    tier: Tier
    fire_in_s: float
    ttl_s: float
    expected_in_s: float | None


Action = (
    CountSignal
    | CancelStale
    | DropScheduled
    | Refresh
    | ShareExpiry
    | Retarget
    | FireDue
    | RecordEarlyFire
    | ReturnedInRetain
    | Supersede
    | Ignore
    | Create
)


@dataclass(frozen=True, slots=True)
class Reply:
    """The signal's answer: `state` of `advisory` (None: of none), or "created" (the new one's fired / scheduled)."""

    state: str
    advisory: LiveAdvisory | None = None
    reason: str | None = None
    expires_in_s: float | None = None  # replaces the advisory's own


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    reply: Reply


def timing(signal: Signal, lead_s: float) -> tuple[float | None, float]:
    """(expected_in_s, fire_in_s): when the request is expected, and when its prefetch fires, from now."""
    decision = signal.decision
    if decision is None:
        lead_s = lead_s if signal.lead_s is None else signal.lead_s
        return signal.expected_in_s, max((signal.expected_in_s or 0.0) - lead_s, 0.0)
    # keep_then_offload: the retain now, its prefetch when the retain lapses (`AdvisorBook.lapse`).
    return decision.predicted_s, 0.0 if decision.action == "keep_then_offload" else decision.fire_in_s


def decide(signal: Signal, known: Known) -> Decision | Need:
    expected_in_s, fire_in_s = timing(signal, known.lead_s)
    now, live = known.now, known.live
    actions: list[Action] = [CountSignal(signal.kind)]
    if live is not None and signal.decision is not None:
        # The turn that just ended claimed its own advisory: a live one now is a stale hint's, and the tool call's
        # decision (what holds the KV, when it comes back) supersedes it.
        actions.append(CancelStale(live))
        live = None
    worker: WorkerView | None = None
    if live is not None and not live.fired:
        # A scheduled advisory (a long tool's prefetch) meets a new signal: a tool result before the predicted
        # return fires it now, at the worker the router picks now (unless it cannot land).
        if not known.lands and now + fire_in_s < live.fire_at:
            actions.append(DropScheduled(live))
            return Decision(tuple(actions), Reply("skipped", live, reason="cannot_land", expires_in_s=0.0))
        actions.append(Refresh(live, fire_in_s))
        if min(live.fire_at, now + fire_in_s) > now:  # its fire time once refreshed
            return Decision(tuple(actions), Reply("refreshed", live))
        actions += [Retarget(live), FireDue(), RecordEarlyFire(live, signal.kind)]
        return Decision(tuple(actions), Reply("fired", live))
    if live is not None:
        if signal.kind == "tool_result":
            actions.append(ReturnedInRetain(live))
        # Where would the request go now? The live advisory's worker is offered as a reservation, so a policy that
        # honours reservations keeps it while it is still a good choice (no thrashing between equals).
        if known.choice_keeping is UNASKED:
            return "choice_keeping"
        worker = known.choice_keeping
        if worker is None or worker.id == live.worker_id or not known.lands:
            actions += [Refresh(live, fire_in_s), ShareExpiry(live)]
            return Decision(tuple(actions), Reply("refreshed", live))
        # The load moved since the advisory was made: the request would not go to its worker any more.
        actions.append(Supersede(live, worker.id))
    else:
        # Another replica may own the session's live advisory: extend that one (debounce across replicas). A tool
        # result that can land also asks its owner to fire it now if it is scheduled: only the owner fires it (its
        # next tick: `fire_requested`), as the owner's book alone holds it (no two prefetches).
        need: Need = "fire_elsewhere" if signal.kind == "tool_result" and known.lands else "elsewhere"
        found = known.fire_elsewhere if need == "fire_elsewhere" else known.elsewhere
        if found is UNASKED:
            return need
        if found is not None:
            state = "fired" if found.fire_requested else "refreshed"
            return Decision(tuple(actions), Reply(state, found.advisory, expires_in_s=found.expires_in_s))
    if not known.lands:
        # A tool result of a tenant whose next turns follow their results too closely for a prefetch to land (the
        # SDK's flow: post the result, send the turn) starts no prefetch: it would only compete with that turn.
        actions.append(Ignore(signal.session_id, signal.kind, "cannot_land"))
        return Decision(tuple(actions), Reply("skipped", reason="cannot_land"))
    if known.tier is UNASKED:
        return "tier"
    if known.tier == "none":
        actions.append(Ignore(signal.session_id, signal.kind, "hints_mostly_wasted"))
        return Decision(tuple(actions), Reply("skipped", reason="hints_mostly_wasted"))
    if worker is None and signal.decision is not None and signal.decision.action != "offload":
        if known.home is UNASKED:  # a short tool: the KV stays where it is
            return "home"
        worker = known.home
    if worker is None:
        if known.choice is UNASKED:
            return "choice"
        worker = known.choice
    if worker is None:
        actions.append(Ignore(signal.session_id, signal.kind, "no_routable_worker"))
        return Decision(tuple(actions), Reply("skipped", reason="no_routable_worker"))
    ttl_s = known.ttl_s + (expected_in_s or 0.0)
    actions.append(Create(signal, worker, known.tier, fire_in_s, ttl_s, expected_in_s))
    return Decision(tuple(actions), Reply("created"))


def fire_requested(live: LiveAdvisory | None, advisory_id: str) -> tuple[Action, ...]:
    """Another replica asked this one, the owner of `advisory_id`, to fire it now (a tool result came there): as a
    scheduled advisory's early fire here (`decide`), with no signal to count (that replica counted it). Nothing
    when the session's live advisory is another one, none, or fired already (its time came first)."""
    if live is None or live.id != advisory_id or live.fired:
        return ()
    return (
        Refresh(live, 0.0),
        Retarget(live),
        FireDue(),
        RecordEarlyFire(live, "tool_result", requested_elsewhere=True),
    )

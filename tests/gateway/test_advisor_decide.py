"""The advisor's decision on one signal (advisor/decide.py), without I/O: one case per way it can end.

Each case gives the signal, the session's live advisory, whether a prefetch could land, and the answers the
decision may ask for; it checks which answers were asked (the router is asked only when needed: a round-robin
policy advances on every choice), the actions in order, and the reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from sessiongate.gateway.advisor.core import LiveAdvisory
from sessiongate.gateway.advisor.decide import (
    CancelStale,
    CountSignal,
    Create,
    Decision,
    DropScheduled,
    Elsewhere,
    FireDue,
    Ignore,
    Known,
    Need,
    RecordEarlyFire,
    Refresh,
    Reply,
    Retarget,
    ReturnedInRetain,
    ShareExpiry,
    Signal,
    Supersede,
    decide,
    fire_requested,
    timing,
)
from sessiongate.gateway.advisor.toolkv import ToolKVDecision
from sessiongate.gateway.routing import WorkerView

NOW = 100.0
A, B = WorkerView(id="a", url="http://a", in_flight=0), WorkerView(id="b", url="http://b", in_flight=0)
KEEP = ToolKVDecision("keep", 1.0, "tool", 0.2, 0.0, 2.5)
OFFLOAD = ToolKVDecision("offload", 30.0, "tool", 0.2, 29.3, 0.0)
SPLIT = ToolKVDecision("keep_then_offload", 30.0, "tool", 0.2, 29.3, 4.0, short_s=2.0, short_share=0.5)


def live(*, fired: bool = True, fire_at: float = NOW - 1, worker: str = "a", failed: bool = False) -> LiveAdvisory:
    return LiveAdvisory(
        id="adv_live",
        session_id="s",
        tenant_id="t",
        kind="typing",
        worker_id=worker,
        target="device",
        created_at=NOW - 5,
        fire_at=fire_at,
        expires_at=NOW + 20,
        fired=fired,
        failed=failed,
    )


# A scheduled advisory (a long tool's prefetch), to fire 20 s from now.
SCHEDULED = live(fired=False, fire_at=NOW + 20)
FIRED = live()
OTHER_REPLICAS = Elsewhere(live(worker="b"), 12.5)
# Another replica's scheduled advisory, which its owner was asked to fire now.
ASKED_ELSEWHERE = Elsewhere(live(fired=False, fire_at=NOW + 20, worker="b"), 30.0, fire_requested=True)


@dataclass
class Case:
    signal: Signal
    live: LiveAdvisory | None = None
    lands: bool = True
    answers: dict[str, Any] = field(default_factory=dict)


def run(case: Case) -> tuple[list[Need], Decision]:
    """Decide as the advisor does: answer what is asked until there is a decision; the questions asked, in order."""
    known = Known(now=NOW, lead_s=1.0, ttl_s=30.0, live=case.live, lands=case.lands)
    asked: list[Need] = []
    while not isinstance(step := decide(case.signal, known), Decision):
        assert step not in asked, f"{step} asked twice"
        asked.append(step)
        known = known.answered(step, case.answers[step])
    return asked, step


def typing(kind: str = "typing", expected_in_s: float | None = None) -> Signal:
    return Signal("s", "t", kind, expected_in_s)


def tool_call(decision: ToolKVDecision) -> Signal:
    return Signal("s", "t", "tool_call", decision=decision)


CASES: dict[str, tuple[Case, list[Need], list[object], Reply]] = {
    # no live advisory: a new one, or the signal ignored
    "new_at_the_routers_choice": (
        Case(typing(), answers={"elsewhere": None, "tier": "device", "choice": B}),
        ["elsewhere", "tier", "choice"],
        [CountSignal("typing"), Create(typing(), B, "device", 0.0, 30.0, None)],
        Reply("created"),
    ),
    "new_scheduled_by_its_expected_time": (
        Case(typing("explicit", 5.0), answers={"elsewhere": None, "tier": "host", "choice": A}),
        ["elsewhere", "tier", "choice"],
        [CountSignal("explicit"), Create(typing("explicit", 5.0), A, "host", 4.0, 35.0, 5.0)],
        Reply("created"),
    ),
    "refreshed_on_another_replica": (
        Case(typing(), answers={"elsewhere": OTHER_REPLICAS}),
        ["elsewhere"],
        [CountSignal("typing")],
        Reply("refreshed", OTHER_REPLICAS.advisory, expires_in_s=12.5),
    ),
    "tool_result_asks_the_owner_on_another_replica_to_fire_its_scheduled_advisory": (
        Case(typing("tool_result"), answers={"fire_elsewhere": ASKED_ELSEWHERE}),
        ["fire_elsewhere"],
        [CountSignal("tool_result")],
        Reply("fired", ASKED_ELSEWHERE.advisory, expires_in_s=30.0),
    ),
    "tool_result_refreshes_another_replicas_fired_advisory": (
        Case(typing("tool_result"), answers={"fire_elsewhere": OTHER_REPLICAS}),
        ["fire_elsewhere"],
        [CountSignal("tool_result")],
        Reply("refreshed", OTHER_REPLICAS.advisory, expires_in_s=12.5),
    ),
    "tool_result_that_cannot_land_is_ignored": (
        Case(typing("tool_result"), lands=False, answers={"elsewhere": None}),
        ["elsewhere"],
        [CountSignal("tool_result"), Ignore("s", "tool_result", "cannot_land")],
        Reply("skipped", reason="cannot_land"),
    ),
    "mostly_wasted_hints_are_ignored": (
        Case(typing(), answers={"elsewhere": None, "tier": "none"}),
        ["elsewhere", "tier"],
        [CountSignal("typing"), Ignore("s", "typing", "hints_mostly_wasted")],
        Reply("skipped", reason="hints_mostly_wasted"),
    ),
    "no_routable_worker": (
        Case(typing(), answers={"elsewhere": None, "tier": "device", "choice": None}),
        ["elsewhere", "tier", "choice"],
        [CountSignal("typing"), Ignore("s", "typing", "no_routable_worker")],
        Reply("skipped", reason="no_routable_worker"),
    ),
    # a tool call's plan
    "short_tool_keeps_the_kv_at_home": (
        Case(tool_call(KEEP), answers={"elsewhere": None, "tier": "device", "home": A}),
        ["elsewhere", "tier", "home"],
        [CountSignal("tool_call"), Create(tool_call(KEEP), A, "device", 0.0, 31.0, 1.0)],
        Reply("created"),
    ),
    "short_tool_without_a_home_goes_where_the_router_says": (
        Case(tool_call(KEEP), answers={"elsewhere": None, "tier": "device", "home": None, "choice": B}),
        ["elsewhere", "tier", "home", "choice"],
        [CountSignal("tool_call"), Create(tool_call(KEEP), B, "device", 0.0, 31.0, 1.0)],
        Reply("created"),
    ),
    "long_tool_schedules_a_prefetch_at_the_routers_choice": (
        Case(tool_call(OFFLOAD), answers={"elsewhere": None, "tier": "device", "choice": B}),
        ["elsewhere", "tier", "choice"],
        [CountSignal("tool_call"), Create(tool_call(OFFLOAD), B, "device", 29.3, 60.0, 30.0)],
        Reply("created"),
    ),
    "two_kinds_of_call_retain_now": (
        Case(tool_call(SPLIT), answers={"elsewhere": None, "tier": "device", "home": A}),
        ["elsewhere", "tier", "home"],
        [CountSignal("tool_call"), Create(tool_call(SPLIT), A, "device", 0.0, 60.0, 30.0)],
        Reply("created"),
    ),
    "a_tool_calls_plan_cancels_a_stale_hint": (
        Case(tool_call(OFFLOAD), live=FIRED, answers={"elsewhere": None, "tier": "device", "choice": B}),
        ["elsewhere", "tier", "choice"],
        [CountSignal("tool_call"), CancelStale(FIRED), Create(tool_call(OFFLOAD), B, "device", 29.3, 60.0, 30.0)],
        Reply("created"),
    ),
    # a scheduled advisory meets a signal
    "scheduled_is_refreshed": (
        Case(typing("explicit", 30.0), live=SCHEDULED),
        [],
        [CountSignal("explicit"), Refresh(SCHEDULED, 29.0)],
        Reply("refreshed", SCHEDULED),
    ),
    "scheduled_fires_early_at_a_tool_result": (
        Case(typing("tool_result"), live=SCHEDULED),
        [],
        [
            CountSignal("tool_result"),
            Refresh(SCHEDULED, 0.0),
            Retarget(SCHEDULED),
            FireDue(),
            RecordEarlyFire(SCHEDULED, "tool_result"),
        ],
        Reply("fired", SCHEDULED),
    ),
    "scheduled_is_dropped_when_its_early_fire_cannot_land": (
        Case(typing("tool_result"), live=SCHEDULED, lands=False),
        [],
        [CountSignal("tool_result"), DropScheduled(SCHEDULED)],
        Reply("skipped", SCHEDULED, reason="cannot_land", expires_in_s=0.0),
    ),
    # a fired advisory meets a signal
    "fired_is_refreshed_while_its_worker_is_still_the_choice": (
        Case(typing(), live=FIRED, answers={"choice_keeping": A}),
        ["choice_keeping"],
        [CountSignal("typing"), Refresh(FIRED, 0.0), ShareExpiry(FIRED)],
        Reply("refreshed", FIRED),
    ),
    "fired_is_refreshed_with_no_routable_worker": (
        Case(typing(), live=FIRED, answers={"choice_keeping": None}),
        ["choice_keeping"],
        [CountSignal("typing"), Refresh(FIRED, 0.0), ShareExpiry(FIRED)],
        Reply("refreshed", FIRED),
    ),
    "fired_retain_meets_its_tool_result": (
        Case(typing("tool_result"), live=FIRED, lands=False, answers={"choice_keeping": B}),
        ["choice_keeping"],
        [CountSignal("tool_result"), ReturnedInRetain(FIRED), Refresh(FIRED, 0.0), ShareExpiry(FIRED)],
        Reply("refreshed", FIRED),
    ),
    "fired_is_superseded_when_the_load_moved": (
        Case(typing(), live=FIRED, answers={"choice_keeping": B, "tier": "device"}),
        ["choice_keeping", "tier"],
        [CountSignal("typing"), Supersede(FIRED, "b"), Create(typing(), B, "device", 0.0, 30.0, None)],
        Reply("created"),
    ),
    "superseded_but_mostly_wasted": (
        Case(typing(), live=FIRED, answers={"choice_keeping": B, "tier": "none"}),
        ["choice_keeping", "tier"],
        [CountSignal("typing"), Supersede(FIRED, "b"), Ignore("s", "typing", "hints_mostly_wasted")],
        Reply("skipped", reason="hints_mostly_wasted"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_way_a_signal_ends(name: str) -> None:
    case, asked, actions, reply = CASES[name]
    got_asked, decision = run(case)
    assert got_asked == asked
    assert list(decision.actions) == actions
    assert decision.reply == reply


def test_timing_by_signal_and_plan() -> None:
    assert timing(typing(), lead_s=1.0) == (None, 0.0)
    assert timing(typing("explicit", 0.5), lead_s=1.0) == (0.5, 0.0)  # never before now
    assert timing(typing("explicit", 5.0), lead_s=1.0) == (5.0, 4.0)
    assert timing(tool_call(OFFLOAD), lead_s=1.0) == (30.0, 29.3)
    assert timing(tool_call(SPLIT), lead_s=1.0) == (30.0, 0.0)  # the retain now; its prefetch when it lapses


def test_deciding_changes_nothing_it_reads() -> None:
    advisory = live(fired=False, fire_at=NOW + 20)
    before = repr(advisory)
    _, decision = run(Case(typing("tool_result"), live=advisory))
    assert decision.reply.state == "fired"
    assert repr(advisory) == before  # the executor refreshes and fires it, not the decision


def test_the_owner_fires_early_what_another_replica_asked_for() -> None:
    scheduled = live(fired=False, fire_at=NOW + 20)
    assert fire_requested(scheduled, "adv_live") == (
        Refresh(scheduled, 0.0),
        Retarget(scheduled),
        FireDue(),
        RecordEarlyFire(scheduled, "tool_result", requested_elsewhere=True),
    )
    # Its time came first (fired), it was claimed or ended (none), or it was replaced (another id): nothing.
    assert fire_requested(live(), "adv_live") == ()
    assert fire_requested(None, "adv_live") == ()
    assert fire_requested(scheduled, "adv_other") == ()

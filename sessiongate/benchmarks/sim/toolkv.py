"""The advisor's tool-call KV lifecycle in the simulated cluster, wired as `Advisor.on_turn_end`, `plan_tool_kv`,
`on_tool_result`, `signal` (its decision: sessiongate/gateway/advisor/decide.py), `on_request` and `tick`
(sessiongate/gateway/advisor/service.py) wire it, with the gateway's own pure objects: `ToolLifecycle`
(tool_lifecycle.py: the recorded durations `ToolDurations`, the result gaps `ResultGaps`, `plan`,
`early_fire_lands`, `skipped_early`, `turn_began`; only its `retain`, the one worker call, is the simulated
worker's here), `ToolKVPolicy`, `AdvisorBook` (its `due` and `lapse`), `HintQuality` and
`AdvisoryStats` (whose `tool_kv` counts the plans and events).

- A turn ends and the session's next turn is a tool turn: `ToolLifecycle.plan` from the recorded samples (the
  trace's tools have no names: one tool name per trace) with the session's context (the KV belief's); the plan is
  counted, then signalled as a `tool_call`: a live advisory is withdrawn (cancelled), `HintQuality.tier` may skip.
- keep and keep_then_offload: the worker that served the session last (where its KV is); a retain advisory, fired
  at once: `SimWorker.retain` there for `retain_s` (the entry outranks unretained ones on that device until then,
  never pinned), ready at once, its reservation keeping the next request there within the policy's margin. If that
  worker holds none of the KV, a prefetch there instead (`retain_fallback`), as `ToolLifecycle.retain` falls back.
- keep_then_offload, the session not back when its retain lapses: `AdvisorBook.lapse` turns it into a prefetch
  scheduled for the long kind (`retain_lapsed`), holding no reservation until it fires.
- offload: nothing is retained; an advisory scheduled `fire_in_s` ahead.
- A scheduled advisory due (`tick`, run at each due or lapse time instead of every 50 ms): pointed at the policy's
  choice at that time (`Executor.retarget`) and fired (the cluster's prefetch path).
- Where the result comes from: a turn whose `result_gap_s` is None carries its tool's result in the request (a
  chat-completions client); the tool's duration is then recorded when that request arrives, as the store records
  it. (The gateway's advisor learns durations only from posted results, `Advisor.on_tool_result`; the simulator
  has always fed it the in-request ones too, and keeps doing so, so that the earlier figures stand.)
- A turn with a `result_gap_s`: the agent posted the result when its tool returned, that long before the request
  (`tool_result`, as `Advisor.on_tool_result` with the turn's one call, so its last): the duration is learnt, the
  time noted (`ToolLifecycle.result_posted`), and the result is signalled (`signal`, `advisor.decide.decide` for a
  `tool_result`): a scheduled prefetch fires now (`early`) if the tenant's learnt result gaps say it can land
  before the turn (`early_fire_lands`), else it is withdrawn (settled cancelled, `early_skipped`); a fired one is
  refreshed, or moved where the policy would now send the request; with none live, a prefetch at the policy's
  choice, or none when it cannot land (`early_skipped`). The next request teaches the gap
  (`ToolLifecycle.turn_began`) and, foreseen by a dropped prefetch, is not counted missed.
- The clients' hints of a tool_kv system take the same `signal` (a false hint is a `tool_result` signal).

Not modelled: several tool calls in one turn (the trace has one a round, so its result is the turn's last).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sessiongate.gateway.advisor.core import AdvisorBook, LiveAdvisory
from sessiongate.gateway.advisor.quality import HintQuality
from sessiongate.gateway.advisor.stats import AdvisoryStats
from sessiongate.gateway.advisor.tool_lifecycle import ToolLifecycle
from sessiongate.gateway.advisor.toolkv import ToolDurations, ToolKVPolicy
from sessiongate.gateway.routing import KVBelief, Reservation, RouteRequest, RoutingPolicy, WorkerView

from .engine import EventLoop, SimWorker

__all__ = ["TOOL_KV_EVENTS", "TOOL_NAME", "SimToolKV"]

TOOL_NAME = "swe_agent_tool"
# `Advisor.run`'s interval: how often the gateway looks for lapsed retains and due advisories.
TICK_S = 0.05
# What the lifecycle counts (`AdvisoryStats.tool_kv`): the plans, then what became of them.
TOOL_KV_EVENTS = ("keep", "offload", "keep_then_offload", "retain_fallback", "retain_lapsed", "early", "early_skipped")


class _Cluster(Protocol):
    """What of `cluster._Cluster` the lifecycle uses (a protocol, so the two modules import one way only)."""

    loop: EventLoop
    belief: KVBelief
    book: AdvisorBook
    quality: HintQuality
    stats: AdvisoryStats
    policy: RoutingPolicy
    by_id: dict[str, SimWorker]

    def _new_advisory(
        self,
        session_id: str,
        tenant_id: str,
        kind: str,
        worker: WorkerView,
        target: str,
        now: float,
        *,
        fire_at: float,
        expires_in_s: float = 0.0,
    ) -> LiveAdvisory: ...
    def _route_for_hint(self, session_id: str, now: float, reservation: Reservation | None) -> RouteRequest: ...
    def _views(self) -> Sequence[WorkerView]: ...
    def _fire(self, advisory: LiveAdvisory) -> None: ...
    def _retarget(self, advisory: LiveAdvisory) -> None: ...
    def _settle(self, advisory: LiveAdvisory, outcome: str, lead_s: float | None) -> None: ...
    def _expire(self, _: Any) -> None: ...


class SimToolKV:
    def __init__(self, cluster: _Cluster, policy: ToolKVPolicy) -> None:
        self.cluster = cluster
        self.policy = policy
        self.lifecycle = ToolLifecycle(policy=policy, stats=cluster.stats)
        self.results_posted = 0

    @property
    def durations(self) -> ToolDurations:
        return self.lifecycle.durations

    @property
    def decisions(self) -> dict[str, int]:
        """The plans and events counted so far, every one of `TOOL_KV_EVENTS` present."""
        counted = self.cluster.stats.tool_kv
        return {event: counted.get(event, 0) for event in TOOL_KV_EVENTS}

    def tool_returned(self, tenant_id: str, seconds: float) -> None:
        """A tool's result came inside the session's next request: its duration, as the store records it."""
        self.lifecycle.durations.record(tenant_id, TOOL_NAME, seconds)

    def tool_result(self, session_id: str, tenant_id: str, seconds: float) -> str:
        """`Advisor.on_tool_result`: a result posted when its tool returned, `seconds` after the call; the state the
        signal answers ("fired", "refreshed", "scheduled" or "skipped")."""
        self.results_posted += 1
        self.lifecycle.durations.record(tenant_id, TOOL_NAME, seconds)
        self.lifecycle.result_posted(session_id, tenant_id, self.cluster.loop.now)
        return self.signal(session_id, tenant_id, "tool_result")

    def turn_began(self, session_id: str) -> bool:
        """`Advisor.on_request`'s first step: learn the result gap; True when a dropped early prefetch foresaw it."""
        return self.lifecycle.turn_began(session_id, self.cluster.loop.now)

    def signal(self, session_id: str, tenant_id: str, kind: str) -> str:
        """`advisor.decide.decide` with no decision (a tool result or a client's hint: fire now), one replica;
        returns the state its answer names."""
        c = self.cluster
        now = c.loop.now
        c.stats.signal(kind)
        fire_in_s = 0.0  # no expected time: `max(0 - lead_s, 0)`
        live = c.book.get(session_id, now)
        lands = kind != "tool_result" or self.lifecycle.early_fire_lands(tenant_id, c.belief.context_tokens(session_id))
        if live is not None and not live.fired:
            if not lands and now + fire_in_s < live.fire_at:  # `DropScheduled`
                c.book.withdraw(session_id)
                self.lifecycle.skipped_early(session_id)
                c._settle(live, "cancelled", None)
                return "skipped"
            c.book.refresh(session_id, now, fire_in_s=fire_in_s)
            c.loop.at(live.expires_at, c._expire)
            if live.fire_at > now:
                return "refreshed"
            self.cluster._retarget(live)
            for due in c.book.due(now):
                c._fire(due)
            c.stats.tool_kv_event("early")
            return "fired"
        worker: WorkerView | None = None
        if live is not None:
            if kind == "tool_result":
                self.lifecycle.returned_in_retain(live)
            keep = None if live.failed else Reservation(worker_id=live.worker_id, expires_at=live.expires_at)
            worker = c.policy.choose(c._route_for_hint(session_id, now, keep), c._views())
            if worker.id == live.worker_id or not lands:
                c.book.refresh(session_id, now, fire_in_s=fire_in_s)
                c.loop.at(live.expires_at, c._expire)
                return "refreshed"
            c.book.withdraw(session_id)  # the load moved: the request would not go there any more
            c._settle(live, "cancelled", None)
        if not lands:
            self.lifecycle.skipped_early(session_id)
            return "skipped"
        tier = c.quality.tier(session_id, tenant_id, kind, now)
        if tier == "none":
            c.stats.skipped(kind)
            return "skipped"
        worker = worker or c.policy.choose(c._route_for_hint(session_id, now, None), c._views())
        advisory = c._new_advisory(session_id, tenant_id, kind, worker, tier, now, fire_at=now + fire_in_s)
        c.book.add(advisory)
        for due in c.book.due(now):
            c._fire(due)
        c.loop.at(advisory.expires_at, c._expire)
        return "fired" if advisory.fired else "scheduled"

    def on_tool_call(self, session_id: str, tenant_id: str) -> None:
        """`Advisor.on_turn_end` with tool names: `plan_tool_kv`, then `signal` with the decision."""
        c = self.cluster
        now = c.loop.now
        decision = self.lifecycle.plan(tenant_id, [TOOL_NAME], c.belief.context_tokens(session_id))
        c.stats.signal("tool_call")
        # keep_then_offload: the retain now, its prefetch when the retain lapses.
        fire_in_s = 0.0 if decision.action == "keep_then_offload" else decision.fire_in_s
        live = c.book.get(session_id, now)
        if live is not None:  # a stale hint's advisory: superseded by what the gateway now knows
            c.book.withdraw(session_id)
            c._settle(live, "cancelled", None)
        tier = c.quality.tier(session_id, tenant_id, "tool_call", now)
        if tier == "none":
            c.stats.skipped("tool_call")
            return
        worker: WorkerView | None = None
        home = c.belief.residency(session_id, now).last_worker
        if decision.action != "offload" and home is not None:
            worker = c.by_id[home].view()  # the KV stays where it is
        worker = worker or c.policy.choose(c._route_for_hint(session_id, now, None), c._views())
        advisory = c._new_advisory(
            session_id,
            tenant_id,
            "tool_call",
            worker,
            tier,
            now,
            fire_at=now + fire_in_s,
            expires_in_s=decision.predicted_s,
        )
        if decision.action != "offload":
            advisory.action, advisory.retain_s = "retain", decision.retain_s
            if decision.action == "keep_then_offload":
                advisory.then_fire_at = now + decision.fire_in_s
                c.loop.at(now + decision.retain_s, self._until_lapsed, advisory)
        c.book.add(advisory)
        c.loop.at(advisory.expires_at, c._expire)
        for due in c.book.due(now):
            c._fire(due)
        if not advisory.fired:
            c.loop.at(advisory.fire_at, self.tick)

    def tick(self, _: object = None) -> None:
        """`Advisor.tick`'s lapse and due steps (expiries are the cluster's own events)."""
        c = self.cluster
        now = c.loop.now
        for advisory in c.book.lapse(now):
            c.stats.tool_kv_event("retain_lapsed")
            c.loop.at(advisory.fire_at, self.tick)
        for advisory in c.book.due(now):
            if advisory.fire_at > advisory.created_at:  # scheduled for later: the router's choice may have changed
                self.cluster._retarget(advisory)
            c._fire(advisory)

    def _until_lapsed(self, advisory: LiveAdvisory) -> None:
        """A tick when a retain lapses, then every `TICK_S` until it has: a retain that fell back to a prefetch
        lapses only once that prefetch has finished or failed."""
        c = self.cluster
        if c.book.live.get(advisory.session_id) is not advisory or advisory.then_fire_at is None:
            return  # claimed, withdrawn, expired or lapsed already
        self.tick()
        if advisory.then_fire_at is not None:
            c.loop.at(c.loop.now + TICK_S, self._until_lapsed, advisory)

    def retain(self, advisory: LiveAdvisory) -> bool:
        """`ToolLifecycle.retain`: keep the KV on the device where it is; False when that worker holds none of it (the
        advisory is then a prefetch there)."""
        c = self.cluster
        now = c.loop.now
        device, host = c.by_id[advisory.worker_id].retain(advisory.session_id, now + advisory.retain_s)
        advisory.tokens = device + host
        if device + host == 0:
            c.stats.tool_kv_event("retain_fallback")
            advisory.action = "prefetch"
            return False
        advisory.ready_at = now
        advisory.bytes_loaded = 0
        return True

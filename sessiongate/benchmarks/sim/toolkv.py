"""The advisor's tool-call KV lifecycle in the simulated cluster, wired as `Advisor.on_turn_end`, `plan_tool_kv`,
`_signal` and `tick` (sessiongate/gateway/advisor/service.py) and `ToolLifecycle.retain` (tool_lifecycle.py there)
wire it, with the gateway's own pure objects: `ToolDurations` (the durations the store records, per tenant and
tool), `ToolKVPolicy.plan`, `AdvisorBook` (its `due` and `lapse`), `HintQuality` and `AdvisoryStats` (whose
`tool_kv` counts the plans and events).

- A turn ends and the session's next turn is a tool turn: `ToolKVPolicy.plan` from the recorded samples (the
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
  choice at that time (`Advisor._retarget`) and fired (the cluster's prefetch path).
- Each tool's real duration is recorded when its result comes back (the next request), as the store records it.

Not modelled: tool results posted before the next turn (`Advisor.on_tool_result`). The simulated client sends the
result inside its next request, as a chat-completions client does, so no result gap is ever learnt and the
early-result skip (`ResultGaps`, `early_skipped`) has nothing to act on. Nor does the cluster's hint path fire a
scheduled advisory early (`Advisor._signal`'s first branch): a false hint is anchored where no request follows
within lead + ttl (41 s), which in the long-agent workload (tools of 12 s at most) is after a session's last turn,
where no tool-call advisory is live.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sessiongate.gateway.advisor.core import AdvisorBook, LiveAdvisory
from sessiongate.gateway.advisor.quality import HintQuality
from sessiongate.gateway.advisor.stats import AdvisoryStats
from sessiongate.gateway.advisor.toolkv import ToolDurations, ToolKVPolicy
from sessiongate.gateway.routing import KVBelief, Reservation, RouteRequest, RoutingPolicy, WorkerView

from .engine import EventLoop, SimWorker

__all__ = ["TOOL_KV_EVENTS", "TOOL_NAME", "SimToolKV"]

TOOL_NAME = "swe_agent_tool"
# What the lifecycle counts (`AdvisoryStats.tool_kv`): the plans, then what became of them.
# `Advisor.run`'s interval: how often the gateway looks for lapsed retains and due advisories.
TICK_S = 0.05
TOOL_KV_EVENTS = ("keep", "offload", "keep_then_offload", "retain_fallback", "retain_lapsed", "early_skipped")


class _Cluster(Protocol):
    """What of `cluster._Cluster` the lifecycle uses (a protocol, so the two modules import one way only)."""

    loop: EventLoop
    belief: KVBelief
    book: AdvisorBook
    quality: HintQuality
    stats: AdvisoryStats
    policy: RoutingPolicy
    by_id: dict[str, SimWorker]
    _advisory_ids: int

    def _route_for_hint(self, session_id: str, now: float, reservation: Reservation | None) -> RouteRequest: ...
    def _views(self) -> Sequence[WorkerView]: ...
    def _fire(self, advisory: LiveAdvisory) -> None: ...
    def _settle(self, advisory: LiveAdvisory, outcome: str, lead_s: float | None) -> None: ...
    def _expire(self, _: Any) -> None: ...


class SimToolKV:
    def __init__(self, cluster: _Cluster, policy: ToolKVPolicy) -> None:
        self.cluster = cluster
        self.policy = policy
        self.durations = ToolDurations()

    @property
    def decisions(self) -> dict[str, int]:
        """The plans and events counted so far, every one of `TOOL_KV_EVENTS` present."""
        counted = self.cluster.stats.tool_kv
        return {event: counted.get(event, 0) for event in TOOL_KV_EVENTS}

    def tool_returned(self, tenant_id: str, seconds: float) -> None:
        self.durations.record(tenant_id, TOOL_NAME, seconds)

    def on_tool_call(self, session_id: str, tenant_id: str) -> None:
        """`Advisor.on_turn_end` with tool names: `plan_tool_kv`, then `_signal` with the decision."""
        c = self.cluster
        now = c.loop.now
        decision = self.policy.plan(self.durations, tenant_id, [TOOL_NAME], c.belief.context_tokens(session_id))
        c.stats.tool_kv_event(decision.action)
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
        c._advisory_ids += 1
        advisory = LiveAdvisory(
            id=f"adv-{c._advisory_ids}",
            session_id=session_id,
            tenant_id=tenant_id,
            kind="tool_call",
            worker_id=worker.id,
            worker_url=worker.url,
            target=tier,
            created_at=now,
            fire_at=now + fire_in_s,
            expires_at=now + c.book.ttl_s + decision.predicted_s,
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
                worker = c.policy.choose(c._route_for_hint(advisory.session_id, now, None), c._views())
                advisory.worker_id, advisory.worker_url = worker.id, worker.url
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

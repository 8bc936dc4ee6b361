"""The advisor's tool-call KV lifecycle in the simulated cluster, wired as `Advisor.on_turn_end`, `_signal`,
`tick` and `_retain` wire it (sessiongate/gateway/advisor/service.py), with the gateway's own pure objects:
`ToolDurations`
(the durations the store records, per tenant and tool), `ToolKVPolicy.decide`, `AdvisorBook`, `HintQuality`.

- A turn ends and the session's next turn is a tool turn: `ToolKVPolicy.predict` (the trace's tools have no names:
  one tool name per trace) and `decide` with the session's context (the KV belief's).
- keep: the worker that served the session last (where its KV is); `SimWorker.retain` there for `retain_s`
  (the entry outranks unretained ones on that device until then, never pinned); a live advisory, ready at once,
  whose reservation keeps the next request there within the policy's margin. If that worker holds none of the
  KV, a device prefetch there instead, as `Advisor._retain` falls back.
- offload: nothing is retained; an advisory scheduled `fire_in_s` ahead; when it is due, pointed at the policy's
  choice at that time (`Advisor._retarget`) and fired (the cluster's prefetch path).
- Each tool's real duration is recorded when its result comes back (the next request), as the store records it.
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

__all__ = ["TOOL_NAME", "SimToolKV"]

TOOL_NAME = "swe_agent_tool"


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
        self.decisions = {"keep": 0, "offload": 0, "retain_fallback": 0}

    def tool_returned(self, tenant_id: str, seconds: float) -> None:
        self.durations.record(tenant_id, TOOL_NAME, seconds)

    def on_tool_call(self, session_id: str, tenant_id: str) -> None:
        c = self.cluster
        now = c.loop.now
        predicted_s, source = self.policy.predict(self.durations, tenant_id, [TOOL_NAME])
        decision = self.policy.decide(predicted_s, c.belief.context_tokens(session_id), source=source)
        self.decisions[decision.action] += 1
        live = c.book.withdraw(session_id)
        if live is not None:  # a stale hint's advisory: superseded by what the gateway now knows
            c._settle(live, "cancelled", None)
        if c.quality.tier(session_id, tenant_id, "tool_call", now) == "none":
            c.stats.skipped("tool_call")
            return
        home = c.belief.residency(session_id, now).last_worker
        if decision.action == "keep" and home is not None:
            worker = c.by_id[home].view()  # a short tool: the KV stays where it is
        else:
            worker = c.policy.choose(c._route_for_hint(session_id, now, None), c._views())
        c._advisory_ids += 1
        advisory = LiveAdvisory(
            id=f"adv-{c._advisory_ids}",
            session_id=session_id,
            tenant_id=tenant_id,
            kind="tool_call",
            worker_id=worker.id,
            worker_url=worker.url,
            target="device",
            created_at=now,
            fire_at=now + decision.fire_in_s,
            expires_at=now + c.book.ttl_s + predicted_s,
        )
        c.book.add(advisory)
        c.loop.at(advisory.expires_at, c._expire)
        if decision.action == "keep":
            advisory.fired = True
            device, host = c.by_id[worker.id].retain(session_id, now + decision.retain_s)
            if device + host > 0:
                advisory.ready_at = now
                advisory.bytes_loaded = 0
                return
            self.decisions["retain_fallback"] += 1
            c._fire(advisory)
            return
        c.loop.at(advisory.fire_at, self._due, advisory)

    def _due(self, advisory: LiveAdvisory) -> None:
        c = self.cluster
        if c.book.live.get(advisory.session_id) is not advisory or advisory.fired:
            return  # claimed, withdrawn or expired first
        worker = c.policy.choose(c._route_for_hint(advisory.session_id, c.loop.now, None), c._views())
        advisory.worker_id, advisory.worker_url = worker.id, worker.url
        advisory.fired = True
        c._fire(advisory)

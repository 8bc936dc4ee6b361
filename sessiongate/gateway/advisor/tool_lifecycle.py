"""The advisor's side of the tool-call KV lifecycle (toolkv.py's plans, applied): what it learns and remembers
between a turn's tool calls and the session's next turn, and the retain that keeps a short tool's KV where it is.

`Advisor` owns one `ToolLifecycle` and calls it at these points:

- a turn ends with tool calls: `plan` (keep, offload or keep_then_offload, from the recorded durations), counted;
- the advisory made from that plan: `apply` (a keep or keep_then_offload advisory is a retain first);
- that advisory fires as a retain: `retain`, the one worker call here (a fallback to a prefetch when the worker
  holds none of the KV);
- a tool result is posted: `durations` learns the call's time, `result_posted` notes when, and `early_fire_lands`
  says whether a prefetch fired now could land before the next turn (else `skipped_early`); a keep_then_offload
  advisory still retaining drops its long-kind prefetch (`returned_in_retain`);
- the session's next turn: `turn_began` learns the result-to-turn gap (`result_gaps`) and says whether the turn
  was foreseen by a dropped early prefetch (then it is not counted missed).

The advisories themselves (the book, the shared state, settling) stay the advisor's: this object only reads a
decision into a `LiveAdvisory` or retains one. Everything but `retain` is pure, so the simulator
(sessiongate/benchmarks/sim/toolkv.py) drives this same object, with no extension client, retaining on its own
simulated workers. All of it is soft state, lost at restart and relearnt from the next
tool calls; times are seconds on the advisor's clock, passed in (tests swap that clock on a running advisor).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from sessiongate.gateway.workers.extension import ExtensionClient
from sessiongate.sglang_ext.protocol import SessionKVRequest

from .core import LiveAdvisory
from .stats import AdvisoryStats
from .toolkv import ResultGaps, ToolDurations, ToolKVDecision, ToolKVPolicy

__all__ = ["ToolLifecycle"]

log = structlog.get_logger(__name__)

# Sessions remembered between a tool result (or a dropped early prefetch) and their next turn, at most.
_MAX_PENDING = 100_000


def _remember(pending: OrderedDict[str, Any], session_id: str, value: Any) -> None:
    pending[session_id] = value
    pending.move_to_end(session_id)
    while len(pending) > _MAX_PENDING:  # soft state: the oldest go first
        pending.popitem(last=False)


class ToolLifecycle:
    def __init__(
        self,
        *,
        policy: ToolKVPolicy,
        stats: AdvisoryStats,
        extension: ExtensionClient | None = None,
        cache_salt_for: Callable[[str], str] | None = None,
    ) -> None:
        self.policy = policy
        self.stats = stats
        self.extension = extension
        self.cache_salt_for = cache_salt_for
        self.durations = ToolDurations()
        self.result_gaps = ResultGaps()
        # When each session's last tool result was signalled (tenant, clock), until its next turn: `result_gaps`
        # learns the gaps. And the sessions whose scheduled prefetch a tool result dropped (`skipped_early`):
        # their next turn was foreseen, not missed.
        self._result_at: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._early_skipped: OrderedDict[str, bool] = OrderedDict()

    def plan(self, tenant_id: str, tool_names: Sequence[str], context_tokens: int) -> ToolKVDecision:
        """Keep the session's KV on the device through its tools, or let it go and prefetch it back (toolkv.py)."""
        decision = self.policy.plan(self.durations, tenant_id, tool_names, context_tokens)
        self.stats.tool_kv_event(decision.action)
        return decision

    @staticmethod
    def apply(decision: ToolKVDecision, advisory: LiveAdvisory, now: float) -> None:
        """Make a new advisory what the decision asks: a keep's is a retain; a keep_then_offload's is a retain whose
        prefetch waits for the retain to lapse (`AdvisorBook.lapse`); an offload's stays a scheduled prefetch."""
        if decision.action == "offload":
            return
        advisory.action, advisory.retain_s = "retain", decision.retain_s
        if decision.action == "keep_then_offload":
            advisory.then_fire_at = now + decision.fire_in_s

    async def retain(
        self, advisory: LiveAdvisory, context: list[dict[str, Any]], tools: list[dict[str, Any]] | None, priority: int
    ) -> bool:
        """Keep a short tool's KV on the device where it is; False when that worker holds none of it (the advisory
        is then a prefetch there)."""
        if self.extension is None:
            raise RuntimeError("ToolLifecycle.retain needs an extension client (the simulator retains on its own)")
        request = SessionKVRequest(
            messages=context,
            tools=tools,
            priority=priority + self.policy.retain_priority_boost,
            ttl_ms=max(int(advisory.retain_s * 1000), 1),
            cache_salt=self.cache_salt_for(advisory.tenant_id) if self.cache_salt_for else None,
        )
        result = await self.extension.session_kv(
            advisory.worker_id, advisory.worker_url or "", advisory.session_id, "retain", request
        )
        advisory.tokens = result.tokens
        if result.device_tokens + result.host_tokens == 0:
            log.info("retain_found_nothing", advisory_id=advisory.id, worker=advisory.worker_id)
            self.stats.tool_kv_event("retain_fallback")
            advisory.action = "prefetch"
            return False
        return True

    def returned_in_retain(self, advisory: LiveAdvisory) -> None:
        """A tool result for a fired advisory: if it is keep_then_offload's retain, still holding the KV on its
        device, the prefetch planned for the long kind's return would come after the tool has returned (a posted
        result teaches the tool's time, not the time to the turn), so it is dropped: the turn uses the retain."""
        if advisory.then_fire_at is not None:
            advisory.then_fire_at = None
            self.stats.tool_kv_event("returned_in_retain")

    def result_posted(self, session_id: str, tenant_id: str, now: float) -> None:
        """A tool result was signalled: the gap to the session's next turn is learnt when that turn arrives."""
        _remember(self._result_at, session_id, (tenant_id, now))

    def early_fire_lands(self, tenant_id: str, context_tokens: int) -> bool:
        """Whether a prefetch fired at this tenant's tool result can land before the next turn (True while its
        result gaps are unknown)."""
        return self.policy.early_fire_lands(self.result_gaps.median(tenant_id), context_tokens)

    def skipped_early(self, session_id: str) -> None:
        """A tool result of this session started no prefetch: counted, and its next turn is foreseen, not missed."""
        self.stats.tool_kv_event("early_skipped")
        _remember(self._early_skipped, session_id, True)

    def turn_began(self, session_id: str, now: float) -> bool:
        """The session's next turn arrived: learn its result gap; True when a dropped early prefetch foresaw it."""
        if (result := self._result_at.pop(session_id, None)) is not None:
            self.result_gaps.record(result[0], now - result[1])
        return self._early_skipped.pop(session_id, False)

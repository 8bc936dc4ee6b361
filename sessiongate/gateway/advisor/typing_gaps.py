"""When a typing hint's prefetch fires, if not at once: just before the turn usually comes, learnt per tenant.

SYMPHONY's typing hint comes seconds before the turn (11.3 s on its chat trace). A prefetch fired at once holds
its pages for all that time, and under memory pressure the live hints of many sessions at once may not fit, and a
worker chosen seconds ahead may no longer be the router's choice when the turn comes. So, when timed
(`advisory_typing_timed`), the gateway learns per tenant how long after a session's first typing signal its turn
arrives (the newest gaps, as `ResultGaps` learns tool results'), apart for signals that came with the session's
last answer (its turn is a think time away) and those that came later (a typing time away); a typing signal
expects its turn at a low quantile of its kind's gaps (`quantile`: most turns come later), the advisor fires the
prefetch the context's load time and a margin before that, as it does a tool's, and the worker ranks its pages by
it (Belady's order among live hints). Until a tenant has `ResultGaps.min_samples` gaps of the kind, typing
prefetches fire at once.

Off by default: on the simulated H100 chat workload it cost p99 TTFT at 96 users on three seeds of three (a
prefetch fired close to its turn queues behind other loads on the pool link and is late), and on the real CPU
replay it did not beat kv_aware (docs/simulator.md, docs/benchmarks.md).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .toolkv import ResultGaps

__all__ = ["TypingGaps"]

_MAX_PENDING = 100_000
# A typing signal this soon after the session's last answer ended came with the answer (a client that signals as
# its user starts reading, or one whose user types at once): its turn is a think time away, not a typing time.
WITH_ANSWER_S = 1.0


class TypingGaps:
    def __init__(self, quantile: float = 0.25) -> None:
        self.quantile = quantile
        self.gaps = ResultGaps(max_samples=50)
        # Sessions whose user started typing since their last turn: (the gaps' key, when the first signal came).
        self._started: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # When each session's last turn ended (soft state, the oldest forgotten first).
        self._ended: OrderedDict[str, float] = OrderedDict()

    def started(self, session_id: str, tenant_id: str, now: float) -> float | None:
        """A typing signal: the seconds until the turn is expected (None: not learnt yet). Repeated signals
        before the turn keep the first one's time, so a refresh never pushes the expected turn later.

        The gaps are learnt apart for signals that came with the last answer's end and for the others: mixed, a
        low quantile is the first kind's (a think time) and fires the second kind's prefetches most of a typing
        time early, a high one fires the first kind's late."""
        first = self._started.get(session_id)
        if first is None:
            ended = self._ended.get(session_id)
            with_answer = ended is not None and now - ended <= WITH_ANSWER_S
            first = (f"{tenant_id}\x00{'answer' if with_answer else 'later'}", now)
            _put(self._started, session_id, first)
        gap = self.gaps.quantile(first[0], self.quantile)
        return None if gap is None else max(first[1] + gap - now, 0.0)

    def turn_began(self, session_id: str, now: float) -> None:
        """The session's turn arrived: learn how long after its first typing signal."""
        if (first := self._started.pop(session_id, None)) is not None:
            self.gaps.record(first[0], now - first[1])

    def turn_ended(self, session_id: str, now: float) -> None:
        _put(self._ended, session_id, now)


def _put(entries: OrderedDict[str, Any], key: str, value: Any) -> None:
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > _MAX_PENDING:  # soft state: the oldest go first
        entries.popitem(last=False)

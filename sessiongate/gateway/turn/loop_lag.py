"""Keep the event loop answering under overload: the fair queue's active limit follows the loop's lag.

At saturation the gateway's one event loop is what runs out, not the workers: every callback that is ready runs
before a new request is even parsed, so a turn the fair queue refuses at once was still answered late (182 ms at
the median, 8.5 s at p99, 1,000 sessions with no think time: benchmarks/results/issue33/). A limit on turns in
their active phase fixed at 128 per worker cannot see that: the loop saturates long before the workers do.

`LoopLagLimiter` wakes every `interval_s` and measures how late it woke (the loop's lag). While the lag (a short
moving average) is past `target_s` it lowers the fair queue's active limit by a tenth; while it is under the target
and the limit is in use with turns waiting, it raises it by a twentieth (at least one). The turns held back wait in
the fair queue, which costs the loop nothing, and the queue's predicted wait grows as the limit shrinks, so the
turns past the wait bound are shed at once by a loop that still has time to answer them. The limit stays between
`floor` and the configured maximum; with `target_s` 0 there is no limiter and the maximum holds.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

__all__ = ["ActiveLimit", "LoopLagLimiter"]

# Weight of the newest tick in the lag's moving average: a few ticks, so one long callback (a collection, a big
# JSON body) moves it less than a lag that lasts.
_LAG_WEIGHT = 0.3
_DECREASE = 0.9
_INCREASE = 0.05


class ActiveLimit(Protocol):
    """What the limiter steers (`FairAdmission`)."""

    active: int
    waiting: int

    @property
    def limit(self) -> int: ...

    def set_limit(self, limit: int) -> None: ...


class LoopLagLimiter:
    def __init__(
        self, admission: ActiveLimit, *, target_s: float, ceiling: int, floor: int, interval_s: float = 0.02
    ) -> None:
        if not 0 < floor <= ceiling:
            raise ValueError(f"need 0 < floor <= ceiling, got {floor} and {ceiling}")
        self.admission = admission
        self.target_s = target_s
        self.ceiling = ceiling
        self.floor = floor
        self.interval_s = interval_s
        self.lag_s = 0.0
        """The loop's recent lag: how late a timer fires, as a moving average over a few ticks."""

    def observe(self, lag_s: float) -> None:
        """One tick's lag: update the average and move the limit."""
        self.lag_s += _LAG_WEIGHT * (max(lag_s, 0.0) - self.lag_s)
        gate = self.admission
        limit = gate.limit
        if self.lag_s > self.target_s:
            limit = max(self.floor, int(limit * _DECREASE))
        elif gate.waiting and gate.active >= limit:
            limit = min(self.ceiling, limit + max(1, int(limit * _INCREASE)))
        if limit != gate.limit:
            gate.set_limit(limit)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.observe(loop.time() - due)

"""Recent speed from a cumulative counter: tokens per second over a short sliding window of a clock.

The router polls the load report every 100-500 ms and wants "how fast does this worker prefill, how
long is its decode step", not a lifetime average and not SGLang's per-log-interval figure. The
scheduler feeds a `RateMeter` its cumulative counters against a busy-time clock: the seconds the
engine spent on that kind of work. The rate is then the speed while working, over the last `window_s`
seconds of work, and it holds while the worker idles. (Fed with wall time instead, a meter gives
throughput, which under light load reads far below the speed: a worker that prefills 8,000 tokens/s
but received 300 tokens in the last 2 s would read 150 tokens/s.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["RateMeter"]


@dataclass
class RateMeter:
    """Samples `(time, cumulative count)`; `rate(now)` is the growth per second over the window."""

    window_s: float = 2.0
    _samples: deque[tuple[float, int]] = field(default_factory=deque)

    def observe(self, now: float, total: int) -> None:
        if self._samples and total < self._samples[-1][1]:
            # A counter that went backwards was reset: start the window again.
            self._samples.clear()
        if self._samples and self._samples[-1] == (now, total):
            return  # a busy-time clock stands still while the worker idles: nothing new to keep
        self._samples.append((now, total))
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    @property
    def clock(self) -> float:
        """The clock's reading at the last sample (0 before any)."""
        return self._samples[-1][0] if self._samples else 0.0

    def rate(self, now: float) -> float:
        if len(self._samples) < 2:
            return 0.0
        start_time, start_total = self._samples[0]
        end_time, end_total = self._samples[-1]
        if now - end_time > self.window_s:
            return 0.0
        span = max(now - start_time, 1e-9)
        return max(end_total - start_total, 0) / span

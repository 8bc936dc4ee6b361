"""Recent throughput from a cumulative counter: tokens per second over a short sliding window.

The router polls the load report every 100-500 ms and wants "how fast is this worker going now",
not a lifetime average and not SGLang's per-log-interval figure (which holds its last value for
seconds after the work stops). The scheduler feeds the meter its cumulative counters as it runs;
the rate is the counter's growth over the last `window_s` seconds, so it falls to 0 one window
after the work stops.
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
        self._samples.append((now, total))
        # Keep one sample at or before the window's start, so the rate spans the whole window.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def rate(self, now: float) -> float:
        if len(self._samples) < 2:
            return 0.0
        start_time, start_total = self._samples[0]
        end_time, end_total = self._samples[-1]
        if now - end_time > self.window_s:
            return 0.0
        span = max(now - start_time, 1e-9)
        return max(end_total - start_total, 0) / span

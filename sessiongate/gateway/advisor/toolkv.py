"""The tool-call-aware KV lifecycle, without I/O: when an assistant turn ends with tool calls, where its KV waits.

The session will come back when its tools return. When is predicted from the tool calls' recorded durations
(`ToolDurations`: the `quantile`, p75 by default, of the last `max_samples` durations of that tool for that tenant;
else of that tool for every tenant; else `default_tool_s`; the slowest of the turn's tools, since one turn's
calls run side by side). Then `ToolKVPolicy.decide` chooses:

- **keep** (a short tool): the KV stays on the device of the worker that holds it, through a `retain` whose
  priority lasts the predicted time times `retain_slack` plus `retain_margin_s`, then decays (SGLang's eviction
  ranks it like any other page again: never a hard pin). A tool is short when it is predicted to return within
  `keep_below_s`, or within `keep_load_ratio` times the time to load the context back, since then a prefetch
  could not hide the load.
- **offload** (a long tool): nothing holds the KV, so under device pressure it yields first to retained and
  running sessions' KV (it reaches host and the pool by HiCache's write-through); a device prefetch is scheduled
  to the worker the router picks at firing time, `fire_in_s = predicted - load_s - landing_margin_s`, where
  `load_s = load_latency_s + context tokens * kv_bytes_per_token / load_bytes_per_s` (the pool -> device rate).
  A tool result that arrives before that fires the prefetch at once (`Advisor.signal`).

`ToolKVDecision.detail()` is what the advisory's `detail` records; its outcome is settled like any advisory's.
Times are seconds on the caller's clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ToolDurations", "ToolKVDecision", "ToolKVPolicy", "quantile"]

Action = Literal["keep", "offload"]


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` (linear between order statistics, like numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(slots=True)
class ToolDurations:
    """Recorded tool durations per (tenant, tool) and per tool, the newest `max_samples` of each (soft state)."""

    max_samples: int = 50
    min_samples: int = 3
    max_keys: int = 100_000
    _samples: OrderedDict[tuple[str, str], deque[float]] = field(default_factory=OrderedDict)

    def record(self, tenant_id: str, name: str, seconds: float) -> None:
        for key in ((tenant_id, name), ("", name)):
            samples = self._samples.get(key)
            if samples is None:
                samples = self._samples[key] = deque(maxlen=self.max_samples)
            self._samples.move_to_end(key)
            samples.append(max(seconds, 0.0))
        while len(self._samples) > self.max_keys:
            self._samples.popitem(last=False)

    def predict(self, tenant_id: str, names: Sequence[str], q: float) -> tuple[float, str] | None:
        """(seconds, source) for the slowest of `names`; source is "tenant" or "tool"; None with too few samples."""
        best: tuple[float, str] | None = None
        for name in names:
            for key, source in (((tenant_id, name), "tenant"), (("", name), "tool")):
                samples = self._samples.get(key)
                if samples is not None and len(samples) >= self.min_samples:
                    value = quantile(samples, q)
                    if best is None or value > best[0]:
                        best = (value, source)
                    break
        return best


@dataclass(frozen=True, slots=True)
class ToolKVDecision:
    action: Action
    predicted_s: float
    source: str  # "tenant" | "tool" | "default"
    load_s: float
    fire_in_s: float  # offload: when the prefetch fires, from the decision; keep: 0 (the retain is sent at once)
    retain_s: float  # keep: how long the retain's priority holds; offload: 0
    tools: tuple[str, ...] = ()

    def detail(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "predicted_s": round(self.predicted_s, 3),
            "source": self.source,
            "load_s": round(self.load_s, 3),
            "fire_in_s": round(self.fire_in_s, 3),
            "retain_s": round(self.retain_s, 3),
            "tools": list(self.tools),
        }


@dataclass(frozen=True, slots=True)
class ToolKVPolicy:
    quantile: float = 0.75
    default_tool_s: float = 2.0
    keep_below_s: float = 2.0
    keep_load_ratio: float = 2.0
    retain_slack: float = 1.5
    retain_margin_s: float = 1.0
    # A retain ranks the session's pages this much above its own priority while it holds.
    retain_priority_boost: int = 1
    landing_margin_s: float = 0.5
    kv_bytes_per_token: int = 131_072
    load_bytes_per_s: float = 2e9
    load_latency_s: float = 0.0

    def load_s(self, context_tokens: int) -> float:
        return self.load_latency_s + context_tokens * self.kv_bytes_per_token / self.load_bytes_per_s

    def predict(self, durations: ToolDurations, tenant_id: str, names: Sequence[str]) -> tuple[float, str]:
        return durations.predict(tenant_id, names, self.quantile) or (self.default_tool_s, "default")

    def decide(
        self, predicted_s: float, context_tokens: int, *, source: str = "default", tools: Sequence[str] = ()
    ) -> ToolKVDecision:
        load_s = self.load_s(context_tokens)
        if predicted_s <= max(self.keep_below_s, self.keep_load_ratio * load_s):
            retain_s = predicted_s * self.retain_slack + self.retain_margin_s
            return ToolKVDecision("keep", predicted_s, source, load_s, 0.0, retain_s, tuple(tools))
        fire_in_s = max(predicted_s - load_s - self.landing_margin_s, 0.0)
        return ToolKVDecision("offload", predicted_s, source, load_s, fire_in_s, 0.0, tuple(tools))

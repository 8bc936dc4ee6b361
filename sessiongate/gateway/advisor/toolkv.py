"""The tool-call-aware KV lifecycle, without I/O: when an assistant turn ends with tool calls, where its KV waits.

The session will come back when its tools return. When is learnt from the tool calls' recorded durations
(`ToolDurations`: the last `max_samples` durations of that tool for that tenant; else of that tool for every
tenant; else `default_tool_s`; the slowest of the turn's tools, since one turn's calls run side by side).
`ToolKVPolicy.plan` reads those samples and chooses one of three plans (`decide` is the one-number form):

- **keep** (a short tool): the KV stays on the device of the worker that holds it, through a `retain` whose
  priority lasts the predicted time (the `quantile`, p75, of the samples) times `retain_slack` plus
  `retain_margin_s`, then decays (SGLang's eviction ranks it like any other page again: never a hard pin). A tool
  is short when it is predicted to return within the keep threshold: `keep_below_s`, or `keep_load_ratio` times
  the time to load the context back if that is longer, since then a prefetch could not hide the load.
- **offload** (a long tool): nothing holds the KV, so under device pressure it yields first to retained and
  running sessions' KV (it reaches host and the pool by HiCache's write-through); a device prefetch is scheduled
  to the worker the router picks at firing time, `fire_in_s = predicted - load_s - landing_margin_s`, where
  `load_s = load_latency_s + context tokens * kv_bytes_per_token / load_bytes_per_s` (the pool -> device rate).
- **keep_then_offload** (a tool with two kinds of call, e.g. a command that fails at once or runs the test
  suite): when at least `keep_share` of the samples fall under the keep threshold and at least `min_mode_share`
  above it, one quantile of the whole would fit neither kind. The KV is retained for the short kind (its
  `short_quantile` x `retain_slack` + `retain_margin_s`); if the session has not come back when that lapses, the
  KV is unprotected and a prefetch is scheduled for the long kind: `fire_in_s = long_s - load_s -
  landing_margin_s` (never before the retain lapses), `long_s` being the `long_quantile` of the samples above the
  threshold. That quantile is low (p25) on purpose: a prefetch landed early holds device pages, unpinned, until
  the return; one landed late costs the turn the whole load.

`keep_share` is low (0.3) because the retain costs little: a raised priority, decaying after the short kind's time.

A tool result that arrives before a scheduled prefetch fires it at once (`Advisor.signal`), unless the tenant's
results come too close before their next turn for a prefetch to land (`ResultGaps`: the median of the recent gaps
between a tool result and the session's next turn, against the load time plus `early_margin_s`): then the
scheduled prefetch is dropped, no other is started for that result, and the turn loads its own context.

`ToolKVDecision.detail()` is what the advisory's `detail` records; its outcome is settled like any advisory's.
Times are seconds on the caller's clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

__all__ = ["ResultGaps", "ToolDurations", "ToolKVDecision", "ToolKVPolicy", "quantile"]

Action = Literal["keep", "offload", "keep_then_offload"]
K = TypeVar("K")


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` (linear between order statistics, like numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class _Recent(Generic[K]):
    """The newest `max_samples` values per key, for at most `max_keys` keys, the least recently added dropped first
    (soft state)."""

    def __init__(self, max_samples: int, max_keys: int) -> None:
        self._values: OrderedDict[K, deque[float]] = OrderedDict()
        self._max_samples, self._max_keys = max_samples, max_keys

    def add(self, key: K, value: float) -> None:
        values = self._values.get(key)
        if values is None:
            values = self._values[key] = deque(maxlen=self._max_samples)
        self._values.move_to_end(key)
        values.append(value)
        while len(self._values) > self._max_keys:
            self._values.popitem(last=False)

    def get(self, key: K) -> deque[float] | None:
        return self._values.get(key)


@dataclass(slots=True)
class ToolDurations:
    """Recorded tool durations per (tenant, tool) and per tool, the newest `max_samples` of each (soft state)."""

    max_samples: int = 50
    min_samples: int = 3
    max_keys: int = 100_000
    _samples: _Recent[tuple[str, str]] = field(init=False)

    def __post_init__(self) -> None:
        self._samples = _Recent(self.max_samples, self.max_keys)

    def record(self, tenant_id: str, name: str, seconds: float) -> None:
        for key in ((tenant_id, name), ("", name)):
            self._samples.add(key, max(seconds, 0.0))

    def predict(self, tenant_id: str, names: Sequence[str], q: float) -> tuple[float, str] | None:
        """(seconds, source) for the slowest of `names`; source is "tenant" or "tool"; None with too few samples."""
        found = self.samples(tenant_id, names, q)
        return None if found is None else (quantile(found[0], q), found[1])

    def samples(self, tenant_id: str, names: Sequence[str], q: float) -> tuple[list[float], str] | None:
        """(samples, source) of the slowest of `names` (the highest `q` quantile); None with too few samples."""
        best: tuple[float, list[float], str] | None = None
        for name in names:
            for key, source in (((tenant_id, name), "tenant"), (("", name), "tool")):
                samples = self._samples.get(key)
                if samples is not None and len(samples) >= self.min_samples:
                    value = quantile(samples, q)
                    if best is None or value > best[0]:
                        best = (value, list(samples), source)
                    break
        return None if best is None else (best[1], best[2])


@dataclass(slots=True)
class ResultGaps:
    """Per tenant, the newest `max_samples` gaps between a tool result signal and the session's next turn (soft
    state): a client that posts the result right before it sends the turn leaves a prefetch no time to land."""

    max_samples: int = 20
    min_samples: int = 3
    max_keys: int = 100_000
    _gaps: _Recent[str] = field(init=False)

    def __post_init__(self) -> None:
        self._gaps = _Recent(self.max_samples, self.max_keys)

    def record(self, tenant_id: str, seconds: float) -> None:
        self._gaps.add(tenant_id, max(seconds, 0.0))

    def median(self, tenant_id: str) -> float | None:
        return self.quantile(tenant_id, 0.5)

    def quantile(self, tenant_id: str, q: float) -> float | None:
        gaps = self._gaps.get(tenant_id)
        return quantile(gaps, q) if gaps is not None and len(gaps) >= self.min_samples else None


@dataclass(frozen=True, slots=True)
class ToolKVDecision:
    action: Action
    predicted_s: float  # keep_then_offload: the long kind's return (`long_s`)
    source: str  # "tenant" | "tool" | "default"
    load_s: float
    # offload, keep_then_offload: when the prefetch fires, from the decision; keep: 0 (the retain is sent at once)
    fire_in_s: float
    retain_s: float  # keep, keep_then_offload: how long the retain's priority holds; offload: 0
    tools: tuple[str, ...] = ()
    # keep_then_offload: the short kind's return and the share of samples under the keep threshold.
    short_s: float = 0.0
    short_share: float | None = None

    def detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {
            "action": self.action,
            "predicted_s": round(self.predicted_s, 3),
            "source": self.source,
            "load_s": round(self.load_s, 3),
            "fire_in_s": round(self.fire_in_s, 3),
            "retain_s": round(self.retain_s, 3),
            "tools": list(self.tools),
        }
        if self.action == "keep_then_offload":
            detail["plan"] = {
                "short_s": round(self.short_s, 3),
                "short_share": None if self.short_share is None else round(self.short_share, 3),
                "long_s": round(self.predicted_s, 3),
                "retain_s": round(self.retain_s, 3),
                "prefetch_in_s": round(self.fire_in_s, 3),
            }
        return detail


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
    # Two kinds of call (keep_then_offload): at least this share of the samples under the keep threshold, and at
    # least `min_mode_share` above it; the short kind's retain from its `short_quantile`, the long kind's
    # prefetch from its `long_quantile`.
    keep_share: float = 0.3
    min_mode_share: float = 0.1
    short_quantile: float = 0.9
    long_quantile: float = 0.25
    # A tool result fires a scheduled prefetch early only if the tenant's results usually come at least the load
    # time plus this before the next turn (`ResultGaps`).
    early_margin_s: float = 0.05

    def load_s(self, context_tokens: int) -> float:
        return self.load_latency_s + context_tokens * self.kv_bytes_per_token / self.load_bytes_per_s

    def lead_s(self, context_tokens: int) -> float:
        """How long before its turn a prefetch of the context should fire to land in time."""
        return self.load_s(context_tokens) + self.landing_margin_s

    def keep_threshold_s(self, load_s: float) -> float:
        return max(self.keep_below_s, self.keep_load_ratio * load_s)

    def predict(self, durations: ToolDurations, tenant_id: str, names: Sequence[str]) -> tuple[float, str]:
        return durations.predict(tenant_id, names, self.quantile) or (self.default_tool_s, "default")

    def plan(
        self, durations: ToolDurations, tenant_id: str, names: Sequence[str], context_tokens: int
    ) -> ToolKVDecision:
        """The decision from the recorded samples of the turn's slowest tool (the default with too few)."""
        found = durations.samples(tenant_id, names, self.quantile)
        if found is None:
            return self.decide(self.default_tool_s, context_tokens, source="default", tools=names)
        return self.decide_samples(found[0], context_tokens, source=found[1], tools=names)

    def decide_samples(
        self, samples: Sequence[float], context_tokens: int, *, source: str = "tool", tools: Sequence[str] = ()
    ) -> ToolKVDecision:
        """keep, offload, or keep_then_offload when the samples have a sizeable short kind and a long kind."""
        load_s = self.load_s(context_tokens)
        threshold = self.keep_threshold_s(load_s)
        short = [s for s in samples if s <= threshold]
        long = [s for s in samples if s > threshold]
        short_share = len(short) / len(samples)
        if short and long and short_share >= self.keep_share and 1.0 - short_share >= self.min_mode_share:
            short_s = quantile(short, self.short_quantile)
            retain_s = short_s * self.retain_slack + self.retain_margin_s
            long_s = quantile(long, self.long_quantile)
            fire_in_s = max(long_s - load_s - self.landing_margin_s, retain_s)
            return ToolKVDecision(
                "keep_then_offload", long_s, source, load_s, fire_in_s, retain_s, tuple(tools), short_s, short_share
            )
        return self.decide(quantile(samples, self.quantile), context_tokens, source=source, tools=tools)

    def decide(
        self, predicted_s: float, context_tokens: int, *, source: str = "default", tools: Sequence[str] = ()
    ) -> ToolKVDecision:
        """keep or offload, from one predicted return."""
        load_s = self.load_s(context_tokens)
        if predicted_s <= self.keep_threshold_s(load_s):
            retain_s = predicted_s * self.retain_slack + self.retain_margin_s
            return ToolKVDecision("keep", predicted_s, source, load_s, 0.0, retain_s, tuple(tools))
        fire_in_s = max(predicted_s - load_s - self.landing_margin_s, 0.0)
        return ToolKVDecision("offload", predicted_s, source, load_s, fire_in_s, 0.0, tuple(tools))

    def early_fire_lands(self, median_gap_s: float | None, context_tokens: int) -> bool:
        """Whether a prefetch fired at a tool result can land before the next turn (True while unknown)."""
        return median_gap_s is None or median_gap_s >= self.load_s(context_tokens) + self.early_margin_s

"""The adaptive rule: hints that are mostly wasted get cheaper advisories.

Every settled advisory is remembered under three keys: its session, its tenant and its signal kind. For each key
with at least `min_samples` outcomes in the last `window_s` seconds, the waste ratio is

    wasted / (used + late + wasted)

For a typing hint (and any kind not named below) "late" counts as a good hint: the request did come, only sooner
than the prefetch could finish, and a person typing gives the next hint the same way. For the tool-call KV
lifecycle's advisories (kinds in `LATE_IS_WASTED`: "tool_call", made when a turn ends with tool calls, and
"tool_result", made by a tool result with none live) "late" counts as wasted: the turn came before the prefetch
landed, so the load it started competed with that turn instead of hiding it (typically a result posted right
before the next turn); a lifecycle that keeps being late is tamed like one that guesses wrong. A key whose
ratio reaches `host_only_at` (0.5) makes its advisories prefetch into the host tier only, which costs host memory
and a pool read but never device memory nor a device copy; one that reaches `none_at` (0.8) stops them: the
signal is acknowledged and ignored. The strictest of the three keys wins, so a noisy session is tamed without
taxing its tenant, and a kind of signal that misleads everyone is tamed everywhere. Outcomes older than the
window fall out, so a silenced key is tried again (at the host tier first) once `window_s` has passed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["LATE_IS_WASTED", "HintQuality", "Tier"]

Tier = Literal["device", "host", "none"]
_ORDER: dict[Tier, int] = {"device": 0, "host": 1, "none": 2}
# Signal kinds whose "late" outcome counts as wasted (the tool-call KV lifecycle's advisories).
LATE_IS_WASTED = frozenset({"tool_call", "tool_result"})


@dataclass(slots=True)
class HintQuality:
    window_s: float = 600.0
    min_samples: int = 5
    host_only_at: float = 0.5
    none_at: float = 0.8
    max_samples: int = 50
    max_keys: int = 100_000
    _outcomes: dict[tuple[str, str], deque[tuple[float, bool]]] = field(default_factory=dict)

    @staticmethod
    def keys(session_id: str, tenant_id: str, kind: str) -> tuple[tuple[str, str], ...]:
        return (("session", session_id), ("tenant", tenant_id), ("kind", kind))

    @staticmethod
    def is_wasted(kind: str, outcome: str) -> bool:
        """Whether a settled outcome counts against its hint (see the module's docstring)."""
        return outcome == "wasted" or (outcome == "late" and kind in LATE_IS_WASTED)

    def record(self, session_id: str, tenant_id: str, kind: str, outcome: str, now: float) -> None:
        if outcome not in ("used", "late", "wasted"):
            return
        wasted = self.is_wasted(kind, outcome)
        for key in self.keys(session_id, tenant_id, kind):
            samples = self._outcomes.setdefault(key, deque(maxlen=self.max_samples))
            samples.append((now, wasted))
        while len(self._outcomes) > self.max_keys:  # soft state: the oldest keys go first
            del self._outcomes[next(iter(self._outcomes))]

    def waste_ratio(self, key: tuple[str, str], now: float) -> float | None:
        samples = self._outcomes.get(key)
        if samples is None:
            return None
        while samples and now - samples[0][0] > self.window_s:
            samples.popleft()
        return self._ratio(samples, now)

    def _ratio(self, samples: Iterable[tuple[float, bool]], now: float) -> float | None:
        recent = [wasted for at, wasted in samples if now - at <= self.window_s][-self.max_samples :]
        if len(recent) < self.min_samples:
            return None
        return sum(recent) / len(recent)

    def tier(self, session_id: str, tenant_id: str, kind: str, now: float) -> Tier:
        """The tier an advisory for this hint may prefetch into ("none": do not advise)."""
        return self._strictest(self.waste_ratio(key, now) for key in self.keys(session_id, tenant_id, kind))

    def tier_of(self, samples: Sequence[Iterable[tuple[float, bool]]], now: float) -> Tier:
        """`tier` from samples kept elsewhere (the replicas' shared lists, one per key of `keys`, oldest first)."""
        return self._strictest(self._ratio(each, now) for each in samples)

    def _strictest(self, ratios: Iterable[float | None]) -> Tier:
        tier: Tier = "device"
        for ratio in ratios:
            if ratio is None:
                continue
            level: Tier = "none" if ratio >= self.none_at else "host" if ratio >= self.host_only_at else "device"
            if _ORDER[level] > _ORDER[tier]:
                tier = level
        return tier

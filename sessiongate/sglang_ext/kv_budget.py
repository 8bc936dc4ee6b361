"""How much device KV memory a prefetch may take without costing running requests anything.

Cooperative memory (the Symphony idea): a prefetch to the device uses only memory the engine
will not need for the work it already has. The engine needs, at most, room for every running
request to finish (its remaining `max_new_tokens`) and for every queued request's prompt and
output. Whatever is free beyond that reserve may take prefetched pages; cached but unused pages
(evictable) are *not* counted as free, so a prefetch never evicts anything to make room, and the
reserve keeps decode from running out of pages (SGLang would retract a running request).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DemandItem", "device_prefetch_quota"]


@dataclass(frozen=True)
class DemandItem:
    """One request the engine already has: tokens it still needs KV for, at most."""

    pending_tokens: int


def device_prefetch_quota(free_tokens: int, demand: Iterable[DemandItem], page_size: int) -> int:
    """Tokens of free device KV a prefetch may use (whole pages, never negative)."""
    reserve = sum(max(item.pending_tokens, 0) for item in demand)
    quota = free_tokens - reserve
    if quota <= 0:
        return 0
    return quota // page_size * page_size

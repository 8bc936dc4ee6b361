"""How much device KV memory a prefetch may take without costing running requests anything.

Cooperative memory (the Symphony idea): a prefetch to the device never takes the memory the engine
will need for the work it already has: room for every running request to finish (its remaining
`max_new_tokens`) and for every queued request's prompt and output. Beyond that reserve it may use
free pages and, with priority-based KV memory, cached pages that rank below it (`evictable_tokens`:
pages no live hint expects, or of a lower priority; `kv_fate.KVFate.ranks_below`), which SGLang's
own eviction then frees in rank order as the load allocates. Cached pages that rank at or above the
prefetch are not counted: a prefetch never displaces another live hint's KV of its priority, and the
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


def device_prefetch_quota(
    free_tokens: int, demand: Iterable[DemandItem], page_size: int, evictable_tokens: int = 0
) -> int:
    """Tokens of device KV a prefetch may use, free or evictable below it (whole pages, never negative)."""
    reserve = sum(max(item.pending_tokens, 0) for item in demand)
    quota = free_tokens + max(evictable_tokens, 0) - reserve
    if quota <= 0:
        return 0
    return quota // page_size * page_size

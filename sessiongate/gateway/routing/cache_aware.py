"""`cache_aware`: prefix affinity with a load threshold, after SGLang's router (sgl-router, `cache_aware`).

Its rule, with its documented defaults:

1. The load is imbalanced when `max - min > balance_abs_threshold` (64) *and* `max > min * balance_rel_threshold`
   (1.5); then the least-loaded worker gets the request.
2. Otherwise the worker whose approximate prefix index matches the longest share of the request's text wins, if
   that share exceeds `cache_threshold` (0.3).
3. Otherwise the worker with the smallest index (the most free cache, as far as the router knows) wins.

The chosen worker's index then remembers the text. SGLang keeps a radix tree of characters per worker; this keeps
the same information at the granularity of `block_chars`-character blocks (like pages): one chained hash per
block-aligned prefix, so matching costs one dict lookup per block, bounded per worker by `max_blocks` (least
recently used first out). The index's size (blocks) stands for the cache the worker has used. Load is
`WorkerView.load`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .views import RouteRequest, WorkerView

__all__ = ["CacheAware", "block_keys"]


def block_keys(text: str, block_chars: int) -> list[int]:
    """One key per whole block of `text`, each naming the text up to that block's end (a chained hash), so a
    text's keys are the keys of all its block-aligned prefixes."""
    keys: list[int] = []
    key = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        key = hash((key, text[start : start + block_chars]))
        keys.append(key)
    return keys


class _PrefixIndex:
    """The prefixes one worker has seen, as block keys in LRU order, bounded by `max_blocks`."""

    def __init__(self, max_blocks: int) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.max_blocks = max_blocks

    @property
    def size(self) -> int:
        return len(self.blocks)

    def match(self, keys: list[int]) -> int:
        """How many leading blocks of the text this worker has seen."""
        matched = 0
        for key in keys:
            if key not in self.blocks:
                break
            matched += 1
        return matched

    def insert(self, keys: list[int]) -> None:
        for key in keys:
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        while len(self.blocks) > self.max_blocks:
            self.blocks.popitem(last=False)


class CacheAware:
    name = "cache_aware"
    matches_prompt_text = True

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        block_chars: int = 32,
        max_blocks: int = 200_000,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.block_chars = block_chars
        self._max_blocks = max_blocks
        self._indexes: dict[str, _PrefixIndex] = {}

    def _index(self, worker_id: str) -> _PrefixIndex:
        return self._indexes.setdefault(worker_id, _PrefixIndex(self._max_blocks))

    def imbalanced(self, workers: Sequence[WorkerView]) -> bool:
        loads = [w.load for w in workers]
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> WorkerView:
        keys = block_keys(request.prompt_text, self.block_chars)
        if self.imbalanced(workers):
            choice = min(workers, key=lambda w: (w.load, w.id))
        else:
            matches = {w.id: self._index(w.id).match(keys) for w in workers}
            best = max(workers, key=lambda w: (matches[w.id], -w.load, w.id))
            if keys and matches[best.id] / len(keys) > self.cache_threshold:
                choice = best
            else:
                choice = min(workers, key=lambda w: (self._index(w.id).size, w.load, w.id))
        self._index(choice.id).insert(keys)
        return choice

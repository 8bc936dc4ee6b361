"""Keeps a prefill batch from reading pages a prefetch is still copying to the device (`LoadGuard`).

`load_back` puts the pages in the tree as device-resident at once, while the copy runs on the host-to-device
stream. A request the scheduler loads for itself gets the batch's consumer index and the forward waits layer
by layer; a request whose prefix a prefetch has already placed starts no load of its own and would read the
pages half-written. Runs on the scheduler's own thread.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadGuard"]


@dataclass(frozen=True)
class _Copy:
    """A host -> device copy a prefetch started, until SGLang acknowledges it (scheduler thread only)."""

    node: Any
    token_ids: array[int]
    cache_salt: str | None
    start: int
    """Where the loaded pages begin in the context (tokens): a context's device-resident part is a
    prefix of it, so the load covers what follows."""
    verdicts: dict[str, bool] = field(default_factory=dict)
    """Per request id: does it read this copy's pages (`_reads_loading_pages`, decided once per request)."""


def _agree(request_ids: Any, context: array[int], first: int, end: int) -> bool:
    """Do a request's token ids (a list) and a context agree on [0, end)? The page at `first` decides most cases."""
    if list(request_ids[first:end]) != context[first:end].tolist():
        return False
    return array("q", request_ids[:first]) == context[:first]  # arrays of one type compare without Python objects


class LoadGuard:
    """The prefetch copies not yet acknowledged by SGLang, and the batches that must wait for them."""

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        self._copies: list[_Copy] = []

    @property
    def _cache(self) -> Any:
        return self._scheduler.tree_cache

    def add(self, node: Any, token_ids: array[int], cache_salt: str | None, start: int) -> None:
        self._copies.append(_Copy(node, token_ids, cache_salt, start))

    def loading(self) -> list[_Copy]:
        """The prefetch copies not yet acknowledged (a cancelled prefetch's copy still runs)."""
        ongoing = self._cache.ongoing_load_back
        self._copies = [copy for copy in self._copies if copy.node in ongoing]
        return self._copies

    def guard_new_batch(self, batch: Any) -> None:
        """Make a new prefill batch wait for the prefetch copies whose pages it reads.

        `load_back` puts the pages in the tree as device-resident at once, while the copy runs on
        the host-to-device stream. A request the scheduler loads for itself gets the batch's
        consumer index and the forward waits layer by layer; a request whose prefix a prefetch has
        already placed starts no load of its own and would read the pages half-written. Such a
        batch waits for the newest load on that stream, which finishes after every earlier one.
        """
        loading = self.loading()
        if batch is None or not loading or getattr(batch, "hicache_consumer_index", 0) >= 0:
            return
        if not any(self._reads_loading_pages(req, loading) for req in batch.reqs):
            return
        index = int(self._cache.cache_controller.layer_done_counter.producer_index)
        if index >= 0 and not self._cache.is_load_back_event_done(index):
            batch.hicache_consumer_index = index

    def _reads_loading_pages(self, req: Any, loading: list[_Copy]) -> bool:
        page = int(self._cache.page_size)
        prefix_len = int(getattr(req, "prefix_len", 0))
        for copy in loading:
            if prefix_len <= copy.start or req.cache_salt != copy.cache_salt:
                continue
            # The request's device prefix reaches past where the load begins; it goes through the
            # loaded nodes if it agrees with the prefetched context up to the first loaded page.
            # Decided once per request and copy (a chunked prefill meets the guard once per chunk), the
            # first loaded page first (64 tokens), the whole prefix compared in C only when that agrees.
            shared = min(prefix_len, copy.start + page)
            rid = str(req.rid)
            verdict = copy.verdicts.get(rid)
            if verdict is None:
                verdict = _agree(req.origin_input_ids, copy.token_ids, max(shared - page, 0), shared)
                copy.verdicts[rid] = verdict
            if verdict:
                return True
        return False

"""Chat requests whose KV must not outlive their turn (scheduler thread only).

A request whose SGLang `rid` starts with `protocol.NO_KEEP_RID_PREFIX` (the gateway's
`X-Sessiongate-Keep: false`) runs like any other, with one difference in what stays afterwards:

- as it joins the waiting queue (`admit`, from a hook on SGLang's `_add_request_to_queue`: once per
  request, not a scan of the queue per loop iteration), it is registered with the length of the
  context the tree already held for it (`floor_tokens`): that prefix is shared, and stays;
- its own pages (past that prefix) are never written to the L3 pool: the cache's
  `write_backup_storage` (which SGLang calls when a page's host copy is done) skips them while the
  request is registered;
- once it has finished, its own pages are dropped from device and host (`kv_ops.drop_pages`
  with the floor), retried every few tens of milliseconds while a lock (the write-through to host)
  still holds them, for `SETTLE_S` after the finish; a page it shares with a context cached meanwhile stays;
  its pool pages that were written anyway are deleted on the janitor's thread (`pool_janitor`).
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass
from typing import Any

from sessiongate.sglang_ext.internals import kv_ops, pool_pages
from sessiongate.sglang_ext.kv_fate import KVFate
from sessiongate.sglang_ext.pool_janitor import PoolJanitor
from sessiongate.sglang_ext.protocol import NO_KEEP_RID_PREFIX

__all__ = ["SETTLE_S", "NoKeepRequests"]

logger = logging.getLogger(__name__)

SETTLE_S = 5.0
"""How long after its finish a request's pages are still looked for (its KV reaches the tree when
the scheduler releases it, and a write-through lock may hold it a little longer)."""
GIVE_UP_S = 60.0
FORGET_UNFINISHED_S = 3600.0


@dataclass
class _Request:
    req: Any
    floor_tokens: int
    registered_at: float
    finished_at: float | None = None
    dropped_tokens: int = 0

    def token_ids(self) -> array[int]:
        return array("q", [*self.req.origin_input_ids, *self.req.output_ids])


class NoKeepRequests:
    """The no-keep requests of one scheduler, from arrival until their pages are gone."""

    def __init__(self, cache: Any, fate: KVFate, janitor: PoolJanitor | None = None) -> None:
        self._cache = cache
        self._fate = fate
        self._janitor = janitor
        self._requests: dict[str, _Request] = {}
        write_backup_storage = cache.write_backup_storage

        def guarded_write_backup_storage(node_id: Any) -> None:
            if not self._holds(node_id):
                write_backup_storage(node_id)

        cache.write_backup_storage = guarded_write_backup_storage

    def __len__(self) -> int:
        return len(self._requests)

    def admit(self, arrived: list[Any], now: float) -> None:
        for req in arrived:
            rid = str(req.rid)
            if rid.startswith(NO_KEEP_RID_PREFIX) and rid not in self._requests:
                pages = kv_ops.session_pages(
                    self._cache, array("q", req.origin_input_ids), req.cache_salt, req.extra_key
                )
                self._requests[rid] = _Request(req, pages.matched_tokens, now)

    def _holds(self, node_id: Any) -> bool:
        """Is this tree node a registered request's own (past its shared prefix)?"""
        if not self._requests:
            return False
        node = self._cache.tree_core.node_by_id(node_id)
        start = 0
        ancestor = node.parent
        while ancestor is not None and ancestor.parent is not None:
            start += len(ancestor.key)
            ancestor = ancestor.parent
        length = len(node.key)
        for request in self._requests.values():
            if start + length <= request.floor_tokens or node.key.cache_salt != request.req.cache_salt:
                continue
            tokens = request.token_ids()
            if start + length <= len(tokens) and list(node.key.token_ids[:length]) == list(
                tokens[start : start + length]
            ):
                return True
        return False

    def settle(self, now: float) -> None:
        for rid, request in list(self._requests.items()):
            if not request.req.finished():
                if now - request.registered_at > FORGET_UNFINISHED_S:
                    del self._requests[rid]
                continue
            if request.finished_at is None:
                request.finished_at = now
            pages = kv_ops.session_pages(
                self._cache, request.token_ids(), request.req.cache_salt, request.req.extra_key
            )
            outcome, _ = kv_ops.drop_pages(self._cache, self._fate, pages, [], floor_tokens=request.floor_tokens)
            request.dropped_tokens += outcome.device_tokens + outcome.host_tokens
            waited = now - request.finished_at
            if (waited >= SETTLE_S and not outcome.kept_in_use_tokens) or waited >= GIVE_UP_S:
                del self._requests[rid]
                self._delete_from_pool(request)
                logger.info(
                    "sessiongate: request %s kept nothing (%d tokens dropped from device and host%s)",
                    rid,
                    request.dropped_tokens,
                    f"; {outcome.kept_in_use_tokens} still held" if outcome.kept_in_use_tokens else "",
                )

    def _delete_from_pool(self, request: _Request) -> None:
        """Pages that reached the pool anyway (written before the request was registered)."""
        page_size = int(self._cache.page_size)
        hashes = pool_pages.context_page_hashes(
            request.token_ids(), request.req.cache_salt, page_size, request.req.extra_key
        )
        try:
            deletion = pool_pages.pool_page_deletion(self._cache, hashes[request.floor_tokens // page_size :])
            if self._janitor is not None:
                self._janitor.submit(deletion)  # off the scheduler's thread; nobody asks for the outcome
            else:
                deletion()
        except kv_ops.Unsupported as error:
            logger.warning("sessiongate: request %s: %s", request.req.rid, error)

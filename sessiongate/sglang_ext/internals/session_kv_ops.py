"""A session's KV operations on one scheduler (`SessionKVOps`), on the scheduler's own thread.

`retain` raises a session's pages in the eviction order for a while; `drop` removes the session's own
pages from every tier (the pool's files on the janitor's thread, its outcome asked with `pool_deletion`).
Both need the fate order in SGLang's eviction (`kv_ops.install_fate_order`).
"""

from __future__ import annotations

import logging
import time
from array import array
from typing import Any

from sessiongate.sglang_ext.internals import kv_ops, pool_pages
from sessiongate.sglang_ext.internals.ipc import CallError
from sessiongate.sglang_ext.internals.prefetch_jobs import PrefetchJobs, page_hashes, token_ids_of
from sessiongate.sglang_ext.kv_fate import KVFate
from sessiongate.sglang_ext.pool_janitor import PoolJanitor
from sessiongate.sglang_ext.pool_probe import PoolProbe

__all__ = ["SessionKVOps"]

logger = logging.getLogger(__name__)


class SessionKVOps:
    """retain / drop / pool_deletion for one scheduler's cache."""

    def __init__(
        self,
        cache: Any,
        fate: KVFate,
        fate_ordered: bool,
        prefetches: PrefetchJobs,
        pool_probe: PoolProbe,
        janitor: PoolJanitor,
    ) -> None:
        self._cache = cache
        self._fate = fate
        self._fate_ordered = fate_ordered
        self._prefetches = prefetches
        self._pool_probe = pool_probe
        self._janitor = janitor

    @property
    def _page_size(self) -> int:
        return int(self._cache.page_size)

    def _session_context(self, body: dict[str, Any]) -> tuple[array[int], str | None, kv_ops.SessionPages]:
        if not self._fate_ordered:
            raise CallError(
                "unsupported",
                "session KV operations need SGLang's UnifiedRadixCache with the Python tree core "
                f"({kv_ops.PYTHON_TREE_CORE_ENV[0]}={kv_ops.PYTHON_TREE_CORE_ENV[1]})",
            )
        token_ids = token_ids_of(body)
        cache_salt = body.get("cache_salt")
        return token_ids, cache_salt, kv_ops.session_pages(self._cache, token_ids, cache_salt)

    def _kv_result(self, body: dict[str, Any], operation: str, tokens: int, **tiers: int) -> dict[str, Any]:
        return {"session_id": str(body["session_id"]), "operation": operation, "tokens": tokens, **tiers}

    def retain(self, body: dict[str, Any]) -> dict[str, Any]:
        """Raise the session's pages to `priority` for `ttl_ms`; nothing is loaded or pinned."""
        token_ids, cache_salt, pages = self._session_context(body)
        ttl_s = int(body["ttl_ms"]) / 1000
        self._fate.hold(pages.nodes, int(body["priority"]), ttl_s, time.monotonic())
        device, host = kv_ops.tier_tokens(pages)
        hashes = page_hashes(body, token_ids, cache_salt, self._page_size)
        in_pool = pool_pages.pool_pages_present(self._cache, hashes, self._pool_probe) * self._page_size
        return self._kv_result(
            body, "retain", len(token_ids), device_tokens=device, host_tokens=host, storage_tokens=in_pool
        )

    def drop(self, body: dict[str, Any]) -> dict[str, Any]:
        """Remove the session's own pages from device, host and the pool (see `kv_ops`)."""
        token_ids, cache_salt, pages = self._session_context(body)
        session_id = str(body["session_id"])
        self._prefetches.cancel_session(session_id)  # a prefetch still under way would bring its pages back
        hashes = page_hashes(body, token_ids, cache_salt, self._page_size)
        floor = int(body.get("floor_tokens") or 0)
        outcome, pool_hashes = kv_ops.drop_pages(self._cache, self._fate, pages, hashes, floor_tokens=floor)
        try:
            # The files go on the janitor's thread: the reply carries its ticket, the caller asks for the outcome.
            ticket: str | None = self._janitor.submit(pool_pages.pool_page_deletion(self._cache, pool_hashes))
        except kv_ops.Unsupported as error:
            logger.warning("sessiongate drop of %s: pool pages stay: %s", session_id, error)
            ticket = None
        if outcome.kept_in_use_tokens:
            logger.info(
                "sessiongate drop of %s: %d tokens stay (held by a request or a transfer)",
                session_id,
                outcome.kept_in_use_tokens,
            )
        result = self._kv_result(
            body,
            "drop",
            len(token_ids),
            device_tokens=outcome.device_tokens,
            host_tokens=outcome.host_tokens,
            storage_tokens=0,
        )
        if ticket is not None:
            result["pool_deletion"] = ticket  # `storage_tokens` comes from `pool_deletion` once it is done
        return result

    def pool_deletion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A drop's pool deletion: `done`, and the tokens of the pages deleted (never waits)."""
        deleted = self._janitor.outcome(str(body["ticket"]))
        if deleted is None:
            return {"done": False, "storage_tokens": 0}
        return {"done": True, "storage_tokens": len(deleted) * self._page_size}

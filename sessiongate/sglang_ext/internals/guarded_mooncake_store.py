"""SGLang's Mooncake Store backend, minus the wait on a master that is gone.

With its `mooncake_master` dead, SGLang's `MooncakeStore` keeps asking: every existence check, get
and put goes to the client, which first tries to reconnect and only then fails with `-900`
(`RPC_FAIL`), ~4.3 s per call on the 2-core machine; a request whose prefix is not in the worker's
memory waited ~10 s before it was recomputed. `GuardedMooncakeStore` answers "not there" / "not
stored" at once for `unreachable_cooldown_s` (extra config, default 30 s) after a call failed that
way, then lets the next call try again. Everything else is `MooncakeStore`'s.

SGLang loads it through its `dynamic` storage backend with `interface_v1` (the zero-copy calls it
uses for `mooncake`); `sglang_ext.launcher` does that for `WorkerConfig.storage_backend="mooncake"`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

__all__ = ["RPC_FAIL", "GuardedMooncakeStore"]

RPC_FAIL = -900
"""Mooncake's error code for a call the master did not answer."""
DEFAULT_COOLDOWN_S = 30.0

logger = logging.getLogger(__name__)


class GuardedMooncakeStore(MooncakeStore):  # type: ignore[misc]
    """`MooncakeStore` that stops asking an unreachable master for a while."""

    def __init__(self, storage_config: HiCacheStorageConfig, factory_kwargs: dict[str, Any] | None = None) -> None:
        extra = storage_config.extra_config or {}
        self._cooldown_s = float(extra.get("unreachable_cooldown_s", DEFAULT_COOLDOWN_S))
        self._skip_until = 0.0
        self._skip_lock = threading.Lock()
        # SGLang's `dynamic` factory passes no host pool; MooncakeStore needs one only in its
        # standalone mode, which this backend does not use.
        super().__init__(storage_config, None)

    def _skipping(self) -> bool:
        return time.monotonic() < self._skip_until

    def _noted(self, results: list[int]) -> list[int]:
        if RPC_FAIL in results:
            with self._skip_lock:
                first = not self._skipping()
                self._skip_until = time.monotonic() + self._cooldown_s
            if first:
                logger.warning(
                    "Mooncake master unreachable (RPC_FAIL): the pool is skipped for %.0f s, then tried again",
                    self._cooldown_s,
                )
        return results

    def _batch_exist(self, key_strs: list[str]) -> list[int]:
        if self._skipping():
            return [RPC_FAIL] * len(key_strs)
        return self._noted(list(super()._batch_exist(key_strs)))

    def _get_batch_zero_copy_impl(self, key_strs: list[str], buffer_ptrs: list[Any], buffer_sizes: list[Any]) -> Any:
        if self._skipping():
            return [RPC_FAIL] * len(key_strs)
        return self._noted(list(super()._get_batch_zero_copy_impl(key_strs, buffer_ptrs, buffer_sizes)))

    def _put_batch_zero_copy_impl(
        self,
        key_strs: list[str],
        buffer_ptrs: list[Any],
        buffer_sizes: list[Any],
        group_ids: list[str] | None = None,
        session_ids: list[str] | None = None,
    ) -> Any:
        if self._skipping():
            return [RPC_FAIL] * len(key_strs)
        results = super()._put_batch_zero_copy_impl(key_strs, buffer_ptrs, buffer_sizes, group_ids, session_ids)
        return self._noted(list(results))

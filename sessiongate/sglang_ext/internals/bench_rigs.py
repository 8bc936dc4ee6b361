"""SGLang 0.5.23's own cache classes built outside a server, for the benchmarks that time them.

`benchmarks.scheduler_thread` measures the extension's scheduler-thread work with SGLang's classes where the
operation uses them; building those is SGLang's internal API, so it is here with the rest of it:

- `file_pool`: the `file` pool backend (`HiCacheFile`) over a directory, and the cache stand-in `kv_ops` reads it
  through (`cache_controller.storage_backend`, `storage_existence_cache`);
- `python_core_radix_cache`: a `UnifiedRadixCache` with the Python tree core (`kv_ops.PYTHON_TREE_CORE_ENV`), on
  one-token pages of a tiny CPU KV pool, with `priority` eviction; `RadixRig.insert` and `evict_one` drive it.

Nothing is imported at module import time: each function imports SGLang (and torch) when called.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

__all__ = ["RadixRig", "file_pool", "python_core_radix_cache"]


def file_pool(directory: str) -> tuple[Any, Any]:
    """SGLang's `HiCacheFile` over `directory`, and a cache stand-in holding it and a `StorageExistenceCache`."""
    from sglang.srt.mem_cache.buffer_mode.storage_existence_cache import StorageExistenceCache
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    backend = HiCacheFile(single_rank_storage_config("bench", {"file_storage_path": directory}))
    cache = SimpleNamespace(
        cache_controller=SimpleNamespace(storage_backend=backend), storage_existence_cache=StorageExistenceCache()
    )
    return backend, cache


@dataclass(frozen=True)
class RadixRig:
    """A `UnifiedRadixCache`, the allocator of its KV pool, and SGLang's parameter types for its calls (imported once,
    so that a timed call imports nothing)."""

    cache: Any
    allocator: Any
    insert_params: Any
    radix_key: Any
    evict_params: Any

    def insert(self, key: array[int], priority: int) -> None:
        """Insert `key` with freshly allocated KV slots."""
        value = self.allocator.alloc(len(key))
        self.cache.insert(self.insert_params(key=self.radix_key(key), value=value, priority=priority))

    def evict_one(self) -> None:
        """One eviction of (at least) one token."""
        self.cache.evict(self.evict_params(num_tokens=1))


def python_core_radix_cache(size: int) -> RadixRig:
    """A `UnifiedRadixCache` (Python tree core, `priority` eviction, page size 1) over a CPU KV pool of `size`
    tokens."""
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sessiongate.sglang_ext.internals import kv_ops

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1, radix_eviction_policy="priority"))
    kv_pool = MHATokenToKVPool(
        size=size,
        page_size=1,
        dtype=torch.float16,
        head_num=1,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(size=size, dtype=torch.float16, device="cpu", kvcache=kv_pool, need_sort=False)
    params = CacheInitParams(
        req_to_token_pool=ReqToTokenPool(size=8, max_context_len=64, device="cpu", enable_memory_saver=False),
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        disable=False,
        tree_components=(ComponentType.FULL,),
        eviction_policy="priority",
    )
    name, value = kv_ops.PYTHON_TREE_CORE_ENV
    with getattr(envs, name).override(value):
        cache = UnifiedRadixCache(params=params)
    return RadixRig(cache, allocator, insert_params=InsertParams, radix_key=RadixKey, evict_params=EvictParams)

"""A context's pages in the L3 pool, on SGLang 0.5.23's HiCache (scheduler thread, unless said otherwise).

- `context_page_hashes`: the pool keys of a context's whole pages, as HiCache computes them;
- `pool_pages_present`: how many of the leading pages the pool holds, asked off the scheduler's thread;
- `pool_page_deletion`: deleting pages from the `file` pool, split into the scheduler thread's part (SGLang's
  record of stored pages) and the file system's (`pool_janitor`).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from typing import Any

from sessiongate.sglang_ext.internals.kv_ops import Unsupported
from sessiongate.sglang_ext.pool_probe import PoolProbe

__all__ = ["context_page_hashes", "delete_pool_pages", "pool_page_deletion", "pool_pages_present"]


def context_page_hashes(
    token_ids: array[int], cache_salt: str | None, page_size: int, extra_key: str | None = None
) -> list[str]:
    """The L3 keys of the context's whole pages, as SGLang's HiCache computes them."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    key = RadixKey(token_ids=token_ids, extra_key=extra_key, cache_salt=cache_salt).page_aligned(page_size)
    if len(key) == 0:
        return []
    hashes = get_storage_hash_str(key, None, page_size=page_size)
    return list(hashes) if isinstance(hashes, list) else [hashes]


def _storage_backend(cache: Any) -> Any:
    controller = getattr(cache, "cache_controller", None)
    return None if controller is None else getattr(controller, "storage_backend", None)


def pool_pages_present(cache: Any, hashes: list[str], probe: PoolProbe) -> int:
    """How many of the leading pages are in the L3 pool (0 without one), asked on `probe`'s thread.

    0 as well when the pool does not answer within the probe's wait: the scheduler never waits on a slow or
    unreachable pool (a Mooncake master that is gone took ~4 s per call)."""
    backend = _storage_backend(cache)
    if backend is None or not hashes:
        return 0
    present = probe.ask(lambda: int(backend.batch_exists(hashes)))
    return present or 0


def delete_pool_pages(cache: Any, hashes: list[str]) -> set[str]:
    """Delete the pool's page files for these page hashes, on this thread; the hashes whose pages went."""
    return pool_page_deletion(cache, hashes)()


def pool_page_deletion(cache: Any, hashes: list[str]) -> Callable[[], set[str]]:
    """What deleting these pages' files takes, split by thread: SGLang's record of stored pages is updated here (the
    scheduler's thread, which reads it), and the returned call does the file system's part (one `unlink` per page)
    on any thread (`pool_janitor`), returning the hashes whose pages went.

    Each file's name is computed from its hash as the backend names it (`_get_suffixed_key`: this worker's
    model namespace and rank), so the cost is one `unlink` per page, never a listing of the pool directory
    (which holds every worker's pages and would block for as long as it takes to read it). The backend's own
    records of a file (its metadata cache and evictor) lock for themselves. The models served here keep KV pages
    only; other pools' pages (Mamba state) are not deleted.
    """
    backend = _storage_backend(cache)
    if backend is None or not hashes:
        return set
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, PoolName

    if not isinstance(backend, HiCacheFile):
        raise Unsupported(f"deleting pages from the {type(backend).__name__} pool is not implemented")
    # SGLang remembers which pages it believes stored and skips writing them again.
    cache.storage_existence_cache.pool(PoolName.KV).invalidate_beyond(list(hashes), 0)
    pages = [(page_hash, backend._get_suffixed_key(page_hash)) for page_hash in dict.fromkeys(hashes)]

    def delete() -> set[str]:
        deleted: set[str] = set()
        for page_hash, stem in pages:
            try:
                os.remove(os.path.join(backend.file_path, f"{stem}.bin"))
            except FileNotFoundError:
                continue
            deleted.add(page_hash)
            if backend.metadata_cache is not None:
                backend.metadata_cache.remove(stem)
            # The evictor's own bookkeeping for a file that is gone: `abort` drops the entry and
            # refunds its bytes (a no-op when the pool has no size cap).
            backend._evictor.abort(stem)
        return deleted

    return delete

"""The default pool backend: SGLang's `file` layout, with every page verified when it is read.

SGLang's `file` backend (`HiCacheFile`) stores a page as its raw bytes and reads back whatever a file of the right
size holds: a page overwritten with other bytes of the same size is served as KV, and the next turn decodes from it (a
wrong answer, no error). `CheckedFileStore` is that backend with a trailer after each page (`page_digest`: magic,
length, xxh3-64 of the page's bytes seeded with its key's). A page whose trailer is missing or does not match (other
bytes, a truncated file, a valid page filed under another page's name) is a cache miss (SGLang recomputes it), counted
in `pages_rejected` (the worker's load report: `pool_pages_rejected`), logged once, and its file is removed so that
the next write-through puts the right bytes back.

Writes go to a temporary file that is renamed into place: a reader sees a whole page or none, and a crash
mid-write leaves only the temporary file (a page torn some other way fails its digest). Everything else is
`HiCacheFile`'s: one `.bin` file per page, the same directory and eviction settings. The model name in the file
names is tagged (`<model>-xxh3s`, `page_digest.MODEL_TAG`), so unchecked pages, or pages of an earlier format
(the CRC-32 trailer, the unseeded xxh3), in the same directory are never read.

Each batch call SGLang (or the extension) makes, a get, a set or an existence check, is timed into `pool_timing`
(`sglang_ext.pool_timing`; the load report's `pool_calls`): a pool directory on a slow or remote file system shows.

SGLang loads it through its `dynamic` storage backend (`sglang_ext.launcher` does that for the `file` pool, the
default); it runs in each scheduler process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

from sessiongate.sglang_ext.internals.page_digest import TRAILER, Rejections, pack_trailer, problem, tagged_model_name
from sessiongate.sglang_ext.pool_timing import PoolTiming

__all__ = ["CheckedFileStore"]

logger = logging.getLogger(__name__)


# Element types numpy has: their pages are handed over as they are, without a byte view (a microsecond less per
# page, a few percent of a page-cache read of a small page). Others (bfloat16, float8) are viewed as bytes first.
_NUMPY_DTYPES = frozenset(
    {torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
)


def _page_bytes(page: torch.Tensor) -> memoryview:
    """The page's bytes, in place (the host pool hands out contiguous pages)."""
    if not page.is_contiguous():
        page = page.contiguous()
    if page.dtype in _NUMPY_DTYPES:
        whole: memoryview = page.numpy().data
        return whole
    flat: memoryview = page.reshape(-1).view(torch.uint8).numpy().data
    return flat


class CheckedFileStore(HiCacheFile):  # type: ignore[misc]
    """`HiCacheFile` with a digest per page; a page that fails it is a miss."""

    def __init__(self, storage_config: HiCacheStorageConfig, factory_kwargs: dict[str, Any] | None = None) -> None:
        # SGLang's `dynamic` factory passes its keyword arguments as a dict in second place, where
        # `HiCacheFile` takes a default directory: the directory comes from the extra config.
        tagged = dataclasses.replace(storage_config, model_name=tagged_model_name(storage_config.model_name))
        super().__init__(tagged)
        self._rejections = Rejections(logger)
        self.pool_timing = PoolTiming()

    @property
    def pages_rejected(self) -> int:
        """Pages read since start that failed verification (each a miss)."""
        return self._rejections.count

    # The batch calls SGLang's cache controller makes (`_generic_page_get`, `_generic_page_set`, `_storage_hit_query`)
    # and the extension's pool probe, each timed whole.

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        return self.pool_timing.read.timed(len(keys), super().batch_get, keys, target_locations, target_sizes)

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> Any:
        return self.pool_timing.write.timed(len(keys), super().batch_set, keys, values, target_locations, target_sizes)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        return int(self.pool_timing.lookup.timed(len(keys), super().batch_exists, keys, extra_info))

    def _path(self, suffixed_key: str) -> str:
        return os.path.join(self.file_path, f"{suffixed_key}.bin")

    def get(self, key: str, target_location: torch.Tensor, target_sizes: Any = None) -> torch.Tensor | None:
        suffixed = self._get_suffixed_key(key)
        path = self._path(suffixed)
        page = _page_bytes(target_location)
        trailer = bytearray(TRAILER.size)
        # One byte more: a file longer than page + trailer is caught too.
        spare = bytearray(1)
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if self.metadata_cache is not None:
                self.metadata_cache.remove(suffixed)
            return None
        try:
            # The page straight into the host page and the trailer after it, in one system call; the digest is
            # then taken from the host page while it is still in the CPU's cache (hashing it in pieces as they
            # land, one read each, measured slower: the calls cost more than the cache misses they save).
            length = os.readv(descriptor, [page, trailer, spare])
        finally:
            os.close(descriptor)
        why = (
            problem(suffixed, [page], trailer)
            if length == page.nbytes + TRAILER.size
            else f"{length} bytes where the page and its trailer have {page.nbytes + TRAILER.size}"
        )
        if why is not None:
            self._reject(suffixed, path, why)
            return None
        self._evictor.touch(suffixed, path)
        if self.metadata_cache is not None:
            self.metadata_cache.add(suffixed)
        return target_location

    def _reject(self, suffixed: str, path: str, why: str) -> None:
        self._rejections.note(suffixed, why)
        if self.metadata_cache is not None:
            self.metadata_cache.remove(suffixed)
        # Gone already when another worker got there first.
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        # Drops the evictor's entry for the file and refunds its bytes (a no-op without a size cap).
        self._evictor.abort(suffixed)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        suffixed = self._get_suffixed_key(key)
        path = self._path(suffixed)
        if self.exists(key):
            self._evictor.touch(suffixed, path)
            return True
        page = _page_bytes(value)
        if not self._evictor.reserve(suffixed, page.nbytes + TRAILER.size, key=key):
            return False
        temporary = os.path.join(self.file_path, f".{uuid.uuid4().hex}.tmp")
        try:
            with open(temporary, "wb") as page_file:
                page_file.write(page)
                page_file.write(pack_trailer(suffixed, [page]))
            os.replace(temporary, path)
        except OSError as error:
            logger.error("Failed to save HiCache page %s: %s", key, error)
            self._evictor.abort(suffixed)
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
            return False
        self._evictor.commit(suffixed)
        if self.metadata_cache is not None:
            self.metadata_cache.add(suffixed)
        return True

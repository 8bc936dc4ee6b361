"""A HiCache L3 backend over SGLang's `file` layout that checks every page it reads.

SGLang's `file` backend (`HiCacheFile`) stores a page as its raw bytes and reads back whatever
a file of the right size holds: a page overwritten with other bytes of the same size is served
as KV, and the next turn decodes from it (a wrong answer, no error). `CheckedFileStore` is that
backend with a 16-byte trailer after each page: a magic, the page's length and a CRC-32 of its key
and bytes. A page whose trailer is missing or does not match (other bytes, or a valid page filed
under another page's name) is a cache miss (SGLang recomputes it), and its file is removed so that
the next write-through puts the right bytes back.

CRC-32 detects accidental damage (a torn or overwritten file, a bad disk, a stray writer), not
tampering: anyone who can write the pool directory can also write a matching checksum.

Everything else is `HiCacheFile`'s: one `.bin` file per page, written to a temporary file and
renamed into place, the same directory and eviction settings. The model name in the file names
is tagged (`<model>-crc32`), so a plain `file` worker and a checked one on the same directory
never read each other's pages.

SGLang loads it through its `dynamic` storage backend (`sglang_ext.launcher` passes
`--hicache-storage-backend dynamic` with this module and class in the extra config); it runs in
each scheduler process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import struct
import uuid
import zlib
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

__all__ = ["MODEL_TAG", "TRAILER", "CheckedFileStore"]

MODEL_TAG = "crc32"
# magic, page length in bytes, CRC-32 of the file name's key then the page; little-endian, after the
# page's bytes. The key is in the checksum so that a valid page under another page's name is caught too.
TRAILER = struct.Struct("<4sQI")
_MAGIC = b"SGC1"

logger = logging.getLogger(__name__)


def _tagged(storage_config: HiCacheStorageConfig) -> HiCacheStorageConfig:
    model_name = storage_config.model_name
    tagged = f"{model_name}-{MODEL_TAG}" if model_name else MODEL_TAG
    return dataclasses.replace(storage_config, model_name=tagged)


def _page_bytes(page: torch.Tensor) -> memoryview:
    """The page's bytes, flat, in place (the host pool hands out contiguous pages)."""
    flat: memoryview = page.contiguous().reshape(-1).view(torch.uint8).numpy().data
    return flat


def _checksum(suffixed_key: str, page: memoryview) -> int:
    return zlib.crc32(page, zlib.crc32(suffixed_key.encode()))


def _problem(suffixed_key: str, page: memoryview, length: int | None, trailer: bytes) -> str | None:
    """What is wrong with a page read into `page` (`length` bytes) followed by `trailer`, if anything."""
    if length != len(page) or len(trailer) != TRAILER.size:
        return f"{length} + {len(trailer)} bytes, expected {len(page)} + {TRAILER.size}"
    magic, stored_length, stored_crc = TRAILER.unpack(trailer)
    if magic != _MAGIC or stored_length != len(page):
        return "no valid trailer"
    if _checksum(suffixed_key, page) != stored_crc:
        return "checksum mismatch"
    return None


class CheckedFileStore(HiCacheFile):  # type: ignore[misc]
    """`HiCacheFile` with a checksum per page; a page that fails it is a miss."""

    def __init__(self, storage_config: HiCacheStorageConfig, factory_kwargs: dict[str, Any] | None = None) -> None:
        # SGLang's `dynamic` factory passes its keyword arguments as a dict in second place, where
        # `HiCacheFile` takes a default directory: the directory comes from the extra config.
        super().__init__(_tagged(storage_config))

    def _path(self, suffixed_key: str) -> str:
        return os.path.join(self.file_path, f"{suffixed_key}.bin")

    def get(self, key: str, target_location: torch.Tensor, target_sizes: Any = None) -> torch.Tensor | None:
        suffixed = self._get_suffixed_key(key)
        path = self._path(suffixed)
        page = _page_bytes(target_location)
        try:
            with open(path, "rb", buffering=0) as page_file:
                length = page_file.readinto(page)
                trailer = page_file.read(TRAILER.size + 1)
        except FileNotFoundError:
            if self.metadata_cache is not None:
                self.metadata_cache.remove(suffixed)
            return None
        problem = _problem(suffixed, page, length, trailer)
        if problem is not None:
            logger.warning("HiCache page %s is corrupt (%s): treated as a miss and removed", suffixed, problem)
            if self.metadata_cache is not None:
                self.metadata_cache.remove(suffixed)
            # Gone already when another worker got there first.
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            # Drops the evictor's entry for the file and refunds its bytes (a no-op without a size cap).
            self._evictor.abort(suffixed)
            return None
        self._evictor.touch(suffixed, path)
        if self.metadata_cache is not None:
            self.metadata_cache.add(suffixed)
        return target_location

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        suffixed = self._get_suffixed_key(key)
        path = self._path(suffixed)
        if self.exists(key):
            self._evictor.touch(suffixed, path)
            return True
        page = _page_bytes(value)
        if not self._evictor.reserve(suffixed, len(page) + TRAILER.size, key=key):
            return False
        temporary = os.path.join(self.file_path, f".{uuid.uuid4().hex}.tmp")
        try:
            with open(temporary, "wb") as page_file:
                page_file.write(page)
                page_file.write(TRAILER.pack(_MAGIC, len(page), _checksum(suffixed, page)))
            os.replace(temporary, path)
        except OSError as error:
            logger.error("Failed to save HiCache page %s: %s", key, error)
            self._evictor.abort(suffixed)
            if os.path.exists(temporary):
                os.remove(temporary)
            return False
        self._evictor.commit(suffixed)
        if self.metadata_cache is not None:
            self.metadata_cache.add(suffixed)
        return True

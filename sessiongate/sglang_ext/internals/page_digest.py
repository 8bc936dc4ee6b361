"""What makes a pool page verifiable: a trailer with a digest of the page's key and bytes.

Every pool backend sessiongate loads (`checked_file_store`, `guarded_mooncake_store`) stores a page as its bytes
followed by a 20-byte `TRAILER`: a magic, the page's length, and the xxh3-64 digest of the page's bytes seeded with
the xxh3-64 of its storage key. A reader checks it after the bytes have landed where they go (the host page) and
before the page counts as found; a page whose trailer is missing or does not match is a cache miss. The key is in
the digest (as its seed), so a valid page filed under another key (two pages swapped, within a session or between
two) fails as well. A page in one buffer is hashed in one call (xxh3's one-shot form, about 10% faster on a 1 MiB
page than feeding the key and then the page to a streaming hasher); a page in several (Mooncake's K and V) is
streamed with the same seed, which gives the same digest as the one-shot hash of the parts laid end to end.

xxh3 detects accidental damage (a torn or overwritten page, a bad disk, a stray writer) at memory speed; it is
not a MAC: anyone who can write the pool can also write a matching trailer.

`Rejections` counts the pages that failed and logs each one once. `MODEL_TAG` goes into the pool's model name
(and so into every key), so that pages written in another format (unchecked, or the earlier CRC-32 trailer)
are never read as these.

Nothing here imports SGLang.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

__all__ = ["MODEL_TAG", "TRAILER", "Rejections", "pack_trailer", "problem", "tagged_model_name"]

MODEL_TAG = "xxh3s"
"""In the pool's model name; `xxh3` while the digest hashed the key then the page in one stream, `crc32` before
issue 31."""
# magic, page length in bytes, xxh3-64 of the page seeded with the key's; little-endian, after the page's bytes.
TRAILER = struct.Struct("<4sQQ")
_MAGIC = b"SGX3"
_LOGGED_KEYS = 4096


def tagged_model_name(model_name: str | None) -> str:
    return f"{model_name}-{MODEL_TAG}" if model_name else MODEL_TAG


def _length(parts: Sequence[memoryview]) -> int:
    # A page is one part but in the Mooncake pool (K and V): no generator for it on every read.
    return parts[0].nbytes if len(parts) == 1 else sum(part.nbytes for part in parts)


def _digest(key: str, parts: Sequence[memoryview]) -> int:
    seed = xxhash.xxh3_64_intdigest(key.encode())
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0], seed)
    hasher = xxhash.xxh3_64(seed=seed)
    for part in parts:
        hasher.update(part)
    return hasher.intdigest()


def pack_trailer(key: str, parts: list[memoryview]) -> bytes:
    """The trailer for a page stored under `key` whose bytes are `parts`, in order."""
    return TRAILER.pack(_MAGIC, _length(parts), _digest(key, parts))


def problem(key: str, parts: list[memoryview], trailer: bytes | bytearray | memoryview) -> str | None:
    """What is wrong with a page read under `key` into `parts`, followed by `trailer`; None if nothing."""
    if len(trailer) != TRAILER.size:
        return f"trailer of {len(trailer)} bytes, expected {TRAILER.size}"
    magic, length, stored = TRAILER.unpack(trailer)
    if magic != _MAGIC or length != _length(parts):
        return "no valid trailer"
    if _digest(key, parts) != stored:
        return "digest mismatch"
    return None


class Rejections:
    """How many pages failed verification since the backend started; each page is logged once (per key, among
    the last few thousand logged), however often it is read."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._count = 0
        self._logged: OrderedDict[str, None] = OrderedDict()

    @property
    def count(self) -> int:
        return self._count

    def note(self, key: str, why: str) -> None:
        with self._lock:
            self._count += 1
            first = key not in self._logged
            self._logged[key] = None
            self._logged.move_to_end(key)
            while len(self._logged) > _LOGGED_KEYS:
                self._logged.popitem(last=False)
        if first:
            self._logger.warning("pool page %s failed verification (%s): treated as a miss and removed", key, why)

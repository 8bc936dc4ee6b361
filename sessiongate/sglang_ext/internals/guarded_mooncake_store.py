"""SGLang's Mooncake Store backend, with every object verified when it is read, minus the wait on a dead master.

**Verification.** SGLang's `MooncakeStore` puts a page as two objects (its K and its V bytes, zero-copy from the host
pool) and reads back whatever an object of the right size holds. `GuardedMooncakeStore` appends a trailer to each
object (`page_digest`: magic, length, xxh3-64 of the object's bytes seeded with its key's) in the same zero-copy put:
Mooncake's multi-buffer calls take the object's bytes from the host page and the trailer from a small registered
buffer of the backend's own, and a get scatters them back the same way. Mooncake makes an object visible only once its
put is complete, so a reader sees a whole object with its trailer or nothing. After each batch get, the trailers of
the objects that arrived are checked against the bytes now in the host pages; an object whose trailer does not match
(other bytes, another object's bytes under its key), or whose size is not the page's plus a trailer (truncated, or
written by another format), is reported as not found (so its page is a miss and SGLang recomputes it), counted in
`pages_rejected` (the load report's `pool_pages_rejected`), logged once, and removed, so that the next write-through
puts it back. The model name in the keys is tagged (`<model>-xxh3s`, `page_digest.MODEL_TAG`): objects of SGLang's own
`mooncake` backend are never read as these.

**A master that is gone.** With its `mooncake_master` dead, every existence check, get and put goes to the
client, which first tries to reconnect and only then fails with `-900` (`RPC_FAIL`), ~4.3 s per call on the
2-core machine; a request whose prefix is not in the worker's memory waited ~10 s before it was recomputed. This
backend answers "not there" / "not stored" at once for `unreachable_cooldown_s` (extra config, default 30 s)
after a call failed that way, then lets the next call try again.

**Timing.** Each batch call the worker makes (`batch_get_v1`, `batch_set_v1`, `batch_exists`) is timed into
`pool_timing` (`sglang_ext.pool_timing`; the load report's `pool_calls`): a master or storage node behind a slow or
lossy link shows there. A call answered at once while the pool is skipped is not counted (it never reached it).

SGLang loads it through its `dynamic` storage backend with `interface_v1` (the zero-copy calls it uses for
`mooncake`); `sglang_ext.launcher` does that for `WorkerConfig.storage_backend="mooncake"`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

from sessiongate.sglang_ext.internals.page_digest import TRAILER, Rejections, pack_trailer, problem, tagged_model_name
from sessiongate.sglang_ext.pool_timing import PoolCallTimer, PoolTiming

__all__ = ["OBJECT_NOT_FOUND", "RPC_FAIL", "GuardedMooncakeStore"]

RPC_FAIL = -900
"""Mooncake's error code for a call the master did not answer."""
OBJECT_NOT_FOUND = -704
"""Mooncake's error code for a key it does not hold; also what a rejected object is reported as."""
DEFAULT_COOLDOWN_S = 30.0
TRAILER_SLOTS = 1024
"""Objects per Mooncake call (a batch of more is split): SGLang sends at most 128 pages of 2 objects at a time."""

logger = logging.getLogger(__name__)


def _memory(address: int, size: int) -> memoryview:
    """`size` bytes at `address` (in a host-pool buffer Mooncake reads from or wrote into), without a copy."""
    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")


def _parts(pointers: Any, sizes: Any) -> tuple[list[int], list[int]]:
    """One object's buffers: a list for SGLang's multi-buffer layouts, else one."""
    if isinstance(pointers, Sequence):
        return list(pointers), list(sizes)
    return [int(pointers)], [int(sizes)]


class _TrailerSlots:
    """A registered buffer of `TRAILER_SLOTS` trailers, for one kind of call at a time."""

    def __init__(self, register: Any) -> None:
        self.buffer = torch.zeros(TRAILER_SLOTS * TRAILER.size, dtype=torch.uint8)
        register(self.buffer)
        self._lock = threading.Lock()

    def address(self, slot: int) -> int:
        return int(self.buffer.data_ptr()) + slot * TRAILER.size

    def view(self, slot: int) -> memoryview:
        return _memory(self.address(slot), TRAILER.size)

    @contextmanager
    def held(self) -> Iterator[_TrailerSlots]:
        with self._lock:
            yield self


class GuardedMooncakeStore(MooncakeStore):  # type: ignore[misc]
    """`MooncakeStore` that verifies every object it reads and stops asking an unreachable master for a while."""

    def __init__(self, storage_config: HiCacheStorageConfig, factory_kwargs: dict[str, Any] | None = None) -> None:
        extra = storage_config.extra_config or {}
        self._cooldown_s = float(extra.get("unreachable_cooldown_s", DEFAULT_COOLDOWN_S))
        self._skip_until = 0.0
        self._skip_lock = threading.Lock()
        self._rejections = Rejections(logger)
        self.pool_timing = PoolTiming()
        tagged = dataclasses.replace(storage_config, model_name=tagged_model_name(storage_config.model_name))
        # SGLang's `dynamic` factory passes no host pool; MooncakeStore needs one only in its
        # standalone mode, which this backend does not use.
        super().__init__(tagged, None)
        # Puts (the backup thread) and gets (the prefetch thread) each have their own.
        self._put_slots = _TrailerSlots(self.register_buffer)
        self._get_slots = _TrailerSlots(self.register_buffer)

    @property
    def pages_rejected(self) -> int:
        """Objects read since start that failed verification (each made its page a miss)."""
        return self._rejections.count

    # The batch calls SGLang's cache controller makes with `interface_v1` (`_page_get_zero_copy`,
    # `_page_set_zero_copy`, `_storage_hit_query`) and the extension's pool probe, each timed whole.

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> Any:
        return self._timed(self.pool_timing.read, len(keys), super().batch_get_v1, keys, host_indices, extra_info)

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> Any:
        return self._timed(self.pool_timing.write, len(keys), super().batch_set_v1, keys, host_indices, extra_info)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        return int(self._timed(self.pool_timing.lookup, len(keys), super().batch_exists, keys, extra_info))

    def _timed(self, timer: PoolCallTimer, pages: int, call: Callable[..., Any], *args: Any) -> Any:
        if self._skipping():
            return call(*args)  # answered at once, without asking the pool
        return timer.timed(pages, call, *args)

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
        results: list[int] = []
        for start in range(0, len(key_strs), TRAILER_SLOTS):
            end = start + TRAILER_SLOTS
            results += self._get_verified(key_strs[start:end], buffer_ptrs[start:end], buffer_sizes[start:end])
        return self._noted(results)

    def _get_verified(self, keys: list[str], pointers: list[Any], sizes: list[Any]) -> list[int]:
        with self._get_slots.held() as slots:
            layouts = [_parts(p, s) for p, s in zip(pointers, sizes, strict=True)]
            slots.buffer.zero_()
            results = list(
                self.store.batch_get_into_multi_buffers(
                    keys,
                    [[*ptrs, slots.address(i)] for i, (ptrs, _) in enumerate(layouts)],
                    [[*lens, TRAILER.size] for _, lens in layouts],
                )
            )
            for i, (key, (ptrs, lens)) in enumerate(zip(keys, layouts, strict=True)):
                expected = sum(lens) + TRAILER.size
                if results[i] >= 0:
                    parts = [_memory(ptr, size) for ptr, size in zip(ptrs, lens, strict=True)]
                    why = (
                        problem(key, parts, slots.view(i))
                        if results[i] == expected
                        else f"{results[i]} bytes where the object has {expected}"
                    )
                elif results[i] not in (OBJECT_NOT_FOUND, RPC_FAIL):
                    # A size that does not fit the buffers fails the whole get: ask what is stored.
                    stored = int(self.store.get_size(key))
                    why = f"{stored} bytes where the object has {expected}" if 0 <= stored != expected else None
                else:
                    why = None
                if why is not None:
                    self._reject(key, why)
                    results[i] = OBJECT_NOT_FOUND
        return results

    def _reject(self, key: str, why: str) -> None:
        self._rejections.note(key, why)
        # force: the get that found it holds a lease on it.
        removed = self.store.remove(key, True)
        if removed not in (0, OBJECT_NOT_FOUND):
            logger.warning("could not remove the rejected pool object %s (Mooncake error %s)", key, removed)

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
        results: list[int] = []
        for start in range(0, len(key_strs), TRAILER_SLOTS):
            end = start + TRAILER_SLOTS
            results += self._put_with_trailers(
                key_strs[start:end],
                buffer_ptrs[start:end],
                buffer_sizes[start:end],
                None if group_ids is None else group_ids[start:end],
                None if session_ids is None else session_ids[start:end],
            )
        return self._noted(results)

    def _put_with_trailers(
        self,
        keys: list[str],
        pointers: list[Any],
        sizes: list[Any],
        group_ids: list[str] | None,
        session_ids: list[str] | None,
    ) -> list[int]:
        with self._put_slots.held() as slots:
            layouts = [_parts(p, s) for p, s in zip(pointers, sizes, strict=True)]
            for i, (key, (ptrs, lens)) in enumerate(zip(keys, layouts, strict=True)):
                parts = [_memory(ptr, size) for ptr, size in zip(ptrs, lens, strict=True)]
                slots.view(i)[:] = pack_trailer(key, parts)
            # Always the multi-buffer put: SGLang's own picks it for list-valued pointers.
            return list(
                super()._put_batch_zero_copy_impl(
                    keys,
                    [[*ptrs, slots.address(i)] for i, (ptrs, _) in enumerate(layouts)],
                    [[*lens, TRAILER.size] for _, lens in layouts],
                    group_ids,
                    session_ids,
                )
            )

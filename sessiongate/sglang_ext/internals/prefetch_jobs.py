"""The prefetches under way in one scheduler (`PrefetchJobs`), on the scheduler's own thread.

A prefetch uses UnifiedRadixCache's own machinery, as a request's admission does, minus the
request: `match_prefix` (what is resident), `prefetch_from_storage` + `check_prefetch_progress`
(the cache controller's L3 -> host prefetch, its I/O on the controller's threads, so decode keeps
running), then `load_back` (host -> device) with a memory quota from `kv_budget`: device pages the
engine's running and queued requests will not need, free or ranked below the prefetch
(priority-based KV memory: `kv_ops.evictable_below`), which SGLang's eviction frees in rank order
as the load allocates. The tokens evicted for prefetches are counted by what they were. Nothing is
computed: pages found in no tier are counted unavailable. A storage failure is a miss: the cache
controller reports fewer completed tokens and the radix cache keeps only those.
"""

from __future__ import annotations

import logging
import time
import weakref
from array import array
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from sessiongate.sglang_ext.internals import kv_ops, pool_pages
from sessiongate.sglang_ext.internals.ipc import CallError
from sessiongate.sglang_ext.internals.load_guard import LoadGuard
from sessiongate.sglang_ext.kv_budget import DemandItem, device_prefetch_quota
from sessiongate.sglang_ext.kv_fate import KVFate, PrefetchMark
from sessiongate.sglang_ext.pool_probe import PoolProbe
from sessiongate.sglang_ext.prefetch_book import PrefetchBook, PrefetchRecord

__all__ = ["PrefetchJobs", "page_hashes", "token_ids_of"]

logger = logging.getLogger(__name__)

_POOL_CHECK_INTERVAL_S = 0.05
# Finished prefetches whose marked pages are remembered, for a cancel to end their hint.
_MAX_MARKED = 10_000
"""How often an `awaiting_pool` prefetch asks the pool whether it holds the context's pages yet."""

Phase = Literal["awaiting_pool", "storage", "resident", "awaiting_load", "load_back", "settled"]


@dataclass
class _Job:
    """Engine-side state of one running prefetch (mutable, scheduler thread only)."""

    handle: Any  # CacheRequestHandle
    token_ids: array[int]
    cache_salt: str | None
    phase: Phase
    load_node: Any = None
    resident_tokens: int = 0
    """Tokens of the context in the tree (device or host) before the prefetch: what lies beyond
    them is what the prefetch brought in."""
    pool_deadline: float = 0.0
    """`awaiting_pool`: until when (monotonic) to wait for the pool to hold the context's pages."""
    pool_hashes: list[str] | None = None
    pool_check: Future[int] | None = None
    """The pool's answer to "how many of the leading pages do you hold?", asked off this thread."""
    pool_checked_at: float = 0.0
    expected_at: float | None = None
    """When (monotonic) the request this prefetch is for is expected (None: at once)."""


@dataclass(frozen=True)
class _Residency:
    device_tokens: int
    host_tokens: int
    last_host_node: Any
    best_match_node: Any


def token_ids_of(body: dict[str, Any]) -> array[int]:
    """A call's context as the tree's key type: unpacked already (`handle_call`), or a JSON list (a direct call)."""
    token_ids = body["input_ids"]
    if isinstance(token_ids, array) and token_ids.typecode == "q":
        return token_ids
    return array("q", (int(token) for token in token_ids))


def page_hashes(body: dict[str, Any], token_ids: array[int], cache_salt: str | None, page_size: int) -> list[str]:
    """The context's L3 page hashes: computed by the HTTP process (`endpoints`), here only for a direct call."""
    hashes = body.get("page_hashes")
    if hashes is not None:
        return list(hashes)
    return pool_pages.context_page_hashes(token_ids, cache_salt, page_size)


class PrefetchJobs:
    """The prefetches under way on one scheduler and their bookkeeping; every method runs on its thread."""

    def __init__(self, scheduler: Any, fate: KVFate, fate_ordered: bool, pool_probe: PoolProbe) -> None:
        self._scheduler = scheduler
        self._fate = fate
        self._fate_ordered = fate_ordered
        self._pool_probe = pool_probe
        self._book = PrefetchBook()
        self._jobs: dict[str, _Job] = {}
        self.copies = LoadGuard(scheduler)
        self._attempts = 0
        # Device tokens evicted to make room for prefetches, by what they were (`KVFate.rank_class`).
        self.evicted_for_prefetch: dict[str, int] = {}
        # The pages each finished prefetch marked (held weakly), so that cancelling it ends its hint.
        self._marked: OrderedDict[str, list[tuple[weakref.ref[Any], PrefetchMark]]] = OrderedDict()

    def __bool__(self) -> bool:
        """Whether a prefetch is under way (the scheduler loop keeps polling while one is)."""
        return bool(self._jobs)

    def in_flight(self) -> int:
        return self._book.in_flight()

    def waiting_for_load(self) -> bool:
        return any(job.phase == "awaiting_load" for job in self._jobs.values())

    def abandon_failed_start(self, prefetch_id: str) -> None:
        """After an engine error in `start`: release what the cache controller holds for it."""
        job = self._jobs.pop(prefetch_id, None)
        if job is not None and job.phase == "storage":
            self._cache.release_aborted_request(job.handle)
        record = self._book.get(prefetch_id)
        if record is not None and not record.finished:
            self._book.put(record.updated(state="failed", error="engine error", finished_at=time.time()))

    def cancel_session(self, session_id: str) -> None:
        """Cancel the session's prefetches still under way (a drop: they would bring its pages back)."""
        for prefetch_id in list(self._jobs):
            record = self._book.get(prefetch_id)
            if record is not None and record.session_id == session_id:
                self.cancel(prefetch_id)

    # --- prefetch ----------------------------------------------------------------------------

    @property
    def _cache(self) -> Any:
        return self._scheduler.tree_cache

    @property
    def _page_size(self) -> int:
        return int(self._cache.page_size)

    def _bytes_per_token(self) -> int:
        controller = getattr(self._cache, "cache_controller", None)
        if controller is None:
            return 0
        return int(controller.mem_pool_host.size_per_token)

    def _residency(self, job: _Job) -> _Residency:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = RadixKey(token_ids=job.token_ids, extra_key=None, cache_salt=job.cache_salt)
        match = self._cache.match_prefix(MatchPrefixParams(key=key))
        return _Residency(
            device_tokens=int(match.device_prefix_len),
            host_tokens=int(match.host_hit_length),
            last_host_node=match.last_host_node,
            best_match_node=match.best_match_node,
        )

    def start(self, body: dict[str, Any]) -> PrefetchRecord:
        prefetch_id = str(body["prefetch_id"])
        if prefetch_id in self._book:
            raise CallError("conflict", f"prefetch {prefetch_id} exists")
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        token_ids = token_ids_of(body)
        self._attempts += 1
        job = _Job(
            handle=CacheRequestHandle(rid=f"sessiongate-prefetch-{prefetch_id}", attempt_id=self._attempts),
            token_ids=token_ids,
            cache_salt=body.get("cache_salt"),
            phase="resident",
        )
        if (expected_in_ms := body.get("expected_in_ms")) is not None:
            job.expected_at = time.monotonic() + int(expected_in_ms) / 1000
        page = self._page_size
        full_tokens = len(token_ids) // page * page
        residency = self._residency(job)
        record = PrefetchRecord(
            prefetch_id=prefetch_id,
            session_id=str(body["session_id"]),
            target=body["target"],
            tokens=len(token_ids),
            priority=int(body.get("priority", 0)),
            ttl_ms=int(body.get("ttl_ms", 30_000)),
            created_at=time.time(),
            pages_requested=(full_tokens - residency.device_tokens) // page,
        )
        matched = residency.device_tokens + residency.host_tokens
        job.resident_tokens = matched
        await_pool_s = int(body.get("await_pool_ms") or 0) / 1000
        if matched < full_tokens and await_pool_s > 0 and getattr(self._cache, "enable_storage", False):
            # The turn that computed the missing pages may have ended moments ago on another worker: wait (off this
            # thread) until the pool holds them all, or the deadline, before reading it.
            job.phase = "awaiting_pool"
            job.pool_deadline = time.monotonic() + await_pool_s
            job.pool_hashes = page_hashes(body, token_ids, job.cache_salt, self._page_size)
        else:
            self._start_storage(job, residency)
        self._book.put(record)
        self._jobs[prefetch_id] = job
        self._advance(prefetch_id)
        return self.record(prefetch_id)

    def _start_storage(self, job: _Job, residency: _Residency) -> None:
        """Read from the pool what the tree lacks of the context (the cache controller's L3 -> host prefetch)."""
        page = self._page_size
        full_tokens = len(job.token_ids) // page * page
        matched = residency.device_tokens + residency.host_tokens
        job.resident_tokens = matched
        job.phase = "resident"
        if matched < full_tokens and self._storage_can_extend(residency.last_host_node):
            self._cache.prefetch_from_storage(
                job.handle,
                residency.last_host_node,
                job.token_ids[matched:full_tokens],
                self._cache.get_last_hash_value(residency.last_host_node),
                self._cache.get_prefix_hash_values(residency.last_host_node)
                if self._cache.hicache_storage_pass_prefix_keys
                else None,
                matched_prefix_tokens=job.token_ids[:matched],
                extra_key=None,
                cache_salt=job.cache_salt,
            )
            if job.handle in self._cache.ongoing_prefetch:
                job.phase = "storage"

    def _pool_complete(self, job: _Job) -> bool:
        """`awaiting_pool`: whether to read the pool now (it holds every page, or the wait is over)."""
        now = time.monotonic()
        hashes = job.pool_hashes or []
        if now >= job.pool_deadline or not hashes:
            return True
        check = job.pool_check
        if check is not None and check.done():
            job.pool_check = None
            try:
                if check.result() >= len(hashes):
                    return True
            except Exception:  # the pool did not answer: read what it has when the wait is over
                logger.warning("sessiongate prefetch: the pool's existence check failed", exc_info=True)
        if job.pool_check is None and now - job.pool_checked_at >= _POOL_CHECK_INTERVAL_S:
            backend = self._cache.cache_controller.storage_backend
            job.pool_checked_at = now
            job.pool_check = self._pool_probe.submit(lambda: int(backend.batch_exists(hashes)))
        return False

    def _storage_can_extend(self, last_host_node: Any) -> bool:
        cache = self._cache
        if not getattr(cache, "enable_storage", False):
            return False
        # As the scheduler's own admission: a storage prefix continues a node that is backed up
        # (its hash chain is known) or starts at the root.
        return bool(cache.is_backuped(last_host_node) or cache.is_root(last_host_node))

    def record(self, prefetch_id: str) -> PrefetchRecord:
        record = self._book.get(prefetch_id)
        if record is None:
            raise CallError("not_found", f"no prefetch {prefetch_id}")
        return record

    def cancel(self, prefetch_id: str) -> PrefetchRecord:
        """Stop a prefetch under way; for one that finished, end its hint (the gateway's advisory is over with no
        use here): its pages no longer rank as a live hint's."""
        record = self.record(prefetch_id)
        if record.finished:
            marked = self._marked.pop(prefetch_id, ())
            self._fate.end_hint([(node, mark) for ref, mark in marked if (node := ref()) is not None], time.monotonic())
            return record
        job = self._jobs.pop(prefetch_id)
        if job.phase == "storage":
            self._cache.release_aborted_request(job.handle)
        record = self._measured(record, job).updated(state="cancelled", finished_at=time.time())
        self._book.put(record)
        return record

    def _measured(self, record: PrefetchRecord, job: _Job) -> PrefetchRecord:
        page = self._page_size
        residency = self._residency(job)
        full_pages = len(job.token_ids) // page
        device_pages = residency.device_tokens // page
        host_pages = residency.host_tokens // page
        return record.updated(
            pages_on_device=device_pages,
            pages_in_host=host_pages,
            pages_unavailable=max(full_pages - device_pages - host_pages, 0),
        )

    def _advance(self, prefetch_id: str) -> None:
        job = self._jobs[prefetch_id]
        record = self.record(prefetch_id)
        cache = self._cache
        if job.phase == "awaiting_pool":
            if not self._pool_complete(job):
                return
            self._start_storage(job, self._residency(job))
        if job.phase == "storage":
            if not cache.check_prefetch_progress(job.handle):
                return
            loaded = int(cache.pop_prefetch_loaded_tokens(job.handle))
            cache.finish_storage_prefetch_admission(job.handle, loaded, None)
            record = record.updated(bytes_loaded=record.bytes_loaded + loaded * self._bytes_per_token())
            job.phase = "resident"
        if job.phase == "resident":
            residency = self._residency(job)
            # Loads start from the tick, a bounded number at a time (`_start_loads`).
            job.phase = "awaiting_load" if record.target == "device" and residency.host_tokens > 0 else "settled"
        if job.phase == "load_back" and job.load_node not in cache.ongoing_load_back:
            job.phase = "settled"
        if job.phase == "settled":
            del self._jobs[prefetch_id]
            record = self._measured(record, job).updated(state="done", finished_at=time.time())
            try:
                self._mark_prefetched(job, record)
            except Exception:  # the prefetch is done; its pages merely rank as any others
                logger.exception("sessiongate prefetch %s: marking its pages failed", prefetch_id)
        self._book.put(record)

    def start_loads(self) -> None:
        """Start the host -> device loads of the prefetches waiting for one, as one copy.

        SGLang tracks a load's completion in a ring of `LayerDoneCounter.num_counters` (3) slots and
        asserts, on reuse, that the slot's previous copy has finished; its own batches take one slot
        each and rely on the next batches having waited for it. A copy no batch waits for can still
        be running when its slot comes round again, so prefetches take one slot at a time: a new one
        only once the previous prefetch copy is acknowledged and a slot is free; the rest wait here.
        Several prefetches waiting together share that one copy (SGLang merges queued loads).
        """
        waiting = [(prefetch_id, job) for prefetch_id, job in self._jobs.items() if job.phase == "awaiting_load"]
        if not waiting or self.copies.loading() or not self._cache.has_free_load_back_slot():
            return
        started = False
        for prefetch_id, job in waiting:
            residency = self._residency(job)
            record = self.record(prefetch_id)
            free = int(self._scheduler.token_to_kv_pool_allocator.available_size())
            quota = self._device_quota()
            # Walking the tree for what ranks below the prefetch is for when free pages alone cannot hold it.
            evictable = self._evictable(record.priority, job) if quota < residency.host_tokens else None
            if evictable is not None:
                quota = self._device_quota(evictable.tokens)
            if residency.host_tokens > 0 and self._cache.load_back(residency.best_match_node, mem_quota=quota):
                if evictable is not None:
                    for rank_class, tokens in evictable.classes_of_first(residency.host_tokens - free).items():
                        self.evicted_for_prefetch[rank_class] = self.evicted_for_prefetch.get(rank_class, 0) + tokens
                job.load_node = residency.best_match_node
                job.phase = "load_back"
                self.copies.add(job.load_node, job.token_ids, job.cache_salt, residency.device_tokens)
                loaded = residency.host_tokens * self._bytes_per_token()
                self._book.put(record.updated(bytes_loaded=record.bytes_loaded + loaded))
                started = True
            else:
                job.phase = "settled"
        if started:
            self._cache.ready_to_load_host_cache()

    def _mark_prefetched(self, job: _Job, record: PrefetchRecord) -> None:
        """The context's pages rank as a live hint's until a request uses them or the ttl passes: those this
        prefetch brought in, and those that were already here."""
        if not self._fate_ordered:
            return
        pages = kv_ops.session_pages(self._cache, job.token_ids, job.cache_salt)
        brought = [node for node, start in zip(pages.path, pages.starts, strict=True) if start >= job.resident_tokens]
        there = [node for node, start in zip(pages.path, pages.starts, strict=True) if start < job.resident_tokens]
        now, ttl_s = time.monotonic(), record.ttl_ms / 1000
        marks = self._fate.mark_prefetched(brought, record.priority, ttl_s, now, expected_at=job.expected_at)
        marks += self._fate.mark_prefetched(
            there, record.priority, ttl_s, now, expected_at=job.expected_at, brought=False
        )
        self._marked[record.prefetch_id] = [(weakref.ref(node), mark) for node, mark in marks]
        while len(self._marked) > _MAX_MARKED:  # the oldest hints have ended by their ttl anyway
            self._marked.popitem(last=False)

    def _evictable(self, priority: int, job: _Job) -> kv_ops.Evictable | None:
        """The device pages a prefetch of `priority` may displace (None where the eviction order is SGLang's own)."""
        if not self._fate_ordered:
            return None
        now = time.monotonic()
        expected_at = now if job.expected_at is None else job.expected_at
        return kv_ops.evictable_below(self._cache, self._fate, priority, now, expected_at)

    def _device_quota(self, evictable_tokens: int = 0) -> int:
        scheduler = self._scheduler
        demand = [
            DemandItem(req.sampling_params.max_new_tokens - len(req.output_ids))
            for req in scheduler.running_batch.reqs
            if req.sampling_params.max_new_tokens is not None
        ]
        demand += [
            DemandItem(len(req.origin_input_ids) + (req.sampling_params.max_new_tokens or 0))
            for req in scheduler.waiting_queue
        ]
        free = int(scheduler.token_to_kv_pool_allocator.available_size())
        return device_prefetch_quota(free, demand, self._page_size, evictable_tokens)

    def advance_all(self) -> None:
        for prefetch_id in list(self._jobs):
            try:
                self._advance(prefetch_id)
            except Exception as error:  # the engine raised: fail this prefetch, keep serving
                logger.exception("sessiongate prefetch %s failed", prefetch_id)
                job = self._jobs.pop(prefetch_id)
                if job.phase == "storage":
                    self._cache.release_aborted_request(job.handle)
                record = self.record(prefetch_id)
                self._book.put(record.updated(state="failed", error=repr(error), finished_at=time.time()))

    def settle_waiting_loads(self) -> None:
        """The loads failed to start: the prefetches waiting for one settle with what they have."""
        for job in self._jobs.values():
            if job.phase == "awaiting_load":
                job.phase = "settled"

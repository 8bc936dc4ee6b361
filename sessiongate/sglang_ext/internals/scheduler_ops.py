"""The extension's half that runs in each SGLang scheduler process, on the scheduler's own thread:
`SchedulerExtension`, which `scheduler_hooks` attaches to the scheduler and calls from the scheduler's loop
(its calls from the HTTP process, `tick` each loop iteration, a request's admission, a new prefill batch).

A prefetch uses UnifiedRadixCache's own machinery, as a request's admission does, minus the
request: `match_prefix` (what is resident), `prefetch_from_storage` + `check_prefetch_progress`
(the cache controller's L3 -> host prefetch, its I/O on the controller's threads, so decode keeps
running), then `load_back` (host -> device) with a memory quota from `kv_budget`: device pages the
engine's running and queued requests will not need, free or ranked below the prefetch
(priority-based KV memory: `kv_ops.evictable_below`), which SGLang's eviction frees in rank order
as the load allocates. The tokens evicted for prefetches are counted by what they were
(`prefetch_evicted_tokens` in the load report and on `/metrics`). Nothing is computed: pages found
in no tier are counted unavailable. A storage failure is a miss: the cache controller reports fewer
completed tokens and the radix cache keeps only those.

The fate of KV (`kv_fate.KVFate`, ranked into SGLang's own eviction by `kv_ops`): pages a
prefetch brought in are marked prefetched-unused (the prefetch's priority until its ttl passes,
then the lowest); `retain` raises a session's pages for a while; `drop` removes the session's own
pages from every tier. Marks that no longer matter are swept from the tick.
"""

from __future__ import annotations

import json
import logging
import time
from array import array
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sessiongate.sglang_ext.call_payload import unpack_hashes, unpack_tokens
from sessiongate.sglang_ext.internals import idle_wait, kv_ops
from sessiongate.sglang_ext.internals.ipc import SessiongateCall, SessiongateReply
from sessiongate.sglang_ext.internals.no_keep import NoKeepRequests
from sessiongate.sglang_ext.kv_budget import DemandItem, device_prefetch_quota
from sessiongate.sglang_ext.kv_fate import KVFate
from sessiongate.sglang_ext.load_metrics import LoadGauges
from sessiongate.sglang_ext.pool_janitor import PoolJanitor
from sessiongate.sglang_ext.pool_probe import PoolProbe
from sessiongate.sglang_ext.prefetch_book import PrefetchBook, PrefetchRecord
from sessiongate.sglang_ext.protocol import NO_KEEP_RID_PREFIX
from sessiongate.sglang_ext.rate_meter import RateMeter

__all__ = ["SchedulerExtension"]

logger = logging.getLogger(__name__)

_SAMPLE_INTERVAL_S = 0.05
RETAIN_POOL_WAIT_S = 0.01
"""The most a retain waits on the scheduler thread for the pool to say which of its pages it holds (then: 0)."""

Phase = Literal["awaiting_pool", "storage", "resident", "awaiting_load", "load_back", "settled"]


class CallError(Exception):
    """A call the scheduler refuses (unknown prefetch id, unknown op): its `code` goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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


@dataclass(frozen=True)
class _Copy:
    """A host -> device copy a prefetch started, until SGLang acknowledges it (scheduler thread only)."""

    node: Any
    token_ids: array[int]
    cache_salt: str | None
    start: int
    """Where the loaded pages begin in the context (tokens): a context's device-resident part is a
    prefix of it, so the load covers what follows."""
    verdicts: dict[str, bool] = field(default_factory=dict)
    """Per request id: does it read this copy's pages (`_reads_loading_pages`, decided once per request)."""


@dataclass(frozen=True)
class _Residency:
    device_tokens: int
    host_tokens: int
    last_host_node: Any
    best_match_node: Any


def _token_ids(body: dict[str, Any]) -> array[int]:
    """A call's context as the tree's key type: unpacked already (`handle_call`), or a JSON list (a direct call)."""
    token_ids = body["input_ids"]
    if isinstance(token_ids, array) and token_ids.typecode == "q":
        return token_ids
    return array("q", (int(token) for token in token_ids))


def _agree(request_ids: Any, context: array[int], first: int, end: int) -> bool:
    """Do a request's token ids (a list) and a context agree on [0, end)? The page at `first` decides most cases."""
    if list(request_ids[first:end]) != context[first:end].tolist():
        return False
    return array("q", request_ids[:first]) == context[:first]  # arrays of one type compare without Python objects


def _metrics_enabled() -> bool:
    from sglang.srt.runtime_context import get_observability

    return bool(get_observability().enable_metrics)


class SchedulerExtension:
    """Prefetch bookkeeping and counters for one scheduler; every method runs on its thread."""

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        self._book = PrefetchBook()
        self._jobs: dict[str, _Job] = {}
        self._copies: list[_Copy] = []
        self._pool_probe = PoolProbe(RETAIN_POOL_WAIT_S)
        self._janitor = PoolJanitor()  # pool deletions, off this thread
        self._prefill = RateMeter()
        self._decode = RateMeter()
        self._last_sample = 0.0
        self._last_settle = 0.0
        self._attempts = 0
        self._gauges = LoadGauges.create() if _metrics_enabled() else None
        self._fate = KVFate()
        self._fate_ordered = kv_ops.install_fate_order(self._cache, self._fate, time.monotonic)
        # Device tokens evicted to make room for prefetches, by what they were (`KVFate.rank_class`).
        self._evicted_for_prefetch: dict[str, int] = {}
        self._no_keep = NoKeepRequests(self._cache, self._fate, self._janitor) if self._fate_ordered else None

    # --- IPC ---------------------------------------------------------------------------------

    def handle_call(self, call: SessiongateCall) -> SessiongateReply:
        try:
            body = json.loads(call.body)
            if call.tokens:
                body["input_ids"] = unpack_tokens(call.tokens)  # one copy, no parse (`call_payload`)
            if call.hashes:
                body["page_hashes"] = unpack_hashes(call.hashes)
            if call.op == "start":
                result: dict[str, Any] = asdict(self.start(body))
            elif call.op == "status":
                result = asdict(self._record(body["prefetch_id"]))
            elif call.op == "cancel":
                result = asdict(self.cancel(body["prefetch_id"]))
            elif call.op == "stats":
                result = self.stats()
            elif call.op == "retain":
                result = self.retain(body)
            elif call.op == "drop":
                result = self.drop(body)
            elif call.op == "pool_deletion":
                result = self.pool_deletion(body)
            else:
                raise CallError("unknown_op", f"unknown operation {call.op!r}")
        except CallError as error:
            refusal = {"code": error.code, "message": str(error)}
            return SessiongateReply(rid=call.rid, ok=False, body=json.dumps(refusal))
        except Exception as error:  # an engine error must not end the scheduler's loop
            logger.exception("sessiongate call %s failed", call.op)
            self._abandon_failed_start(call)
            failure = {"code": "engine_error", "message": repr(error)}
            return SessiongateReply(rid=call.rid, ok=False, body=json.dumps(failure))
        return SessiongateReply(rid=call.rid, ok=True, body=json.dumps(result))

    def _abandon_failed_start(self, call: SessiongateCall) -> None:
        """After an engine error in `start`: release what the cache controller holds for it."""
        if call.op != "start":
            return
        prefetch_id = str(json.loads(call.body).get("prefetch_id"))
        job = self._jobs.pop(prefetch_id, None)
        if job is not None and job.phase == "storage":
            self._cache.release_aborted_request(job.handle)
        record = self._book.get(prefetch_id)
        if record is not None and not record.finished:
            self._book.put(record.updated(state="failed", error="engine error", finished_at=time.time()))

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

        token_ids = _token_ids(body)
        self._attempts += 1
        job = _Job(
            handle=CacheRequestHandle(rid=f"sessiongate-prefetch-{prefetch_id}", attempt_id=self._attempts),
            token_ids=token_ids,
            cache_salt=body.get("cache_salt"),
            phase="resident",
        )
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
            job.pool_hashes = self._page_hashes(body, token_ids, job.cache_salt)
        else:
            self._start_storage(job, residency)
        self._book.put(record)
        self._jobs[prefetch_id] = job
        self._advance(prefetch_id)
        return self._record(prefetch_id)

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
        if job.pool_check is None and now - job.pool_checked_at >= _SAMPLE_INTERVAL_S:
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

    def _record(self, prefetch_id: str) -> PrefetchRecord:
        record = self._book.get(prefetch_id)
        if record is None:
            raise CallError("not_found", f"no prefetch {prefetch_id}")
        return record

    def cancel(self, prefetch_id: str) -> PrefetchRecord:
        record = self._record(prefetch_id)
        if record.finished:
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
        record = self._record(prefetch_id)
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

    def _loading(self) -> list[_Copy]:
        """The prefetch copies not yet acknowledged (a cancelled prefetch's copy still runs)."""
        ongoing = self._cache.ongoing_load_back
        self._copies = [copy for copy in self._copies if copy.node in ongoing]
        return self._copies

    def _start_loads(self) -> None:
        """Start the host -> device loads of the prefetches waiting for one, as one copy.

        SGLang tracks a load's completion in a ring of `LayerDoneCounter.num_counters` (3) slots and
        asserts, on reuse, that the slot's previous copy has finished; its own batches take one slot
        each and rely on the next batches having waited for it. A copy no batch waits for can still
        be running when its slot comes round again, so prefetches take one slot at a time: a new one
        only once the previous prefetch copy is acknowledged and a slot is free; the rest wait here.
        Several prefetches waiting together share that one copy (SGLang merges queued loads).
        """
        waiting = [(prefetch_id, job) for prefetch_id, job in self._jobs.items() if job.phase == "awaiting_load"]
        if not waiting or self._loading() or not self._cache.has_free_load_back_slot():
            return
        started = False
        for prefetch_id, job in waiting:
            residency = self._residency(job)
            record = self._record(prefetch_id)
            free = int(self._scheduler.token_to_kv_pool_allocator.available_size())
            quota = self._device_quota()
            # Walking the tree for what ranks below the prefetch is for when free pages alone cannot hold it.
            evictable = self._evictable(record.priority) if quota < residency.host_tokens else None
            if evictable is not None:
                quota = self._device_quota(evictable.tokens)
            if residency.host_tokens > 0 and self._cache.load_back(residency.best_match_node, mem_quota=quota):
                if evictable is not None:
                    for rank_class, tokens in evictable.classes_of_first(residency.host_tokens - free).items():
                        self._evicted_for_prefetch[rank_class] = self._evicted_for_prefetch.get(rank_class, 0) + tokens
                job.load_node = residency.best_match_node
                job.phase = "load_back"
                self._copies.append(_Copy(job.load_node, job.token_ids, job.cache_salt, residency.device_tokens))
                loaded = residency.host_tokens * self._bytes_per_token()
                self._book.put(record.updated(bytes_loaded=record.bytes_loaded + loaded))
                started = True
            else:
                job.phase = "settled"
        if started:
            self._cache.ready_to_load_host_cache()

    def guard_new_batch(self, batch: Any) -> None:
        """Make a new prefill batch wait for the prefetch copies whose pages it reads.

        `load_back` puts the pages in the tree as device-resident at once, while the copy runs on
        the host-to-device stream. A request the scheduler loads for itself gets the batch's
        consumer index and the forward waits layer by layer; a request whose prefix a prefetch has
        already placed starts no load of its own and would read the pages half-written. Such a
        batch waits for the newest load on that stream, which finishes after every earlier one.
        """
        loading = self._loading()
        if batch is None or not loading or getattr(batch, "hicache_consumer_index", 0) >= 0:
            return
        if not any(self._reads_loading_pages(req, loading) for req in batch.reqs):
            return
        index = int(self._cache.cache_controller.layer_done_counter.producer_index)
        if index >= 0 and not self._cache.is_load_back_event_done(index):
            batch.hicache_consumer_index = index

    def _reads_loading_pages(self, req: Any, loading: list[_Copy]) -> bool:
        page = self._page_size
        prefix_len = int(getattr(req, "prefix_len", 0))
        for copy in loading:
            if prefix_len <= copy.start or req.cache_salt != copy.cache_salt:
                continue
            # The request's device prefix reaches past where the load begins; it goes through the
            # loaded nodes if it agrees with the prefetched context up to the first loaded page.
            # Decided once per request and copy (a chunked prefill meets the guard once per chunk), the
            # first loaded page first (64 tokens), the whole prefix compared in C only when that agrees.
            shared = min(prefix_len, copy.start + page)
            rid = str(req.rid)
            verdict = copy.verdicts.get(rid)
            if verdict is None:
                verdict = _agree(req.origin_input_ids, copy.token_ids, max(shared - page, 0), shared)
                copy.verdicts[rid] = verdict
            if verdict:
                return True
        return False

    def _mark_prefetched(self, job: _Job, record: PrefetchRecord) -> None:
        """The nodes this prefetch inserted go first under pressure until a request uses them."""
        if not self._fate_ordered:
            return
        pages = kv_ops.session_pages(self._cache, job.token_ids, job.cache_salt)
        brought = [node for node, start in zip(pages.path, pages.starts, strict=True) if start >= job.resident_tokens]
        self._fate.mark_prefetched(brought, record.priority, record.ttl_ms / 1000, time.monotonic())

    # --- session KV operations ---------------------------------------------------------------

    def _session_context(self, body: dict[str, Any]) -> tuple[array[int], str | None, kv_ops.SessionPages]:
        if not self._fate_ordered:
            raise CallError(
                "unsupported",
                "session KV operations need SGLang's UnifiedRadixCache with the Python tree core "
                f"({kv_ops.PYTHON_TREE_CORE_ENV[0]}={kv_ops.PYTHON_TREE_CORE_ENV[1]})",
            )
        token_ids = _token_ids(body)
        cache_salt = body.get("cache_salt")
        return token_ids, cache_salt, kv_ops.session_pages(self._cache, token_ids, cache_salt)

    def _page_hashes(self, body: dict[str, Any], token_ids: array[int], cache_salt: str | None) -> list[str]:
        """The context's L3 page hashes: computed by the HTTP process (`endpoints`), here only for a direct call."""
        hashes = body.get("page_hashes")
        if hashes is not None:
            return list(hashes)
        return kv_ops.context_page_hashes(token_ids, cache_salt, self._page_size)

    def _kv_result(self, body: dict[str, Any], operation: str, tokens: int, **tiers: int) -> dict[str, Any]:
        return {"session_id": str(body["session_id"]), "operation": operation, "tokens": tokens, **tiers}

    def retain(self, body: dict[str, Any]) -> dict[str, Any]:
        """Raise the session's pages to `priority` for `ttl_ms`; nothing is loaded or pinned."""
        token_ids, cache_salt, pages = self._session_context(body)
        ttl_s = int(body["ttl_ms"]) / 1000
        self._fate.hold(pages.nodes, int(body["priority"]), ttl_s, time.monotonic())
        device, host = kv_ops.tier_tokens(pages)
        hashes = self._page_hashes(body, token_ids, cache_salt)
        in_pool = kv_ops.pool_pages_present(self._cache, hashes, self._pool_probe) * self._page_size
        return self._kv_result(
            body, "retain", len(token_ids), device_tokens=device, host_tokens=host, storage_tokens=in_pool
        )

    def drop(self, body: dict[str, Any]) -> dict[str, Any]:
        """Remove the session's own pages from device, host and the pool (see `kv_ops`)."""
        token_ids, cache_salt, pages = self._session_context(body)
        session_id = str(body["session_id"])
        # A prefetch of the session still under way would bring its pages back.
        for prefetch_id in list(self._jobs):
            record = self._book.get(prefetch_id)
            if record is not None and record.session_id == session_id:
                self.cancel(prefetch_id)
        hashes = self._page_hashes(body, token_ids, cache_salt)
        floor = int(body.get("floor_tokens") or 0)
        outcome, pool_hashes = kv_ops.drop_pages(self._cache, self._fate, pages, hashes, floor_tokens=floor)
        try:
            # The files go on the janitor's thread: the reply carries its ticket, the caller asks for the outcome.
            ticket: str | None = self._janitor.submit(kv_ops.pool_page_deletion(self._cache, pool_hashes))
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

    def _evictable(self, priority: int) -> kv_ops.Evictable | None:
        """The device pages a prefetch of `priority` may displace (None where the eviction order is SGLang's own)."""
        if not self._fate_ordered:
            return None
        return kv_ops.evictable_below(self._cache, self._fate, priority, time.monotonic())

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

    # --- per iteration -----------------------------------------------------------------------

    def tick(self) -> None:
        if self._no_keep is not None and len(self._no_keep):
            # Their pages are looked for every few tens of milliseconds, not on every iteration of the loop.
            now = time.monotonic()
            if now - self._last_settle >= _SAMPLE_INTERVAL_S:
                self._last_settle = now
                try:
                    self._no_keep.settle(now)
                except Exception:  # the engine raised: the request's pages stay cached, keep serving
                    logger.exception("sessiongate no-keep upkeep failed")
        self._advance_all()
        if any(job.phase == "awaiting_load" for job in self._jobs.values()):
            try:
                self._start_loads()
            except Exception:  # the engine raised: these prefetches fail below, the engine keeps serving
                logger.exception("sessiongate prefetch loads failed to start")
                for job in self._jobs.values():
                    if job.phase == "awaiting_load":
                        job.phase = "settled"
            self._advance_all()  # those that settled instead of loading
        now = time.monotonic()
        if now - self._last_sample >= _SAMPLE_INTERVAL_S:
            self._last_sample = now
            self._sample()
            self._fate.sweep(now)

    def _advance_all(self) -> None:
        for prefetch_id in list(self._jobs):
            try:
                self._advance(prefetch_id)
            except Exception as error:  # the engine raised: fail this prefetch, keep serving
                logger.exception("sessiongate prefetch %s failed", prefetch_id)
                job = self._jobs.pop(prefetch_id)
                if job.phase == "storage":
                    self._cache.release_aborted_request(job.handle)
                record = self._record(prefetch_id)
                self._book.put(record.updated(state="failed", error=repr(error), finished_at=time.time()))

    def _sample(self) -> None:
        # Cumulative counters SGLang keeps per step (`Scheduler._record_step_counters`); their clocks are busy
        # time, so the meters give speeds while working (see `rate_meter`).
        scheduler = self._scheduler
        prefill_busy_s = getattr(scheduler, "total_prefill_busy_us", 0) / 1e6
        self._prefill.observe(prefill_busy_s, int(getattr(scheduler, "total_prefill_uncached_tokens", 0)))
        decode = getattr(scheduler, "decode_moment_totals", None) or [0.0] * 6  # steps, Σbatch, Σµs, .., Σtokens
        self._decode.observe(decode[2] / 1e6, int(decode[5]))
        if self._gauges is not None:
            self._gauges.update(self.stats())

    def admit_request(self, req: Any) -> None:
        """A request has just joined the waiting queue (once per request, not per loop iteration)."""
        # Only one that was queued (SGLang refuses some requests inside `_add_request_to_queue`).
        if self._no_keep is not None and str(req.rid).startswith(NO_KEEP_RID_PREFIX):
            if not any(queued is req for queued in self._scheduler.waiting_queue):
                return
            try:
                self._no_keep.admit([req], time.monotonic())
            except Exception:  # the engine raised: the request's pages stay cached, keep serving
                logger.exception("sessiongate no-keep admission failed")

    def moves_in_flight(self) -> bool:
        """KV copies the scheduler loop must keep polling for: the cache's own, and the prefetches'."""
        return bool(self._jobs) or idle_wait.cache_moves_in_flight(self._cache)

    def stats(self) -> dict[str, Any]:
        controller = getattr(self._cache, "cache_controller", None)
        host_total = host_used = None
        rejected = 0
        if controller is not None:
            host_pool = controller.mem_pool_host
            host_total = int(host_pool.size)
            host_used = host_total - int(host_pool.available_size())
            # Sessiongate's verified pools count what failed (`page_digest.Rejections`).
            rejected = int(getattr(getattr(controller, "storage_backend", None), "pages_rejected", 0))
        return {
            "device_kv_tokens_cached": int(self._cache.evictable_size()),
            "host_kv_tokens_total": host_total,
            "host_kv_tokens_used": host_used,
            "prefetches_in_flight": self._book.in_flight(),
            "prefetch_evicted_tokens": dict(self._evicted_for_prefetch),
            "pool_pages_rejected": rejected,
            "prefill_tokens_per_s": self._prefill.rate(self._prefill.clock),
            "decode_tokens_per_s": self._decode.rate(self._decode.clock),
        }

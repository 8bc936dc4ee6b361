"""The extension's half that runs in each SGLang scheduler process, on the scheduler's own thread:
`SchedulerExtension`, which `scheduler_hooks` attaches to the scheduler and calls from the scheduler's loop
(its calls from the HTTP process, `tick` each loop iteration, a request's admission, a new prefill batch).

It holds the scheduler's prefetches (`prefetch_jobs`), the session KV operations (`session_kv_ops`) and the
fate of KV (`kv_fate.KVFate`, ranked into SGLang's own eviction by `kv_ops`): pages a prefetch brought in are
marked prefetched-unused (the prefetch's priority until its ttl passes, then the lowest); `retain` raises a
session's pages for a while; `drop` removes the session's own pages from every tier. Marks that no longer
matter are swept from the tick, which also samples the engine's counters for the load report (with the pool
backend's own: its rejected pages and the timing of its calls, `pool_timing`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from typing import Any

from sessiongate.sglang_ext.call_payload import unpack_hashes, unpack_tokens
from sessiongate.sglang_ext.internals import idle_wait, kv_ops
from sessiongate.sglang_ext.internals.ipc import CallError, SessiongateCall, SessiongateReply
from sessiongate.sglang_ext.internals.no_keep import NoKeepRequests
from sessiongate.sglang_ext.internals.prefetch_jobs import PrefetchJobs
from sessiongate.sglang_ext.internals.session_kv_ops import SessionKVOps
from sessiongate.sglang_ext.kv_fate import KVFate
from sessiongate.sglang_ext.load_metrics import LoadGauges
from sessiongate.sglang_ext.pool_janitor import PoolJanitor
from sessiongate.sglang_ext.pool_probe import PoolProbe
from sessiongate.sglang_ext.pool_timing import PoolTiming
from sessiongate.sglang_ext.prefetch_book import PrefetchRecord
from sessiongate.sglang_ext.protocol import NO_KEEP_RID_PREFIX, PoolCallKind
from sessiongate.sglang_ext.rate_meter import RateMeter

__all__ = ["SchedulerExtension"]

logger = logging.getLogger(__name__)

_SAMPLE_INTERVAL_S = 0.05
RETAIN_POOL_WAIT_S = 0.01
"""The most a retain waits on the scheduler thread for the pool to say which of its pages it holds (then: 0)."""


def _metrics_enabled() -> bool:
    from sglang.srt.runtime_context import get_observability

    return bool(get_observability().enable_metrics)


class SchedulerExtension:
    """Prefetches, session KV operations and counters for one scheduler; every method runs on its thread."""

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        pool_probe = PoolProbe(RETAIN_POOL_WAIT_S)
        janitor = PoolJanitor()  # pool deletions, off this thread
        self._prefill = RateMeter()
        self._decode = RateMeter()
        self._last_sample = 0.0
        self._last_settle = 0.0
        self._gauges = LoadGauges.create() if _metrics_enabled() else None
        self._fate = KVFate()
        self._fate_ordered = kv_ops.install_fate_order(self._cache, self._fate, time.monotonic)
        self.prefetches = PrefetchJobs(scheduler, self._fate, self._fate_ordered, pool_probe)
        self.session_kv = SessionKVOps(
            self._cache, self._fate, self._fate_ordered, self.prefetches, pool_probe, janitor
        )
        self._no_keep = NoKeepRequests(self._cache, self._fate, janitor) if self._fate_ordered else None

    @property
    def _cache(self) -> Any:
        return self._scheduler.tree_cache

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
                result = asdict(self.prefetches.record(body["prefetch_id"]))
            elif call.op == "cancel":
                result = asdict(self.prefetches.cancel(body["prefetch_id"]))
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
            if call.op == "start":
                self.prefetches.abandon_failed_start(str(json.loads(call.body).get("prefetch_id")))
            failure = {"code": "engine_error", "message": repr(error)}
            return SessiongateReply(rid=call.rid, ok=False, body=json.dumps(failure))
        return SessiongateReply(rid=call.rid, ok=True, body=json.dumps(result))

    def start(self, body: dict[str, Any]) -> PrefetchRecord:
        return self.prefetches.start(body)

    def retain(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.session_kv.retain(body)

    def drop(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.session_kv.drop(body)

    def pool_deletion(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.session_kv.pool_deletion(body)

    def guard_new_batch(self, batch: Any) -> None:
        self.prefetches.copies.guard_new_batch(batch)

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
        self.prefetches.advance_all()
        if self.prefetches.waiting_for_load():
            try:
                self.prefetches.start_loads()
            except Exception:  # the engine raised: these prefetches settle below, the engine keeps serving
                logger.exception("sessiongate prefetch loads failed to start")
                self.prefetches.settle_waiting_loads()
            self.prefetches.advance_all()  # those that settled instead of loading
        now = time.monotonic()
        if now - self._last_sample >= _SAMPLE_INTERVAL_S:
            self._last_sample = now
            self._sample()
            self._fate.sweep(now)

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
        return bool(self.prefetches) or idle_wait.cache_moves_in_flight(self._cache)

    def stats(self) -> dict[str, Any]:
        controller = getattr(self._cache, "cache_controller", None)
        host_total = host_used = None
        rejected = 0
        pool_calls: dict[PoolCallKind, dict[str, Any]] = {}
        if controller is not None:
            host_pool = controller.mem_pool_host
            host_total = int(host_pool.size)
            host_used = host_total - int(host_pool.available_size())
            backend = getattr(controller, "storage_backend", None)
            # Sessiongate's verified pools count what failed (`page_digest.Rejections`) and time their calls
            # (`pool_timing`).
            rejected = int(getattr(backend, "pages_rejected", 0))
            timing = getattr(backend, "pool_timing", None)
            if isinstance(timing, PoolTiming):
                pool_calls = timing.report()
        return {
            "device_kv_tokens_cached": int(self._cache.evictable_size()),
            "host_kv_tokens_total": host_total,
            "host_kv_tokens_used": host_used,
            "prefetches_in_flight": self.prefetches.in_flight(),
            "prefetch_evicted_tokens": dict(self.prefetches.evicted_for_prefetch),
            "pool_pages_rejected": rejected,
            "pool_calls": pool_calls,
            "prefill_tokens_per_s": self._prefill.rate(self._prefill.clock),
            "decode_tokens_per_s": self._decode.rate(self._decode.clock),
        }

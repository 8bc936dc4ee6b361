"""One simulated worker (an SGLang engine with HiCache) and the shared KV pool, driven by an event loop.

The model, kept coarse on purpose so an hour of traffic on 16 workers simulates in seconds:

- KV per session is one prefix (sessions share no text), held per tier as a token count: the worker's device
  radix cache, its host tier (HiCache, written through when a turn ends), and the shared pool (L3, written
  through by the worker that computed it). Hits are whole pages (`page_tokens`). Eviction is LRU over whole
  session entries, and only of entries no running request uses; an evicted device entry survives in the host
  tier when there is one. Writes (device -> host -> pool) are free: they use the other direction of the links.
- A request is admitted first come, first served when its prompt and output fit in device memory (evicting
  cached entries, never running requests) and fewer than `max_running` run. Its prompt is split at admission
  by where each leading token is: device (free), host (a PCIe copy), pool (a NIC read into host, then PCIe), or
  nowhere (recomputed). Copies queue on two per-worker channels, `nic` and `pcie`, beside the compute: a
  request being loaded does not stop the others from running.
- Compute is continuous batching with chunked prefill: a step prefills up to `chunk_tokens` of the loaded
  requests (oldest first) and decodes one token of every running sequence; its time is
  `Calibration.step_s`. The first token comes at the end of the step that finishes the prefill. Steps with no
  prefill are merged: k decode steps (k = the fewest tokens any running request has left) are one event, cut
  short at the next step boundary when new prefill work arrives, so the event count grows with requests, not
  with tokens.
- An advisory prefetch brings the session's KV from the pool to host and, when asked for the device, from host
  to device, never taking device memory that a queued or running request holds or will need (`sglang_ext.kv_budget`).
  With priority-based KV memory (SYMPHONY's; the default) the prefetched KV ranks above every entry no live hint
  protects until its advisory expires, and the prefetch may evict those (eviction follows rank, then recency, in
  both tiers: `_Tier`); without it a prefetch takes free memory only. A request that finds its KV still on its
  way waits for it. A host -> device copy on a GPU runs layer by layer under the request's prefill, which hides
  up to the new tokens' compute time of it (SGLang's layer-wise load-back); on CPU workers it hides nothing.
- Workers that share a machine's cores with the front (`Machine`: our CPU workers) slow each other down: a step
  started while k of the other n-1 workers are computing takes `1 + (slowdown - 1) * k / (n - 1)` times as long
  (the calibration's measured prefill or decode slowdown), times `max(1, (k + 1 + front) / cores)`, where `front`
  is the cores the front's processes used over the last second (each turn charges its CPU when it is sent).
  The factor is fixed when the step starts. On CPU workers a KV copy also runs on the worker's core
  (`Calibration.moves_on_compute`): made while a step runs, it delays the next step by its duration; made while
  the core idles, it keeps the core busy until it is done. A request that finds cached tokens pays
  `hit_overhead_s` before its prefill.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sessiongate.gateway.routing import WorkerView

from .calibration import Calibration

__all__ = ["EventLoop", "Machine", "PrefetchResult", "Request", "SharedPool", "SimWorker"]


class EventLoop:
    """A min-heap of (time, sequence, callback, argument); equal times run in the order they were scheduled."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self.events = 0

    def at(self, time: float, callback: Callable[[Any], None], argument: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(time, self.now), self._seq, callback, argument))

    def run(self, progress: Callable[[float], None] | None = None) -> None:
        heap = self._heap
        while heap:
            time, _, callback, argument = heapq.heappop(heap)
            self.now = time
            self.events += 1
            callback(argument)
            if progress is not None and self.events % 4096 == 0:
                progress(time)


@dataclass(slots=True, eq=False)
class Request:
    session_id: str
    turn: int
    prompt: int
    output: int
    sent_s: float
    device: int = 0  # prompt tokens found per tier at admission; the rest are recomputed
    host: int = 0
    pool: int = 0
    reserved: int = 0
    prefilled: int = 0
    remaining: int = 0
    context: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    error: str | None = None
    worker: str = ""


@dataclass(frozen=True, slots=True)
class PrefetchResult:
    ready_s: float
    on_device: int  # the context's leading tokens on the device once it is done
    in_host: int  # further leading tokens in the host tier only (no free device room for them)
    bytes_loaded: int


class SharedPool:
    """The cluster's KV pool (L3): session prefixes, LRU, bounded in tokens."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self.used = 0
        self.entries: OrderedDict[str, int] = OrderedDict()

    def get(self, session_id: str) -> int:
        return self.entries.get(session_id, 0)

    def put(self, session_id: str, tokens: int) -> None:
        self.used -= self.entries.pop(session_id, 0)
        if tokens > self.capacity:
            return
        while self.used + tokens > self.capacity and self.entries:
            self.used -= self.entries.popitem(last=False)[1]
        self.entries[session_id] = tokens
        self.used += tokens


@dataclass(slots=True)
class Machine:
    """The workers that share one machine's cores with the front, which of them compute now, and the front's
    recent CPU."""

    workers: int
    cores: int
    window_s: float = 1.0
    busy: set[str] = field(default_factory=set)
    _front: deque[tuple[float, float]] = field(default_factory=deque)
    _front_cpu_s: float = 0.0

    def charge_front(self, now: float, cpu_s: float) -> None:
        self._front.append((now, cpu_s))
        self._front_cpu_s += cpu_s

    def front_cores(self, now: float) -> float:
        while self._front and self._front[0][0] <= now - self.window_s:
            self._front_cpu_s -= self._front.popleft()[1]
        return max(self._front_cpu_s, 0.0) / self.window_s

    def slowdown(self, worker_id: str, measured: float, now: float) -> float:
        others = len(self.busy - {worker_id})
        pair = 1.0 + (measured - 1.0) * others / (self.workers - 1) if self.workers > 1 else 1.0
        return pair * max(1.0, (others + 1 + self.front_cores(now)) / self.cores)


@dataclass(slots=True)
class _Step:
    start: float
    per_step: float
    steps: int
    prefill: list[tuple[Request, int]]
    generation: int


@dataclass(slots=True)
class _Tier:
    """One worker's tier: session prefixes in LRU order, with the time a prefetched one becomes usable, and the
    entries that rank above the rest until a time (`retained`: a live advisory's prefetch, or a `retain`).

    Eviction follows rank, then recency, as `sglang_ext.kv_fate` orders SGLang's own eviction: unranked entries
    first, least recently used first; then ranked ones, the one whose rank ends last first, least recently used
    among equals. A rank ends its advisory's ttl after the request it expects (the oracle's: at that request), so
    this is Belady's order on what the hints say, the worker's rule (`KVFate.eviction_rank`). A rank never pins:
    once only ranked entries are left, they go too. An expired rank is no rank."""

    capacity: int
    used: int = 0
    entries: OrderedDict[str, int] = field(default_factory=OrderedDict)
    ready_at: dict[str, float] = field(default_factory=dict)
    retained: dict[str, float] = field(default_factory=dict)

    def pop(self, session_id: str) -> int:
        tokens = self.entries.pop(session_id, 0)
        self.used -= tokens
        self.retained.pop(session_id, None)
        return tokens

    def ranked(self, session_id: str, now: float) -> bool:
        until = self.retained.get(session_id)
        return until is not None and until > now

    def unranked_tokens(self, now: float) -> int:
        """Tokens held by entries no live rank protects: what a ranked prefetch may displace."""
        return sum(tokens for sid, tokens in self.entries.items() if not self.ranked(sid, now))

    def victim(self, now: float) -> str:
        """The entry eviction takes next (the tier is not empty)."""
        ranked: str | None = None
        for session_id in self.entries:
            until = self.retained.get(session_id)
            if until is None or until <= now:
                return session_id
            if ranked is None or until > self.retained[ranked]:
                ranked = session_id
        assert ranked is not None
        return ranked

    def evict_one(self, now: float) -> tuple[str, int]:
        """Evict the lowest-ranked entry (see the class); returns it and its tokens."""
        gone = self.victim(now) if self.retained else next(iter(self.entries))
        tokens = self.entries.pop(gone)
        self.used -= tokens
        self.ready_at.pop(gone, None)
        self.retained.pop(gone, None)
        return gone, tokens

    def put(self, session_id: str, tokens: int, now: float = math.inf) -> None:
        """Insert (most recently used), evicting to make room (`now` decides which ranks still hold)."""
        self.pop(session_id)
        if tokens > self.capacity:
            return
        while self.used + tokens > self.capacity and self.entries:
            self.evict_one(now)
        self.entries[session_id] = tokens
        self.used += tokens


class SimWorker:
    def __init__(
        self,
        worker_id: str,
        cal: Calibration,
        loop: EventLoop,
        *,
        host_tier: bool,
        pool: SharedPool | None,
        on_done: Callable[[Request], None],
        bytes_moved: dict[str, int],
        machine: Machine | None = None,
    ) -> None:
        self.id = worker_id
        self.machine = machine
        self.cal = cal
        self.loop = loop
        self.pool = pool
        self.on_done = on_done
        self.bytes_moved = bytes_moved
        self.host = _Tier(cal.host_kv_tokens) if host_tier else None
        # Evictable device entries; `reserved` is the in-use rest.
        self.cached = _Tier(cal.device_kv_tokens)
        self.reserved = 0
        self.waiting: deque[Request] = deque()
        self.loading = 0
        self.prefill: deque[Request] = deque()
        self.decoding: list[Request] = []
        self.decode_kv = 0
        # Prompt tokens sent here and not yet computed or found cached (Dynamo's active prefill tokens).
        self.pending_prefill = 0
        self.nic_free_at = 0.0
        self.pcie_free_at = 0.0
        # `Calibration.moves_on_compute`: copies made while a step ran (the next step waits for them), and when the
        # core is done with copies made while it idled.
        self._compute_debt = 0.0
        self._core_free_at = 0.0
        self._step: _Step | None = None
        self._generation = 0
        self._in_use: set[str] = set()
        # Tokens a ranked prefetch evicted to make room, by tier (priority-based KV memory).
        self.prefetch_evictions = {"device": 0, "host": 0}

    # what the router sees

    def view(self) -> WorkerView:
        running = self.loading + len(self.prefill) + len(self.decoding)
        queued = len(self.waiting)
        return WorkerView(
            id=self.id,
            url=f"sim://{self.id}",
            in_flight=running + queued,
            running=running,
            queued=queued,
            active_prefill_tokens=self.pending_prefill,
            active_kv_tokens=self.decode_kv,
            device_kv_tokens=self.cal.device_kv_tokens,
        )

    # requests

    def submit(self, request: Request) -> None:
        request.worker = self.id
        if request.prompt + request.output > self.cal.device_kv_tokens:
            request.error = "context does not fit the device KV pool"
            request.done_s = self.loop.now
            self.on_done(request)
            return
        self.waiting.append(request)
        self.pending_prefill += request.prompt
        self._admit()

    def _device_free(self) -> int:
        return self.cal.device_kv_tokens - self.reserved - self.cached.used

    def _pages(self, tokens: int) -> int:
        return tokens // self.cal.page_tokens * self.cal.page_tokens

    def _admit(self) -> None:
        now = self.loop.now
        cal = self.cal
        admitted = False
        while self.waiting and self.loading + len(self.prefill) + len(self.decoding) < cal.max_running:
            request = self.waiting[0]
            sid = request.session_id
            need = request.prompt + request.output
            if need > cal.device_kv_tokens - self.reserved:
                break  # head of line waits for running requests to finish (cached entries can all be evicted)
            self.waiting.popleft()
            device_ready = self.cached.ready_at.pop(sid, now)
            own = self.cached.pop(sid)
            while self._device_free() < need and self.cached.entries:
                self.cached.evict_one(now)
            self.reserved += need
            self._in_use.add(sid)
            self._place(request, own, max(device_ready, now))
            admitted = True
        if admitted:
            self._kick()

    def _place(self, request: Request, own_device: int, device_ready: float) -> None:
        now = self.loop.now
        cal = self.cal
        sid = request.session_id
        usable = request.prompt - 1  # the last prompt token is always computed (it yields the first token)
        device = self._pages(min(own_device, usable))
        host_total = device
        host_ready = now
        if self.host is not None and sid in self.host.entries:
            self.host.entries.move_to_end(sid)
            host_total = max(self._pages(min(self.host.entries[sid], usable)), device)
            host_ready = self.host.ready_at.pop(sid, now)
        pool_total = host_total
        if self.pool is not None and sid in self.pool.entries:
            self.pool.entries.move_to_end(sid)
            pool_total = max(self._pages(min(self.pool.entries[sid], usable)), host_total)
        request.device, request.host, request.pool = device, host_total - device, pool_total - host_total
        request.prefilled = pool_total
        self.pending_prefill -= pool_total
        request.reserved = request.prompt + request.output
        bytes_per_token = cal.kv_bytes_per_token
        ready = max(now, device_ready)
        copy_from = now
        if request.pool:
            start = max(now, self.nic_free_at)
            self.nic_free_at = copy_from = start + self._copy_s(
                cal.pool_to_host_latency_s, request.pool * bytes_per_token / cal.pool_to_host_bytes_per_s
            )
            self.bytes_moved["pool->host"] += request.pool * bytes_per_token
            if self.host is not None:
                self.host.put(sid, pool_total, now)
        to_device = request.host + request.pool
        if to_device:
            start = max(copy_from, self.pcie_free_at, host_ready)
            copy_s = self._copy_s(
                cal.host_to_device_latency_s, to_device * bytes_per_token / cal.host_to_device_bytes_per_s
            )
            self.pcie_free_at = start + copy_s
            # SGLang loads a request's host pages layer by layer under its prefill (the forward of layer i waits
            # for layer i's pages only), so a GPU hides the copy behind the new tokens' compute; on our CPU
            # workers the copy runs on the core that computes and hides nothing.
            new = request.prompt - pool_total
            hidden = 0.0 if cal.moves_on_compute else min(copy_s, cal.prefill_after_s(new, pool_total))
            ready = max(start + copy_s - hidden, ready)
            self.bytes_moved["host->device"] += to_device * bytes_per_token
        if pool_total > 0:
            ready = max(ready, now) + cal.hit_overhead_s
        if ready > now:
            self.loading += 1
            self.loop.at(ready, self._loaded, request)
        else:
            self.prefill.append(request)

    def _loaded(self, request: Request) -> None:
        self.loading -= 1
        self.prefill.append(request)
        self._kick()

    # compute

    def _kick(self) -> None:
        step = self._step
        if step is None:
            self._start_step()
        elif not step.prefill and step.steps > 1 and self.prefill:
            # New prefill work: end the merged decode steps at the next step boundary.
            done = min(max(int((self.loop.now - step.start) / step.per_step) + 1, 1), step.steps)
            if done < step.steps:
                step.steps = done
                self._generation += 1
                step.generation = self._generation
                self.loop.at(step.start + done * step.per_step, self._step_end, self._generation)

    def _start_step(self) -> None:
        cal = self.cal
        decoding = len(self.decoding)
        parts: list[tuple[Request, int]] = []
        if self.prefill:
            budget = cal.chunk_tokens
            pairs = 0.0
            for request in self.prefill:
                take = min(request.prompt - request.prefilled, budget)
                pairs += take * (request.prefilled + take / 2)
                parts.append((request, take))
                budget -= take
                if budget == 0:
                    break
            per_step = cal.step_s(cal.chunk_tokens - budget + decoding, pairs, self.decode_kv, decoding)
            per_step *= self._shared(cal.shared_prefill_slowdown)
            steps = 1
        elif decoding:
            steps = min(r.remaining for r in self.decoding)
            mean_kv = self.decode_kv + decoding * (steps - 1) / 2
            per_step = cal.step_s(decoding, 0.0, round(mean_kv), decoding) * self._shared(cal.shared_decode_slowdown)
        else:
            self._step = None
            if self.machine is not None:
                self.machine.busy.discard(self.id)
            return
        self._generation += 1
        start = max(self.loop.now, self._core_free_at) + self._compute_debt
        self._compute_debt = 0.0
        self._step = _Step(start, per_step, steps, parts, self._generation)
        self.loop.at(start + steps * per_step, self._step_end, self._generation)

    def _copy_s(self, latency_s: float, transfer_s: float) -> float:
        """A KV copy's duration. On CPU workers it runs on the worker's core: a step running meanwhile shares the
        core with it (the next step starts that much later), an idle core is busy with it from now."""
        seconds = latency_s + transfer_s
        if self.cal.moves_on_compute:
            if self._step is not None:
                self._compute_debt += seconds
            else:
                self._core_free_at = max(self._core_free_at, self.loop.now) + seconds
        return seconds

    def _shared(self, measured: float) -> float:
        """This step's slowdown from the machine's other busy workers; this worker counts as busy from now."""
        if self.machine is None:
            return 1.0
        factor = self.machine.slowdown(self.id, measured, self.loop.now)
        self.machine.busy.add(self.id)
        return factor

    def _step_end(self, generation: int) -> None:
        step = self._step
        if step is None or generation != step.generation:
            return  # superseded by a shortened step
        now = self.loop.now
        finished: list[Request] = []
        if self.decoding:
            k = step.steps
            still: list[Request] = []
            for request in self.decoding:
                request.remaining -= k
                request.context += k
                (finished if request.remaining <= 0 else still).append(request)
            self.decode_kv += k * len(self.decoding)
            self.decoding = still
        for request, take in step.prefill:
            request.prefilled += take
            self.pending_prefill -= take
            if request.prefilled >= request.prompt:
                self.prefill.remove(request)
                request.first_token_s = now
                if request.output <= 1:
                    finished.append(request)
                else:
                    request.remaining = request.output - 1
                    request.context = request.prompt + 1
                    self.decode_kv += request.context
                    self.decoding.append(request)
        self._step = None
        for request in finished:
            self._finish(request)
        self._admit()
        if self._step is None:
            self._start_step()

    def _finish(self, request: Request) -> None:
        if request.context:
            self.decode_kv -= request.context
        request.done_s = self.loop.now
        sid = request.session_id
        self.reserved -= request.reserved
        self._in_use.discard(sid)
        kept = request.prompt + request.output
        self.cached.put(sid, kept, self.loop.now)  # the radix cache keeps what the turn computed; no room is freed
        if self.host is not None:
            self.host.put(sid, kept, self.loop.now)
        if self.pool is not None:
            self.pool.put(sid, kept)
        self.on_done(request)

    # session KV operations

    def retain(self, session_id: str, until: float, *, host: bool = False) -> tuple[int, int]:
        """`POST .../retain`: the session's device entry (and with `host` its host entry) outranks unretained ones
        until `until` (never a pin). Returns the tokens found (device, host), as the extension's `KVOpResult` does."""
        device = self.cached.entries.get(session_id, 0)
        if device:
            self.cached.retained[session_id] = until
        in_host = self.host.entries.get(session_id, 0) if self.host is not None else 0
        if host and in_host and self.host is not None:
            self.host.retained[session_id] = until
        return device, max(in_host - device, 0)

    # advisory prefetch

    def unrank(self, session_id: str) -> None:
        """An advisory withdrawn or cancelled: its prefetched KV ranks as any other from now."""
        self.cached.retained.pop(session_id, None)
        if self.host is not None:
            self.host.retained.pop(session_id, None)

    def prefetch(self, session_id: str, target: str, rank_until: float | None = None) -> PrefetchResult:
        """Bring the session's KV closer (pool -> host, then host -> device when asked and there is room).

        Without `rank_until` a prefetch takes only memory nobody uses (`sglang_ext.kv_budget`'s old rule: it never
        evicts). With it (priority-based KV memory: a live advisory's rank, until its expiry) the prefetched entry
        ranks above every entry no live hint or retain protects, and the prefetch may evict those to make room: in
        host, as any insert does, and on the device beyond the free pages, but never the memory that the queued
        requests need (running ones hold theirs already)."""
        now = self.loop.now
        cal = self.cal
        bytes_per_token = cal.kv_bytes_per_token
        device = self.cached.entries.get(session_id, 0)
        if session_id in self._in_use or self.host is None:
            return PrefetchResult(now, device, 0, 0)
        in_host = self.host.entries.get(session_id, 0)
        ready = max(now, self.host.ready_at.get(session_id, now))
        loaded = 0
        in_pool = self._pages(self.pool.get(session_id)) if self.pool is not None else 0
        if rank_until is not None:
            # The hint ranks what is already here too (the session's last turn ran on this worker), as the worker does.
            if in_host:
                self.host.retained[session_id] = rank_until
            if device:
                self.cached.retained[session_id] = rank_until
        if in_pool > max(in_host, device):
            start = max(now, self.nic_free_at)
            self.nic_free_at = ready = start + self._copy_s(
                cal.pool_to_host_latency_s, (in_pool - in_host) * bytes_per_token / cal.pool_to_host_bytes_per_s
            )
            loaded += (in_pool - in_host) * bytes_per_token
            self.bytes_moved["pool->host"] += (in_pool - in_host) * bytes_per_token
            before = self.host.used
            self.host.put(session_id, in_pool, now)
            self.prefetch_evictions["host"] += max(before + in_pool - in_host - self.host.used, 0)
            if rank_until is not None:
                self.host.retained[session_id] = rank_until
            self.host.ready_at[session_id] = ready
            in_host = in_pool
        if target == "device" and in_host > device:
            demand = sum(r.prompt + r.output for r in self.waiting)
            extra = in_host - device
            room = self._device_free() - demand
            if rank_until is not None:
                room += self.cached.unranked_tokens(now) - (0 if self.cached.ranked(session_id, now) else device)
            if self._pages(room) >= extra:
                self.cached.pop(session_id)
                while self._device_free() - demand < in_host:
                    _, tokens = self.cached.evict_one(now)
                    self.prefetch_evictions["device"] += tokens
                start = max(ready, self.pcie_free_at)
                self.pcie_free_at = ready = start + self._copy_s(
                    cal.host_to_device_latency_s, extra * bytes_per_token / cal.host_to_device_bytes_per_s
                )
                loaded += extra * bytes_per_token
                self.bytes_moved["host->device"] += extra * bytes_per_token
                self.cached.put(session_id, in_host, now)
                if rank_until is not None:
                    self.cached.retained[session_id] = rank_until
                self.cached.ready_at[session_id] = ready
                device = in_host
        return PrefetchResult(ready, device, max(in_host - device, 0), loaded)

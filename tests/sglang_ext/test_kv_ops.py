"""The fate of KV on SGLang 0.5.23's real cache classes, in-process on CPU (no server).

A `UnifiedRadixCache` with the Python tree core, a host tier and a `file` L3 pool, driven by the
scheduler-side extension itself (`SchedulerExtension`, over a stand-in for the scheduler that
holds the real cache): prefetches from the pool, retain and drop. Eviction is SGLang's own
(`cache.evict`), so what leaves first is what its strategy, ranked by `KVFate`, puts first.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import time
import uuid
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sessiongate.sglang_ext.internals.patches import PATCH_GROUPS, cpu_patches

PAGE = 4
DEVICE_TOKENS = 96
_tokens = itertools.count(1)


@pytest.fixture(scope="module")
def sglang_cache_classes(cpu_compat: bool) -> None:
    """HiCache's host tier needs the CPU layer's `hicache` patches, and only those (the attention ones are not
    applied: other tests in this process compare against SGLang's own attention code)."""
    if not cpu_compat:
        return
    for module_name, patches in cpu_patches(disabled=set(PATCH_GROUPS) - {"hicache"}).items():
        module = importlib.import_module(module_name)
        for patch in patches:
            patch(module)


@dataclass
class Worker:
    """One scheduler's cache and its sessiongate extension."""

    cache: Any
    allocator: Any
    extension: Any
    pool: Path
    cleanups: list[Any] = field(default_factory=list)

    def insert(self, tokens: list[int], priority: int = 1) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        value = self.allocator.alloc(len(tokens))
        assert value is not None, "the device pool is full"
        self.cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value, priority=priority))
        self.settle()

    def settle(self, timeout: float = 10.0) -> None:
        """Run the cache's background work (write-through, pool writes, loads) to completion."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.cache.check_hicache_events()
            self.cache.drain_storage_control_queues()
            if not (self.cache.ongoing_write_through or self.cache.ongoing_backup or self.cache.ongoing_load_back):
                return
            time.sleep(0.01)
        raise AssertionError("the cache's transfers did not finish")

    def tiers(self, tokens: list[int]) -> tuple[int, int]:
        """Tokens of `tokens` on the device and in host memory (prefixes), without touching them."""
        from sessiongate.sglang_ext.internals import kv_ops

        return kv_ops.tier_tokens(kv_ops.session_pages(self.cache, array("q", tokens), None))

    def pool_pages(self, tokens: list[int]) -> int:
        from sessiongate.sglang_ext.internals import pool_pages

        hashes = pool_pages.context_page_hashes(array("q", tokens), None, PAGE)
        return sum(1 for page in hashes if any(self.pool.glob(f"{page}*.bin")))

    def evict(self, tokens: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.cache.evict(EvictParams(num_tokens=tokens))
        self.settle()

    def use(self, tokens: list[int]) -> None:
        """What a request's admission does first: match the prefix."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))

    def prefetch(
        self,
        tokens: list[int],
        priority: int = 1,
        ttl_ms: int = 60_000,
        target: str = "device",
        expected_in_ms: int | None = None,
    ) -> Any:
        body = {
            "prefetch_id": uuid.uuid4().hex,
            "session_id": "s",
            "input_ids": tokens,
            "priority": priority,
            "ttl_ms": ttl_ms,
            "target": target,
            "expected_in_ms": expected_in_ms,
        }
        record = self.extension.start(body)
        deadline = time.monotonic() + 10
        while not record.finished and time.monotonic() < deadline:
            self.cache.check_hicache_events()
            self.extension.tick()
            record = self.extension.prefetches.record(record.prefetch_id)
            time.sleep(0.01)
        assert record.state == "done", record
        return record

    def kv_op(self, operation: str, tokens: list[int], priority: int = 1, ttl_ms: int = 60_000) -> dict[str, Any]:
        body = {"session_id": "s", "input_ids": tokens, "priority": priority, "ttl_ms": ttl_ms}
        result: dict[str, Any] = getattr(self.extension, operation)(body)
        ticket = result.pop("pool_deletion", None)
        deadline = time.monotonic() + 10
        while ticket is not None:  # the pool's files go on the janitor's thread; the HTTP process asks as here
            deleted = self.extension.pool_deletion({"ticket": ticket})
            if deleted["done"]:
                result["storage_tokens"] = deleted["storage_tokens"]
                break
            assert time.monotonic() < deadline, "the pool deletion did not finish"
            time.sleep(0.005)
        self.settle()
        return result


def _server_args() -> Any:
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(
        model_path="dummy",
        page_size=PAGE,
        enable_hierarchical_cache=True,
        hicache_ratio=2,
        hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct",
        hicache_write_policy="write_through",
        hicache_storage_backend="file",
        hicache_storage_prefetch_policy="wait_complete",
        radix_eviction_policy="priority",
    )


def make_worker(pool: Path) -> Worker:
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    from sessiongate.sglang_ext.internals.kv_ops import PYTHON_TREE_CORE_ENV
    from sessiongate.sglang_ext.internals.scheduler_ops import SchedulerExtension

    server_args = _server_args()
    set_global_server_args_for_scheduler(server_args)
    requests = ReqToTokenPool(size=8, max_context_len=512, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        size=DEVICE_TOKENS,
        page_size=PAGE,
        dtype=torch.float16,
        head_num=1,
        head_dim=8,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(
        size=DEVICE_TOKENS, dtype=torch.float16, device="cpu", kvcache=kv_pool, need_sort=False
    )
    params = CacheInitParams(
        req_to_token_pool=requests,
        token_to_kv_pool_allocator=allocator,
        page_size=PAGE,
        disable=False,
        tree_components=(ComponentType.FULL,),
        eviction_policy="priority",
    )
    name, value = PYTHON_TREE_CORE_ENV
    with getattr(envs, name).override(value):
        cache = UnifiedRadixCache(params=params)
    with (
        get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1),
        envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.override(str(pool)),
    ):
        cache.init_hicache(server_args, params)
    atexit.unregister(cache.shutdown)  # stopped by the fixture instead
    cache.write_through_threshold = 1  # back every insert up at once (host, then pool)
    cache.prefetch_threshold = PAGE
    scheduler = SimpleNamespace(
        tree_cache=cache,
        running_batch=SimpleNamespace(reqs=[]),
        waiting_queue=[],
        token_to_kv_pool_allocator=allocator,
    )
    return Worker(cache, allocator, SchedulerExtension(scheduler), pool)


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    directory = tmp_path / "pool"
    directory.mkdir()
    return directory


@pytest.fixture
def workers(sglang_cache_classes: None, pool: Path) -> Iterator[tuple[Worker, Worker]]:
    """`consumer` (under test) and `producer`, which fills the shared pool."""
    consumer, producer = make_worker(pool), make_worker(pool)
    try:
        yield consumer, producer
    finally:
        for worker in (consumer, producer):
            worker.cache.shutdown()
            worker.cache.release_host_resources()


def context(pages: int, prefix: list[int] | None = None) -> list[int]:
    """Fresh token ids: `pages` whole pages after `prefix`."""
    return [*(prefix or []), *(next(_tokens) for _ in range(pages * PAGE))]


def in_pool_only(producer: Worker, pages: int) -> list[int]:
    tokens = context(pages)
    producer.insert(tokens)
    assert producer.pool_pages(tokens) == pages
    return tokens


def test_extension_orders_evictions(workers: tuple[Worker, Worker]) -> None:
    consumer, _ = workers
    assert consumer.extension._fate_ordered
    assert type(consumer.cache.tree_core).__name__ == "UnifiedTreeCore"


def test_low_priority_then_unhinted_kv_leave_the_device_before_a_live_hint(workers: tuple[Worker, Worker]) -> None:
    consumer, producer = workers
    session = context(4)
    consumer.insert(session, priority=1)  # the oldest: plain LRU would take it first
    hinted = in_pool_only(producer, 4)
    prefetched = consumer.prefetch(hinted, priority=1)
    assert prefetched.pages_on_device == 4
    one_off = context(4)
    consumer.insert(one_off, priority=0)

    consumer.evict(4 * PAGE)
    assert consumer.tiers(one_off)[0] == 0  # priority 0 first
    assert consumer.tiers(hinted)[0] == 4 * PAGE
    assert consumer.tiers(session)[0] == 4 * PAGE

    consumer.evict(4 * PAGE)
    assert consumer.tiers(session)[0] == 0  # same priority, but no live hint expects it: next
    assert consumer.tiers(hinted)[0] == 4 * PAGE  # the live hint's pages go last
    assert consumer.tiers(session)[1] == 4 * PAGE  # still in host memory: nothing lost, only demoted


def test_a_used_prefetch_ranks_as_a_session(workers: tuple[Worker, Worker]) -> None:
    consumer, producer = workers
    hinted = in_pool_only(producer, 4)
    consumer.prefetch(hinted, priority=1)
    session = context(4)
    consumer.insert(session, priority=1)
    consumer.use(hinted)  # the session the hint was for arrived: now the most recently used

    consumer.evict(4 * PAGE)
    assert consumer.tiers(session)[0] == 0
    assert consumer.tiers(hinted)[0] == 4 * PAGE


def test_with_more_live_hints_than_host_memory_the_first_expected_keep_their_pages(
    workers: tuple[Worker, Worker],
) -> None:
    # Typing hints for 14 sessions of 4 pages arrive one after another; host memory holds 12 such sessions, and
    # other sessions' turns keep coming. The hints' requests come in the order the hints did, so the oldest
    # hints' pages must stay (when the hint that ends soonest went first, the oldest three were the ones lost).
    # One hint, made first, says its request comes in a minute (a long tool): it goes before all of them.
    consumer, producer = workers
    contexts = []
    for _ in range(15):
        contexts.append(in_pool_only(producer, 4))
        producer.evict(4 * PAGE)  # the producer's own device stays small
    later, hints = contexts[0], contexts[1:]
    assert consumer.prefetch(later, target="host", expected_in_ms=60_000).pages_in_host == 4
    for tokens in hints:
        assert consumer.prefetch(tokens, target="host").pages_in_host == 4
    for _ in range(4):
        consumer.insert(context(4))
        consumer.evict(4 * PAGE)

    in_host = [consumer.tiers(tokens)[1] // PAGE for tokens in hints]
    assert in_host[:10] == [4] * 10, in_host
    assert consumer.tiers(later)[1] == 0
    assert in_host[-1] == 0, in_host  # the newest hint's pages went with the room


def test_a_hint_for_kv_already_on_the_worker_protects_it_as_a_prefetched_one(workers: tuple[Worker, Worker]) -> None:
    # The commonest hint: the session's last turn ran here and its pages are still on the device. The prefetch
    # brings nothing, but its pages must rank as the hint's (they ranked as an idle session's, the oldest first).
    consumer, _ = workers
    session = context(4)
    consumer.insert(session)
    record = consumer.prefetch(session, ttl_ms=300)
    assert (record.pages_on_device, record.pages_requested) == (4, 0)
    newer = context(4)
    consumer.insert(newer)  # another session's turn, after the hint: more recently used

    consumer.evict(4 * PAGE)
    assert consumer.tiers(newer)[0] == 0  # no hint expects it: it goes first
    assert consumer.tiers(session)[0] == 4 * PAGE

    # Past the ttl the pages rank as the session's own again (not below everything, as a wrong hint's loaded pages).
    later = context(4)
    consumer.insert(later)
    time.sleep(0.4)
    consumer.extension.tick()
    consumer.evict(4 * PAGE)
    assert consumer.tiers(session)[0] == 0  # the least recently used now
    assert consumer.tiers(later)[0] == 4 * PAGE


def test_cancelling_a_finished_prefetch_ends_its_hint(workers: tuple[Worker, Worker]) -> None:
    # The advisory is over with no use here (its turn went to another worker): its pages go first, not last.
    consumer, producer = workers
    hinted = in_pool_only(producer, 4)
    record = consumer.prefetch(hinted)
    assert record.pages_on_device == 4
    session = context(4)
    consumer.insert(session)  # an idle session, unhinted

    assert consumer.extension.prefetches.cancel(record.prefetch_id).state == "done"
    consumer.evict(4 * PAGE)
    assert consumer.tiers(hinted)[0] == 0  # the wrong hint's pages left first
    assert consumer.tiers(session)[0] == 4 * PAGE


def test_unused_prefetch_decays_to_the_lowest_priority_after_its_ttl(workers: tuple[Worker, Worker]) -> None:
    consumer, producer = workers
    hinted = in_pool_only(producer, 3)
    consumer.prefetch(hinted, priority=5, ttl_ms=300)
    session = context(3)
    consumer.insert(session, priority=1)

    consumer.evict(3 * PAGE)  # within its ttl the hint keeps its priority, above the session's
    assert consumer.tiers(session)[0] == 0
    assert consumer.tiers(hinted)[0] == 3 * PAGE

    later = context(3)
    consumer.insert(later, priority=1)
    time.sleep(0.4)
    consumer.extension.tick()  # the sweep keeps the unused mark (it is what holds the hint low)
    consumer.evict(3 * PAGE)
    assert consumer.tiers(hinted)[0] == 0  # decayed below a priority-1 session
    assert consumer.tiers(later)[0] == 3 * PAGE


def test_retain_raises_a_session_until_its_ttl(workers: tuple[Worker, Worker]) -> None:
    consumer, _ = workers
    kept = context(3)
    consumer.insert(kept, priority=1)
    other = context(3)
    consumer.insert(other, priority=2)
    result = consumer.kv_op("retain", kept, priority=3, ttl_ms=300)
    assert (result["device_tokens"], result["host_tokens"]) == (3 * PAGE, 3 * PAGE)
    assert result["storage_tokens"] == 3 * PAGE
    assert result["operation"] == "retain"

    consumer.evict(3 * PAGE)
    assert consumer.tiers(other)[0] == 0  # 2 < 3: the retained session stayed
    assert consumer.tiers(kept)[0] == 3 * PAGE

    third = context(3)
    consumer.insert(third, priority=2)
    time.sleep(0.4)
    consumer.evict(3 * PAGE)
    assert consumer.tiers(kept)[0] == 0  # back to its own priority 1: nothing pinned
    assert consumer.tiers(third)[0] == 3 * PAGE


def test_drop_removes_the_session_from_every_tier_and_keeps_the_shared_prefix(
    workers: tuple[Worker, Worker],
) -> None:
    from sessiongate.sglang_ext.internals import pool_pages

    consumer, _ = workers
    system = context(2)
    first = context(3, prefix=system)
    second = context(3, prefix=system)
    consumer.insert(first)
    consumer.insert(second)
    assert consumer.pool_pages(first) == consumer.pool_pages(second) == 5

    result = consumer.kv_op("drop", first)
    assert result == {
        "session_id": "s",
        "operation": "drop",
        "tokens": len(first),
        "device_tokens": 3 * PAGE,
        "host_tokens": 3 * PAGE,
        "storage_tokens": 3 * PAGE,
    }
    # The first session's own pages are gone from device, host and pool...
    assert consumer.tiers(first) == (2 * PAGE, 2 * PAGE)
    assert consumer.pool_pages(first) == 2
    # ...and the system prompt they shared, and the other session, are untouched.
    assert consumer.tiers(second) == (5 * PAGE, 5 * PAGE)
    assert consumer.pool_pages(second) == 5
    second_pages = pool_pages.context_page_hashes(array("q", second), None, PAGE)
    assert consumer.cache.cache_controller.storage_backend.batch_exists(second_pages) == 5


def test_drop_takes_the_output_that_continues_the_context(workers: tuple[Worker, Worker]) -> None:
    consumer, _ = workers
    turn = context(3)
    answered = context(2, prefix=turn)  # the turn's prompt and its output, as a request leaves them
    consumer.insert(answered)
    result = consumer.kv_op("drop", turn)
    assert (result["device_tokens"], result["host_tokens"], result["storage_tokens"]) == (5 * PAGE,) * 3
    assert consumer.tiers(answered) == (0, 0)
    assert consumer.pool_pages(answered) == 0


def test_drop_of_a_fork_whose_last_page_is_rendered_otherwise(workers: tuple[Worker, Worker]) -> None:
    # Two forks of one parent context, each with its own turn. The gateway sends a session's context with its last
    # answer rendered by the chat template, whose last page differs from the tokens the turn generated (the end of
    # the message): the fork's own pages still go, the parent's and the sibling's stay.
    consumer, _ = workers
    parent = context(2)
    fork = context(3, prefix=parent)
    sibling = context(3, prefix=parent)
    consumer.insert(fork)
    consumer.insert(sibling)
    rendered = fork[:-PAGE] + context(1)
    result = consumer.kv_op("drop", rendered)
    assert (result["device_tokens"], result["host_tokens"], result["storage_tokens"]) == (3 * PAGE,) * 3
    assert consumer.tiers(fork) == (2 * PAGE, 2 * PAGE)
    assert consumer.tiers(sibling) == (5 * PAGE, 5 * PAGE)
    assert consumer.pool_pages(sibling) == 5
    # A context that differs earlier than its last page is another session's: nothing of the tree is its own.
    assert consumer.kv_op("drop", sibling[: 3 * PAGE] + context(2))["device_tokens"] == 0
    assert consumer.tiers(sibling) == (5 * PAGE, 5 * PAGE)


def test_drop_of_a_fork_whose_own_part_is_one_page_rendered_otherwise(workers: tuple[Worker, Worker]) -> None:
    # A fork whose own task and answer fill one page: rendered back, that page matches its node's only in its first
    # half. The node sharing the longest token prefix with it is the fork's; its sibling shares none.
    consumer, _ = workers
    parent = context(2)
    fork = context(1, prefix=parent)
    sibling = context(1, prefix=parent)
    consumer.insert(fork)
    consumer.insert(sibling)
    rendered = fork[: 2 * PAGE + PAGE // 2] + context(1)[: PAGE // 2]
    result = consumer.kv_op("drop", rendered)
    assert (result["device_tokens"], result["host_tokens"]) == (PAGE, PAGE)
    assert consumer.tiers(fork) == (2 * PAGE, 2 * PAGE)
    assert consumer.tiers(sibling) == (3 * PAGE, 3 * PAGE)
    assert consumer.pool_pages(sibling) == 3


def test_a_forks_drop_keeps_what_it_shares_with_its_parent(workers: tuple[Worker, Worker]) -> None:
    # The last fork standing: nothing in the tree says the parent's pages are another session's (their node has the
    # fork's alone below it), the floor does.
    consumer, _ = workers
    parent = context(2)
    fork = context(2, prefix=parent)
    consumer.insert(parent)  # the parent's turns came first, the fork's after
    consumer.insert(fork)
    body = {"session_id": "s", "input_ids": fork, "priority": 1, "ttl_ms": 60_000, "floor_tokens": 2 * PAGE}
    result = consumer.extension.drop(body)
    assert (result["device_tokens"], result["host_tokens"]) == (2 * PAGE, 2 * PAGE)
    assert consumer.tiers(fork) == (2 * PAGE, 2 * PAGE)  # the parent's two pages stay, in every tier
    assert consumer.pool_pages(parent) == 2
    assert consumer.kv_op("drop", parent)["device_tokens"] == 2 * PAGE  # without a floor: the parent goes too


def test_drop_deletes_pool_pages_this_worker_never_held(workers: tuple[Worker, Worker]) -> None:
    consumer, producer = workers
    turn = context(3)
    consumer.insert(turn)
    later = context(2, prefix=turn)
    producer.insert(later)  # the next turn ran on another worker: here it is in the pool only
    result = consumer.kv_op("drop", later)
    assert (result["device_tokens"], result["host_tokens"]) == (3 * PAGE, 3 * PAGE)
    assert result["storage_tokens"] == 5 * PAGE
    assert consumer.pool_pages(later) == 0


def test_drop_keeps_pages_a_running_request_holds(workers: tuple[Worker, Worker]) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    consumer, _ = workers
    running = context(3)
    consumer.insert(running)
    match = consumer.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", running))))
    lock = consumer.cache.inc_lock_ref(match.last_device_node)  # as a running request does
    try:
        result = consumer.kv_op("drop", running)
        assert (result["device_tokens"], result["host_tokens"], result["storage_tokens"]) == (0, 0, 0)
        assert consumer.tiers(running) == (3 * PAGE, 3 * PAGE)
        assert consumer.pool_pages(running) == 3
    finally:
        consumer.cache.dec_lock_ref(match.last_device_node, lock.to_dec_params())
    assert consumer.kv_op("drop", running)["device_tokens"] == 3 * PAGE


def test_drop_of_an_unknown_context_changes_nothing(workers: tuple[Worker, Worker]) -> None:
    consumer, _ = workers
    session = context(3)
    consumer.insert(session)
    result = consumer.kv_op("drop", context(2))
    assert (result["device_tokens"], result["host_tokens"], result["storage_tokens"]) == (0, 0, 0)
    assert consumer.tiers(session) == (3 * PAGE, 3 * PAGE)
    assert consumer.pool_pages(session) == 3


def test_a_no_keep_request_leaves_only_the_prefix_it_shared(
    workers: tuple[Worker, Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sessiongate.sglang_ext.internals import no_keep
    from sessiongate.sglang_ext.protocol import NO_KEEP_RID_PREFIX

    monkeypatch.setattr(no_keep, "SETTLE_S", 0.2)
    consumer, _ = workers
    system = context(2)
    consumer.insert(system)  # cached before: shared, and it stays
    prompt = context(3, prefix=system)
    output = context(1)
    finished = False
    request = SimpleNamespace(
        rid=f"{NO_KEEP_RID_PREFIX}turn-1",
        origin_input_ids=prompt,
        output_ids=output,
        cache_salt=None,
        extra_key=None,
        finished=lambda: finished,
    )
    assert consumer.extension._no_keep is not None
    scheduler = consumer.extension._scheduler
    scheduler.waiting_queue = [request]
    consumer.extension.admit_request(request)  # it arrives (SGLang's `_add_request_to_queue`, hooked)
    scheduler.waiting_queue = []
    consumer.insert(prompt + output)  # what the request leaves in the tree, written through to host

    assert consumer.tiers(prompt + output) == (6 * PAGE, 6 * PAGE)
    assert consumer.pool_pages(prompt + output) == 2  # its own pages never reached the pool

    finished = True
    deadline = time.monotonic() + 10
    while consumer.extension._no_keep and time.monotonic() < deadline:
        consumer.extension.tick()
        consumer.settle()
        time.sleep(0.02)
    assert not consumer.extension._no_keep
    assert consumer.tiers(prompt + output) == (2 * PAGE, 2 * PAGE)  # the shared prefix, nothing of its own
    assert consumer.pool_pages(system) == 2

"""What the extension costs SGLang's scheduler thread per operation, for one long context (issue 28, part 5).

Every figure is the scheduler-thread part of one operation on a context of `--tokens` tokens (default 128k,
`--page-size` 64), before and after the work moved off that thread, with SGLang 0.5.23's own classes where the
operation uses them (its `file` pool backend `HiCacheFile`, `StorageExistenceCache`, the page hashing
`get_storage_hash_str`, a `UnifiedRadixCache` with the Python tree core for eviction) and the extension's own
functions (`call_payload`, `kv_ops`, `pool_janitor`, `scheduler_ops`):

- `parse`: a call's context. Before: the JSON body with `input_ids` parsed and turned into an `array("q")`;
  after: a small JSON body and the token ids unpacked from bytes (`call_payload`);
- `hash`: the context's L3 page hashes (retain, drop, no-keep). Before: computed on the scheduler; after:
  received from the HTTP process as one string, split;
- `drop delete`: a drop's pool page files (one `unlink` each, all present). Before: every unlink on the
  scheduler; after: SGLang's existence record updated there and the unlinks queued to the janitor's thread
  (`pool_janitor`; the HTTP process asks for the outcome, the scheduler never waits);
- `retain pool check`: which of the context's pages the pool holds (`batch_exists`, one `stat` each), waited for
  at most the probe's bound (before 50 ms, after `scheduler_ops.RETAIN_POOL_WAIT_S`): the longest of the repeats;
- `race guard`: does a new prefill request read a prefetch's pages still loading. Before: the request's and the
  context's token lists compared as Python lists on every new batch; after: the first loaded page, then the
  prefix as arrays, once per request (`_agree`), and a dictionary look-up on later batches (chunked prefill);
- `eviction`: SGLang's Python tree core ranks every evictable device leaf on each eviction (a heap over all of
  them): one eviction with `--leaves` evictable leaves, with SGLang's `priority` strategy alone and with
  sessiongate's rank in front of it (`kv_ops._FateOrder`), and `_FateOrder.get_priority` per leaf.

    python -m sessiongate.benchmarks.scheduler_thread                      # 128k tokens, 10^5 leaves
    python -m sessiongate.benchmarks.scheduler_thread --tokens 32768 --leaves 20000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from array import array
from collections.abc import Callable
from typing import Any

__all__ = ["main"]


def _ms(
    run: Callable[[], object],
    repeats: int,
    setup: Callable[[], object] | None = None,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> float:
    """Median (or `statistic`) wall time of `run` in ms over `repeats` (each after `setup`, untimed)."""
    samples = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistic(samples)


def parse_and_hash(tokens: list[int], page: int, repeats: int) -> list[tuple[str, float, float]]:
    from sessiongate.sglang_ext.call_payload import pack_hashes, pack_tokens, unpack_hashes, unpack_tokens
    from sessiongate.sglang_ext.internals import pool_pages

    fields = {"session_id": "s", "cache_salt": None, "priority": 1, "ttl_ms": 30_000}
    legacy_body = json.dumps({**fields, "input_ids": tokens})
    small_body, packed = json.dumps(fields), pack_tokens(tokens)
    context = array("q", tokens)
    hashes = pool_pages.context_page_hashes(context, None, page)
    packed_hashes = pack_hashes(hashes)

    def parse_before() -> None:
        body = json.loads(legacy_body)
        array("q", (int(token) for token in body["input_ids"]))

    def parse_after() -> None:
        json.loads(small_body)
        unpack_tokens(packed)

    return [
        ("parse", _ms(parse_before, repeats), _ms(parse_after, repeats)),
        (
            "hash",
            _ms(lambda: pool_pages.context_page_hashes(context, None, page), repeats),
            _ms(lambda: unpack_hashes(packed_hashes), repeats),
        ),
    ]


def pool_operations(tokens: list[int], page: int, repeats: int) -> list[tuple[str, float, float]]:
    import torch

    from sessiongate.sglang_ext.internals import pool_pages
    from sessiongate.sglang_ext.internals.bench_rigs import file_pool
    from sessiongate.sglang_ext.internals.scheduler_ops import RETAIN_POOL_WAIT_S
    from sessiongate.sglang_ext.pool_janitor import PoolJanitor
    from sessiongate.sglang_ext.pool_probe import PoolProbe

    hashes = pool_pages.context_page_hashes(array("q", tokens), None, page)
    page_value = torch.zeros(1024, dtype=torch.uint8)  # the file's size does not change an unlink's cost
    rows = []
    with tempfile.TemporaryDirectory(prefix="scheduler-thread-") as directory:
        backend, cache = file_pool(directory)

        def write_pages() -> None:
            for page_hash in hashes:
                backend.set(page_hash, page_value)

        janitor = PoolJanitor()
        tickets: list[str] = []

        def idle_janitor_and_pages() -> None:
            while tickets and janitor.outcome(tickets[-1]) is None:
                time.sleep(0.001)
            write_pages()

        before = _ms(lambda: pool_pages.delete_pool_pages(cache, hashes), repeats, setup=write_pages)
        after = _ms(
            lambda: tickets.append(janitor.submit(pool_pages.pool_page_deletion(cache, hashes))),
            repeats,
            setup=idle_janitor_and_pages,
        )
        rows.append(("drop delete", before, after))
        idle_janitor_and_pages()

        write_pages()
        rows.append(("retain pool check (pool's own time)", _ms(lambda: backend.batch_exists(hashes), repeats), 0.0))

        def probed(wait_s: float) -> float:
            probe = PoolProbe(wait_s)
            # The longest wait: a question still running makes the next ones answer at once.
            figure = _ms(lambda: pool_pages.pool_pages_present(cache, hashes, probe), repeats, statistic=max)
            probe.close()
            time.sleep(0.2)  # the question left running finishes before the next one
            return figure

        rows.append(("retain pool check", probed(0.05), probed(RETAIN_POOL_WAIT_S)))
    return rows


def race_guard(tokens: list[int], page: int, repeats: int) -> list[tuple[str, float, float]]:
    from sessiongate.sglang_ext.internals.load_guard import _agree

    context = array("q", tokens)
    request_ids = [*tokens, 1, 2, 3]  # the next turn: the context and a few new tokens
    shared = len(tokens) // page * page  # a prefix reaching the last loaded page
    verdicts: dict[str, bool] = {}

    def before() -> None:
        assert list(request_ids[:shared]) == list(context[:shared])

    def after_first() -> None:
        assert _agree(request_ids, context, shared - page, shared)

    def after_again() -> None:
        verdict = verdicts.get("rid")
        if verdict is None:
            verdicts["rid"] = _agree(request_ids, context, shared - page, shared)

    after_again()
    return [
        ("race guard (first batch of a request)", _ms(before, repeats), _ms(after_first, repeats)),
        ("race guard (its later chunks)", _ms(before, repeats), _ms(after_again, repeats)),
    ]


def eviction(leaves: int, repeats: int) -> list[tuple[str, float, float]]:
    """One eviction over `leaves` evictable leaves: SGLang's strategy alone, then with sessiongate's rank."""
    from sessiongate.sglang_ext.internals import kv_ops
    from sessiongate.sglang_ext.internals.bench_rigs import python_core_radix_cache
    from sessiongate.sglang_ext.kv_fate import KVFate

    fanout = 100
    rig = python_core_radix_cache(leaves + leaves // fanout + 1024)
    cache = rig.cache
    # `leaves` contexts of two tokens under `leaves / fanout` shared first tokens: as many evictable leaves.
    started = time.perf_counter()
    for index in range(leaves):
        key = array("q", [index // fanout + 1, index % fanout + 1])
        rig.insert(key, priority=1)
    core = cache.tree_core
    assert len(core.evictable_device_leaves) >= leaves * 0.99
    print(f"({leaves} leaves inserted in {time.perf_counter() - started:.1f} s)", flush=True)

    base = _ms(rig.evict_one, repeats)
    fate = KVFate()
    assert kv_ops.install_fate_order(cache, fate, time.monotonic)
    order = core.eviction_strategy
    after = _ms(rig.evict_one, repeats)
    core.eviction_strategy = _LegacyFateOrder(order.base, fate, time.monotonic)
    before = _ms(rig.evict_one, repeats)
    core.eviction_strategy = order
    nodes = list(core.evictable_device_leaves)

    def keys(strategy: Any) -> Callable[[], None]:
        def rank_all() -> None:
            for node in nodes:
                strategy.get_priority(node)

        return rank_all

    legacy = _LegacyFateOrder(order.base, fate, time.monotonic)
    base_keys = _ms(keys(order.base), repeats)
    return [
        (f"eviction, {len(nodes)} evictable leaves, SGLang's key alone", base, base),
        (f"eviction, {len(nodes)} evictable leaves, with sessiongate's rank", before, after),
        (f"  keys alone: SGLang's get_priority x {len(nodes)}", base_keys, base_keys),
        (
            f"  keys alone: sessiongate's get_priority x {len(nodes)}",
            _ms(keys(legacy), repeats),
            _ms(keys(order), repeats),
        ),
    ]


class _LegacyFateOrder:
    """`kv_ops._FateOrder` before issue 28: every node through the fate's tables, the clock read per node."""

    def __init__(self, base: Any, fate: Any, clock: Callable[[], float]) -> None:
        self.base = base
        self._fate = fate
        self._clock = clock

    def get_priority(self, node: Any) -> tuple[Any, ...]:
        return (*self._fate.eviction_rank(node, self._clock()), self.base.get_priority(node))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--leaves", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-eviction", action="store_true")
    parser.add_argument("--eviction-only", action="store_true", help="only the eviction rows")
    args = parser.parse_args(argv)

    from sessiongate.sglang_ext.cpu_compat import activate
    from sessiongate.sglang_ext.hardware import has_cuda

    if not has_cuda():
        activate(patch_sglang=False)
    tokens = [(index * 7919) % 49152 for index in range(args.tokens)]
    rows = []
    if not args.eviction_only:
        rows += parse_and_hash(tokens, args.page_size, args.repeats)
        rows += pool_operations(tokens, args.page_size, args.repeats)
        rows += race_guard(tokens, args.page_size, args.repeats)
    if not args.skip_eviction:
        rows += eviction(args.leaves, args.repeats)
    print(f"{args.tokens} tokens, page {args.page_size}, median of {args.repeats}, scheduler-thread ms")
    print("| operation | before | after |")
    print("|---|---|---|")
    for name, before, after in rows:
        print(f"| {name} | {before:.2f} | {after:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

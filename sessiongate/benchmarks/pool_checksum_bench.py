"""What verifying every pool page costs: SGLang's `file` backend (`file-unchecked`) against sessiongate's
verified `file` pool (the default: an xxh3-64 digest of each page's key and bytes, `internals.page_digest`).

Both backends run in-process on the same kind of directory, with the calls the HiCache controller makes (`set`
of a page on write-through, `exists` + `get` into a host page on a prefetch). For each page size: write `--pages`
pages, then read them all back `--repeats` times, alternating between the backends (from the OS page cache, as on
a machine whose pool directory fits in memory); the figures are the median per-page times (and the best repeat's,
which other load on the machine disturbs least), the throughput they imply, and the read-path overhead (verified
read / unchecked read - 1, of the medians and of the best). A difference of two medians is noisy on a loaded
machine, so the digest is also timed alone, on pages just copied into a host page (`digest alone`): that, over
the unchecked read, is what verification adds to a read, whatever else the machine is doing. Pages are random
float32 values (the digest costs the same on any bytes).

    python -m sessiongate.benchmarks.pool_checksum_bench --repeats 5          # 64 KiB (tiny) and 1 MiB (medium) pages
    python -m sessiongate.benchmarks.pool_checksum_bench --page-kib 512 --pages 256 --repeats 5

`--through-worker` measures the same two backends inside real SGLang CPU workers instead, on a prefetch of a
session's context from the pool into host memory (`pool_checksum_worker`), and writes a report under
`benchmarks/results/pool-checksum-worker/`:

    python -m sessiongate.benchmarks.pool_checksum_bench --through-worker --model-size tiny --repeats 7
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BACKENDS = ("file-unchecked", "file")


def _per_page_us(run: Callable[[], None], pages: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / pages * 1e6


def _pages(page_bytes: int, pages: int) -> list[Any]:
    import torch

    return [torch.randn(page_bytes // 4, dtype=torch.float32) for _ in range(pages)]


def measure(page_bytes: int, pages: int, repeats: int) -> dict[str, dict[str, float]]:
    """Write then read `pages` pages of `page_bytes` with each of `BACKENDS`, each on a directory of its own; the
    reads alternate between the backends, repeat by repeat, so that a change in the machine's load falls on both."""
    import torch

    from sessiongate.sglang_ext.internals.storage_config import file_store

    values = _pages(page_bytes, pages)
    target = torch.empty(page_bytes // 4, dtype=torch.float32)
    keys = [f"page-{i}" for i in range(pages)]
    figures: dict[str, dict[str, float]] = {}
    reads: dict[str, list[float]] = {name: [] for name in BACKENDS}
    with contextlib.ExitStack() as stack:
        stores = {
            name: file_store(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="pool-bench-")), verified=name == "file"
            )
            for name in BACKENDS
        }
        for name, store in stores.items():

            def write(store: Any = store) -> None:
                for key, value in zip(keys, values, strict=True):
                    assert store.set(key, value)

            write_us = _per_page_us(write, pages)
            figures[name] = {"write_us": write_us, "write_gbps": page_bytes / write_us / 1e3}
        for _ in range(repeats):
            for name, store in stores.items():

                def read(store: Any = store) -> None:
                    for key in keys:
                        assert store.exists(key)
                        assert store.get(key, target) is not None

                reads[name].append(_per_page_us(read, pages))
    for name in BACKENDS:
        read_us = statistics.median(reads[name])
        figures[name].update(read_us=read_us, read_best_us=min(reads[name]), read_gbps=page_bytes / read_us / 1e3)
    return figures


def digest_us(page_bytes: int, pages: int, repeats: int) -> tuple[float, float]:
    """The verification alone, per page, the median and the best repeat: each page is first copied into one host
    page (untimed, as a read lands it there), then the digest of its key and bytes is taken from it."""
    import torch

    from sessiongate.sglang_ext.internals.page_digest import pack_trailer

    values = _pages(page_bytes, pages)
    target = torch.empty(page_bytes // 4, dtype=torch.float32)
    view = target.numpy().data.cast("B")

    def run() -> float:
        spent = 0.0
        for i, value in enumerate(values):
            target.numpy()[:] = value.numpy()  # one thread, as the read's copy
            started = time.perf_counter()
            pack_trailer(f"page-{i}", [view])
            spent += time.perf_counter() - started
        return spent / pages * 1e6

    times = [run() for _ in range(repeats)]
    return statistics.median(times), min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--page-kib", type=int, nargs="+", default=[64, 128, 1024])
    parser.add_argument("--pages", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    worker = parser.add_argument_group("--through-worker: in real SGLang CPU workers (pool_checksum_worker)")
    worker.add_argument("--through-worker", action="store_true")
    worker.add_argument("--model-size", choices=("tiny", "medium"), default="tiny")
    worker.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096], help="tokens")
    worker.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/pool-checksum-worker/MODEL")
    worker.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.through_worker:
        from sessiongate.benchmarks import pool_checksum_worker

        return pool_checksum_worker.run(args, digest_us)

    from sessiongate.sglang_ext.cpu_compat import activate
    from sessiongate.sglang_ext.hardware import has_cuda

    if not has_cuda():
        activate(patch_sglang=False)
    print(
        "| page | backend | write us/page | write GB/s | read us/page (median / best) | read GB/s (median) "
        "| read overhead (median / best) |"
    )
    print("|---|---|---|---|---|---|---|")
    for page_kib in args.page_kib:
        page_bytes = page_kib * 1024
        measured = measure(page_bytes, args.pages, args.repeats)
        unchecked = measured["file-unchecked"]
        for name, figures in measured.items():
            overhead = (
                f"{(figures['read_us'] / unchecked['read_us'] - 1) * 100:+.1f}% / "
                f"{(figures['read_best_us'] / unchecked['read_best_us'] - 1) * 100:+.1f}%"
                if name == "file"
                else "-"
            )
            print(
                f"| {page_kib} KiB | {name} | {figures['write_us']:.0f} | {figures['write_gbps']:.2f} "
                f"| {figures['read_us']:.0f} / {figures['read_best_us']:.0f} | {figures['read_gbps']:.2f} "
                f"| {overhead} |",
                flush=True,
            )
        alone, alone_best = digest_us(page_bytes, args.pages, args.repeats)
        print(
            f"| {page_kib} KiB | digest alone (xxh3-64) | | | {alone:.1f} / {alone_best:.1f} "
            f"| {page_bytes / alone / 1e3:.2f} | {alone / unchecked['read_us'] * 100:.1f}% / "
            f"{alone_best / unchecked['read_best_us'] * 100:.1f}% of an unchecked read |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

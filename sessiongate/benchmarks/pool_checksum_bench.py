"""What verifying every pool page costs: SGLang's `file` backend (`file-unchecked`) against sessiongate's
verified `file` pool (the default: an xxh3-64 digest of each page's key and bytes, `internals.page_digest`).

Both backends run in-process on the same kind of directory, with the calls the HiCache controller makes (`set`
of a page on write-through, `exists` + `get` into a host page on a prefetch). For each page size: write `--pages`
pages, then read them all back `--repeats` times (from the OS page cache, as on a machine whose pool directory
fits in memory); the figures are the median per-page times, the throughput they imply, and the read-path
overhead (verified read / unchecked read - 1). A difference of two medians is noisy on a loaded machine, so the
digest is also timed alone over the same pages (`digest us/page`): that, over the unchecked read, is the
overhead verification adds to a read, whatever else the machine is doing. Pages are random float32 values (the
digest costs the same on any bytes).

    python -m sessiongate.benchmarks.pool_checksum_bench --repeats 5          # 128 KiB (tiny) and 1 MiB (medium) pages
    python -m sessiongate.benchmarks.pool_checksum_bench --page-kib 512 --pages 256 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

BACKENDS = ("file-unchecked", "file")


def _per_page_us(run: Callable[[], None], pages: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / pages * 1e6


def _pages(page_bytes: int, pages: int) -> list[Any]:
    import torch

    return [torch.randn(page_bytes // 4, dtype=torch.float32) for _ in range(pages)]


def measure(name: str, page_bytes: int, pages: int, repeats: int) -> dict[str, float]:
    """Write then read `pages` pages of `page_bytes` with backend `name` (one of `BACKENDS`)."""
    import torch

    from sessiongate.sglang_ext.internals.storage_config import file_store

    values = _pages(page_bytes, pages)
    target = torch.empty(page_bytes // 4, dtype=torch.float32)
    keys = [f"page-{i}" for i in range(pages)]
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as directory:
        store = file_store(directory, verified=name == "file")

        def write() -> None:
            for key, value in zip(keys, values, strict=True):
                assert store.set(key, value)

        def read() -> None:
            for key in keys:
                assert store.exists(key)
                assert store.get(key, target) is not None

        write_us = _per_page_us(write, pages)
        read_us = statistics.median(_per_page_us(read, pages) for _ in range(repeats))
    return {
        "write_us": write_us,
        "read_us": read_us,
        "write_gbps": page_bytes / write_us / 1e3,
        "read_gbps": page_bytes / read_us / 1e3,
    }


def digest_us(page_bytes: int, pages: int, repeats: int) -> float:
    """The verification alone: the digest of each page's key and bytes, median per page."""
    from sessiongate.sglang_ext.internals.page_digest import pack_trailer

    views = [value.numpy().data.cast("B") for value in _pages(page_bytes, pages)]

    def run() -> None:
        for i, view in enumerate(views):
            pack_trailer(f"page-{i}", [view])

    return statistics.median(_per_page_us(run, pages) for _ in range(repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--page-kib", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--pages", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from sessiongate.sglang_ext.cpu_compat import activate
    from sessiongate.sglang_ext.hardware import has_cuda

    if not has_cuda():
        activate(patch_sglang=False)
    print("| page | backend | write us/page | write GB/s | read us/page | read GB/s | read overhead |")
    print("|---|---|---|---|---|---|---|")
    for page_kib in args.page_kib:
        page_bytes = page_kib * 1024
        reads: dict[str, float] = {}
        for name in BACKENDS:
            figures = measure(name, page_bytes, args.pages, args.repeats)
            reads[name] = figures["read_us"]
            overhead = f"{(figures['read_us'] / reads['file-unchecked'] - 1) * 100:+.1f}%" if name == "file" else "-"
            print(
                f"| {page_kib} KiB | {name} | {figures['write_us']:.0f} | {figures['write_gbps']:.2f} "
                f"| {figures['read_us']:.0f} | {figures['read_gbps']:.2f} | {overhead} |",
                flush=True,
            )
        alone = digest_us(page_bytes, args.pages, args.repeats)
        print(
            f"| {page_kib} KiB | digest alone (xxh3-64) | | | {alone:.1f} | {page_bytes / alone / 1e3:.2f} "
            f"| {alone / reads['file-unchecked'] * 100:.1f}% of an unchecked read |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

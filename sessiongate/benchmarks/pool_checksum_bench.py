"""What a checksum per page costs: SGLang's `file` pool backend against sessiongate's `checked-file`.

Both backends run in-process on the same kind of directory, with the calls the HiCache controller
makes (`set` of a page on write-through, `exists` + `get` into a host page on a prefetch). For each
page size: write `--pages` pages, then read them all back `--repeats` times (from the OS page cache,
as on a machine whose pool directory fits in memory); the figure is the median per-page time and the
throughput it implies. Pages are random float32 values (a CRC costs the same on any bytes).

    python -m sessiongate.benchmarks.pool_checksum_bench                       # 128 KiB (tiny) and 1 MiB (medium) pages
    python -m sessiongate.benchmarks.pool_checksum_bench --page-kib 512 --pages 256 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BACKENDS = ("file", "checked-file")


def _make_store(name: str, pool: Path) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore
    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    config = single_rank_storage_config("bench", {"file_storage_path": str(pool)})
    return (HiCacheFile if name == "file" else CheckedFileStore)(config)


def _per_page_us(run: Callable[[], None], pages: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / pages * 1e6


def measure(name: str, page_bytes: int, pages: int, repeats: int) -> dict[str, float]:
    import torch

    values = [torch.randn(page_bytes // 4, dtype=torch.float32) for _ in range(pages)]
    target = torch.empty(page_bytes // 4, dtype=torch.float32)
    keys = [f"page-{i}" for i in range(pages)]
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as directory:
        store = _make_store(name, Path(directory))

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
    print("| page | backend | write us/page | write GB/s | read us/page | read GB/s |")
    print("|---|---|---|---|---|---|")
    for page_kib in args.page_kib:
        for name in BACKENDS:
            figures = measure(name, page_kib * 1024, args.pages, args.repeats)
            print(
                f"| {page_kib} KiB | {name} | {figures['write_us']:.0f} | {figures['write_gbps']:.2f} "
                f"| {figures['read_us']:.0f} | {figures['read_gbps']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

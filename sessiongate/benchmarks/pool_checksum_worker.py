"""What verifying every pool page costs where a worker really reads the pool: an advisory prefetch into host memory.

`pool_checksum_bench` times the two `file` backends in-process; this times them inside real SGLang CPU workers.
Two workers of `--model-size` are started side by side, one on SGLang's own `file` backend (`file-unchecked`), one
on the verified `file` pool, each with a pool directory of its own. For each context length and repeat, on each
worker in turn (the order alternating repeat by repeat, so that a change in the machine's load falls on both): a
fresh random context is computed (its pages are written through to the pool), the worker's device and host tiers
are flushed, and the context is prefetched from the pool into host memory (`POST /sessiongate/v1/prefetch`,
target host): SGLang's cache controller reads every page with the backend's `get` (for the verified pool, the
read and the digest check of each page) and copies it into the host pool. The pool's pages are in the OS page
cache (written moments before), as on a machine whose pool directory fits in memory.

The figures are the prefetch's own duration as the worker records it (accepted to done; it includes the worker's
scheduling of the prefetch, the pool's existence check and the copies into the host pool: all a pool read costs
there) and the CPU seconds the worker's processes spent meanwhile (which other load on a shared machine disturbs less
than wall time), per backend: their medians, and the overhead of the verified read (verified / unchecked - 1, of the
medians, of the best repeats, and the median of each repeat's pair). A sample counts only if every page of the context
landed in host memory. Also reported: the digest alone for that many pages (`pool_checksum_bench.digest_us`, in this
process) over the unchecked prefetch: the share verification would take if nothing else differed.

    python -m sessiongate.benchmarks.pool_checksum_bench --through-worker --model-size tiny --repeats 7
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil

from sessiongate.benchmarks.prefetch_bench import VOCAB, _context, _generate, _prefetch, _wait_pool_quiet
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.pool_backends import FILE_BACKEND, UNCHECKED_FILE_BACKEND
from sessiongate.sglang_ext.protocol import LOAD_PATH, LoadReport
from sessiongate.sglang_ext.worker_process import wait_all_ready

__all__ = ["DEFAULT_OUT", "Sample", "run"]

BACKENDS = (UNCHECKED_FILE_BACKEND, FILE_BACKEND)
DEFAULT_OUT = Path("benchmarks/results/pool-checksum-worker")


@dataclass(frozen=True)
class Sample:
    backend: str
    context_tokens: int
    repeat: int
    pages: int
    bytes_loaded: int
    prefetch_s: float
    """Accepted to done, on the worker's clock."""
    client_s: float
    """The client's wall time from the POST to the poll that saw it done (polls every 10 ms)."""
    cpu_s: float
    """CPU seconds the worker's processes spent over that time (less disturbed than wall time by other load)."""
    pool_cpu_s: float
    """Of which its scheduler's threads but the scheduler loop: the pool read and the copies into host memory."""


def _flush(client: httpx.Client) -> None:
    client.post("/flush_cache", params={"timeout": 60}).raise_for_status()


def _task_ns(pid: int, *, main_thread: bool = True) -> int:
    """Nanoseconds the threads of process `pid` have run (`/proc/PID/task/TID/schedstat`; the clock ticks of
    `cpu_times` are 10 ms, as long as a small prefetch); without its main thread if not `main_thread`."""
    total = 0
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            if main_thread or task.name != str(pid):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total


def _cpu_s(worker: psutil.Process) -> tuple[float, float]:
    """CPU seconds run by the worker's processes (its launcher, scheduler, tokenizer, detokenizer), and by its
    scheduler's threads but the scheduler loop: the cache controller's, which read the pool (the backend's `get`,
    verified or not) and copy each page into host memory."""
    total = side = 0
    for process in [worker, *worker.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += _task_ns(process.pid)
            if process.name().startswith("sglang::schedul"):
                side += _task_ns(process.pid, main_thread=False)
    return total / 1e9, side / 1e9


def _sample(
    client: httpx.Client, worker: psutil.Process, pool: Path, backend: str, ids: list[int], repeat: int, page: int
) -> Sample | None:
    _flush(client)
    before = len(list(pool.iterdir()))
    _generate(client, ids)
    _wait_pool_quiet(pool, before)
    # Only the pool holds the context now.
    _flush(client)
    cpu_before, pool_cpu_before = _cpu_s(worker)
    started = time.perf_counter()
    status = _prefetch(client, ids, "host")
    client_s = time.perf_counter() - started
    cpu_after, pool_cpu_after = _cpu_s(worker)
    pages = len(ids) // page
    if status.state != "done" or status.pages_in_host != pages or status.finished_at is None:
        return None
    return Sample(
        backend=backend,
        context_tokens=len(ids),
        repeat=repeat,
        pages=pages,
        bytes_loaded=status.bytes_loaded,
        prefetch_s=status.finished_at - status.created_at,
        client_s=client_s,
        cpu_s=cpu_after - cpu_before,
        pool_cpu_s=pool_cpu_after - pool_cpu_before,
    )


def _configs(args: argparse.Namespace, state: Path) -> dict[str, WorkerConfig]:
    longest = max(args.contexts)
    return {
        backend: WorkerConfig(
            state_dir=state,
            model_size=args.model_size,
            port=port,
            storage_backend=backend,
            pool_dir=state / f"pool-{backend}",
            # Room for the longest context, with the host pool (hicache_ratio) twice that.
            max_total_tokens=max(4096, longest + 1024) // 64 * 64,
            cpu_threads=cores_per_worker(2),
            gpu_share=2,
            log_file=state / f"worker-{backend}.log",
            extra_args=("--context-length", str(longest + 64)),
        )
        for backend, port in zip(BACKENDS, (31521, 31522), strict=True)
    }


def run(args: argparse.Namespace, digest_us: Callable[[int, int, int], tuple[float, float]]) -> int:
    """`args`: `pool_checksum_bench`'s (`model_size`, `contexts`, `repeats`, `out`, `state_dir`); `digest_us`: its
    timing of the digest alone (page bytes, pages, repeats -> median and best us a page)."""
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="pool-checksum-worker-"))
    configs = _configs(args, state)
    out: Path = args.out or DEFAULT_OUT / args.model_size
    started_at = datetime.now(UTC)
    load_before = os.getloadavg()
    workers: dict[str, WorkerProcess] = {}
    try:
        for backend, config in configs.items():
            workers[backend] = start_worker(config)
        wait_all_ready(list(workers.values()), 600)
        samples, skipped, rejected, page_bytes = _measure(args, configs, workers)
    finally:
        for worker in workers.values():
            worker.stop()
        if args.state_dir is None:
            # Gigabytes with the medium model; the workers' logs stay.
            for config in configs.values():
                shutil.rmtree(config.effective_pool_dir, ignore_errors=True)
    load_after = os.getloadavg()
    digest = digest_us(page_bytes, 64, 5)[0] if page_bytes else float("nan")
    out.mkdir(parents=True, exist_ok=True)
    raw = {
        "started_at": started_at.isoformat(timespec="seconds"),
        "load_before": load_before,
        "load_after": load_after,
        "page_bytes": page_bytes,
        "digest_alone_us": digest,
        "pool_pages_rejected": rejected,
        "skipped": skipped,
        "samples": [asdict(sample) for sample in samples],
    }
    (out / "raw.json").write_text(json.dumps(raw, indent=1) + "\n")
    report = _report(args, samples, skipped, rejected, page_bytes, digest, started_at, load_before, load_after)
    (out / "report.md").write_text(report)
    print(report)
    return 0


def _measure(
    args: argparse.Namespace, configs: dict[str, WorkerConfig], workers: dict[str, WorkerProcess]
) -> tuple[list[Sample], int, dict[str, int], int]:
    vocab = VOCAB[args.model_size]
    rng = random.Random(31)
    clients = {backend: httpx.Client(base_url=worker.url, timeout=600) for backend, worker in workers.items()}
    processes = {backend: psutil.Process(worker.pid) for backend, worker in workers.items()}
    page = configs[FILE_BACKEND].page_size
    samples: list[Sample] = []
    skipped = 0
    try:
        for backend, client in clients.items():  # warm-up: a fresh worker's first requests and prefetch are slow
            pool = configs[backend].effective_pool_dir
            _sample(client, processes[backend], pool, backend, _context(rng, 512, vocab), -1, page)
        for length in args.contexts:
            for repeat in range(args.repeats):
                order = BACKENDS if repeat % 2 == 0 else BACKENDS[::-1]
                for backend in order:
                    pool = configs[backend].effective_pool_dir
                    ids = _context(rng, length, vocab)
                    sample = _sample(clients[backend], processes[backend], pool, backend, ids, repeat, page)
                    if sample is None:
                        skipped += 1
                    else:
                        samples.append(sample)
        rejected = {
            backend: LoadReport.model_validate(client.get(LOAD_PATH).json()).pool_pages_rejected
            for backend, client in clients.items()
        }
    finally:
        for client in clients.values():
            client.close()
    verified_pages = [path.stat().st_size for path in configs[FILE_BACKEND].effective_pool_dir.glob("*.bin")]
    unchecked_pages = [path.stat().st_size for path in configs[UNCHECKED_FILE_BACKEND].effective_pool_dir.glob("*.bin")]
    page_bytes = statistics.median(unchecked_pages) if unchecked_pages else 0
    # The verified pool's files are the page and its 20-byte trailer.
    assert not verified_pages or statistics.median(verified_pages) == page_bytes + 20, (verified_pages[:3], page_bytes)
    return samples, skipped, rejected, int(page_bytes)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _report(
    args: argparse.Namespace,
    samples: list[Sample],
    skipped: int,
    rejected: dict[str, int],
    page_bytes: int,
    digest: float,
    started_at: datetime,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    lines = [
        f"# pool_checksum_bench --through-worker, {args.model_size}",
        "",
        f"`python -m sessiongate.benchmarks.pool_checksum_bench --through-worker --model-size {args.model_size} "
        f"--contexts {' '.join(map(str, args.contexts))} --repeats {args.repeats}`, started "
        f"{started_at:%Y-%m-%d %H:%M} UTC; load average before {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
        f"{os.cpu_count()} CPUs.",
        "",
        f"Page: {page_bytes // 1024} KiB. Digest alone (xxh3-64, in this process): {digest:.1f} us a page. "
        f"Samples skipped (not every page landed in host memory): {skipped}. "
        f"Pages rejected by verification: {rejected}.",
        "",
        "| context | pages | backend | prefetch ms: median (min-max) | GB/s | worker CPU ms | pool threads' CPU ms "
        "| overhead, wall: medians / best / median of pairs | overhead, worker CPU: medians / median of pairs "
        "| overhead, pool threads' CPU: medians / median of pairs "
        "| digest alone over the unchecked prefetch's wall / worker CPU / pool threads' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for length in args.contexts:
        of = {
            backend: [s for s in samples if s.context_tokens == length and s.backend == backend] for backend in BACKENDS
        }
        for backend in BACKENDS:
            rows = of[backend]
            if not rows:
                lines.append(f"| {length} | | {backend} | no clean sample | | | | | | | |")
                continue
            times = [s.prefetch_s for s in rows]
            pages = rows[0].pages
            gbps = _median([s.bytes_loaded / s.prefetch_s / 1e9 for s in rows])
            overheads = "| - | - | - | - |"
            if backend == FILE_BACKEND and of[UNCHECKED_FILE_BACKEND]:
                overheads = _overheads(of[UNCHECKED_FILE_BACKEND], rows, pages * digest / 1e6)
            lines.append(
                f"| {length} | {pages} | {backend} | {_median(times) * 1e3:.1f} ({min(times) * 1e3:.1f}-"
                f"{max(times) * 1e3:.1f}) | {gbps:.2f} | {_median([s.cpu_s for s in rows]) * 1e3:.1f} "
                f"| {_median([s.pool_cpu_s for s in rows]) * 1e3:.1f} {overheads}"
            )
    return "\n".join(lines) + "\n"


def _overheads(unchecked: list[Sample], verified: list[Sample], digest_s: float) -> str:
    """The verified prefetch's overhead on the unchecked one (wall time, the worker's CPU time, its pool threads'),
    and what the digest alone (`digest_s` for the context's pages) is of the unchecked prefetch's medians: the
    table's last four cells."""

    def pct(value: float) -> str:
        return f"{value * 100:+.1f}%"

    def median_of(rows: list[Sample], field: str) -> float:
        return _median([getattr(s, field) for s in rows])

    def cells(field: str) -> str:
        by_repeat = {s.repeat: getattr(s, field) for s in unchecked}
        pairs = [getattr(s, field) / by_repeat[s.repeat] - 1 for s in verified if by_repeat.get(s.repeat, 0) > 0]
        return f"{pct(median_of(verified, field) / median_of(unchecked, field) - 1)} / {pct(_median(pairs))}"

    best = min(s.prefetch_s for s in verified) / min(s.prefetch_s for s in unchecked) - 1
    wall_medians, wall_pairs = cells("prefetch_s").split(" / ")
    shares = " / ".join(
        f"{digest_s / median_of(unchecked, field) * 100:.1f}%" for field in ("prefetch_s", "cpu_s", "pool_cpu_s")
    )
    return f"| {wall_medians} / {pct(best)} / {wall_pairs} | {cells('cpu_s')} | {cells('pool_cpu_s')} | {shares} |"

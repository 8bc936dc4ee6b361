"""How workers on one GPU machine share its GPUs and its host memory, decided before any of them starts.

SGLang sizes each worker as if it were alone on the machine. Two consequences on a GPU machine:
- **Host memory.** An explicit `--hicache-ratio` turns off SGLang's own host-memory sizing
  (`--hicache-host-memory-fraction`), and a ratio of 2 on a GPU whose KV pool is ~65 GB asks for ~130 GB of pinned
  memory: on a 128 GiB machine SGLang stops with "Not enough host memory". Even SGLang's own sizing takes 80% of
  what is free for each engine, not for all of them. So on a GPU the launcher passes `--hicache-size` (GB):
  `host_kv_pool_gb`, what the machine has available (bounded by its cgroup) less a reserve, a fraction of it,
  divided among the workers on the machine.
- **GPU memory.** `--mem-fraction-static` is a fraction of the memory free when a worker starts; SGLang's default
  (~0.85-0.9) lets one worker take nearly all of a GPU. `place_workers` gives each worker its own GPU where there
  are enough, and otherwise spreads them round-robin with a split of `SHARED_GPU_FRACTION`: the *i*-th of *k*
  workers on a GPU asks for `s / (1 - i * s)` of what is free at its start (`s = SHARED_GPU_FRACTION / k`), which is
  `s` of the whole GPU when the ones before it are already up; `GpuPlacement.wait_before_next` says to wait for
  it before starting the next one on that GPU. Workers started at once instead (the engine tests', with
  `WorkerConfig.gpu_share`) each take `equal_gpu_fraction`: less for all but the first, never too much.
Nothing here imports torch: it runs in the launcher's and the gateway's light processes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HOST_KV_FRACTION",
    "HOST_RESERVE_BYTES",
    "SHARED_GPU_FRACTION",
    "GpuPlacement",
    "available_host_memory_bytes",
    "equal_gpu_fraction",
    "host_kv_pool_gb",
    "place_workers",
]

HOST_RESERVE_BYTES = 16 * 1024**3
"""Host memory never given to KV pools: SGLang's own 10 GiB reserve (`pool_host/base.py`) plus room for the
workers' other processes, weights read through host memory while loading, and the gateway."""
HOST_KV_FRACTION = 0.7
"""Of the rest, the share that all the workers' host KV pools (pinned, never swapped) take together."""
SHARED_GPU_FRACTION = 0.85
"""Weights plus KV pools of all the workers that share one GPU, as a fraction of its memory; the rest is the
activations, CUDA graphs and CUDA contexts of all of them."""

_UNLIMITED = "max"


@dataclass(frozen=True)
class GpuPlacement:
    """Where one worker runs on a GPU machine."""

    gpu_id: str
    """Its `CUDA_VISIBLE_DEVICES`."""
    mem_fraction_static: float | None
    """Its `--mem-fraction-static`; None: SGLang's default (alone on its GPU)."""
    sharing: int
    """How many workers share this GPU."""
    wait_before_next: bool
    """Start the next worker only once this one is ready: its fraction assumed the ones before it had taken theirs."""


def place_workers(workers: int, gpu_ids: list[str]) -> list[GpuPlacement]:
    """One GPU per worker where there are enough; otherwise round-robin, splitting `SHARED_GPU_FRACTION`."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not gpu_ids:
        raise ValueError("no GPU to place workers on")
    on_gpu = [len(range(index, workers, len(gpu_ids))) for index in range(len(gpu_ids))]
    placements = []
    for worker in range(workers):
        gpu = worker % len(gpu_ids)
        sharing, order = on_gpu[gpu], worker // len(gpu_ids)
        if sharing == 1:
            placements.append(GpuPlacement(gpu_ids[gpu], None, 1, wait_before_next=False))
            continue
        share = SHARED_GPU_FRACTION / sharing
        fraction = math.floor(share / (1 - order * share) * 1000) / 1000
        placements.append(GpuPlacement(gpu_ids[gpu], fraction, sharing, wait_before_next=True))
    return placements


def equal_gpu_fraction(sharing: int) -> float:
    """`--mem-fraction-static` for each of `sharing` workers started at once on one GPU: `SHARED_GPU_FRACTION /
    sharing` of what each finds free, which is at most that share of the whole GPU whatever the order of their
    starts (a worker that starts after another is up finds less free and takes less: the tests' side-by-side
    workers, `WorkerConfig.gpu_share`)."""
    if sharing < 1:
        raise ValueError(f"sharing must be at least 1, got {sharing}")
    return math.floor(SHARED_GPU_FRACTION / sharing * 1000) / 1000


def host_kv_pool_gb(workers: int, available_bytes: int) -> int:
    """Each worker's host KV pool in GB (SGLang's `--hicache-size`) when `workers` share `available_bytes`."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    usable = (available_bytes - HOST_RESERVE_BYTES) * HOST_KV_FRACTION / workers
    size = int(usable // 1e9)
    if size < 1:
        raise ValueError(
            f"{workers} worker(s) on a machine with {available_bytes / 1024**3:.1f} GiB of host memory available leave "
            f"under 1 GB each for a host KV pool after the {HOST_RESERVE_BYTES // 1024**3} GiB reserve: start fewer "
            "workers, give --hicache-size, or turn the hierarchical cache off"
        )
    return size


def available_host_memory_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Memory a new allocation can get: the kernel's `MemAvailable`, bounded by this cgroup's (v2) headroom."""
    available = _mem_available(meminfo)
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        current = int((cgroup / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return available
    if limit == _UNLIMITED:
        return available
    return max(0, min(available, int(limit) - current))


def _mem_available(meminfo: Path) -> int:
    """The kernel's `MemAvailable` (page cache counts as free); without it, the free pages."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))

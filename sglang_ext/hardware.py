"""What this machine offers a worker, decided without importing torch.

The launcher runs in processes that must stay light (the gateway's, the `sessiongate worker` CLI).
- `has_cuda()` picks between a normal SGLang worker and one with the CPU compatibility layer; the
  same test as `scripts/setup.sh`: `nvidia-smi -L` runs and lists a GPU.
- `cores_per_worker(n)` is the share of this process's cores each of n CPU workers on the machine
  should compute with (`WorkerConfig.cpu_threads`).
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["cores_per_worker", "has_cuda"]


def has_cuda(timeout: float = 10.0) -> bool:
    """True when `nvidia-smi -L` is on PATH, succeeds and lists at least one GPU."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return False
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        # A driver that hangs or cannot start is no GPU we can use.
        return False
    return listing.returncode == 0 and "GPU" in listing.stdout


def cores_per_worker(workers: int) -> int:
    """This process's usable cores divided evenly among `workers` co-located CPU workers, at least 1.

    Each CPU worker's torch otherwise runs one OpenMP thread per core of the machine, and OpenMP threads
    spin at every operator's barrier while another worker's threads hold the cores: two busy tiny workers
    on 2 cores took 219 ms per decode step at batch 4 with 2 threads each, 6.4 ms with 1 each
    (`python -m benchmarks.colocated_workers`).
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // workers)

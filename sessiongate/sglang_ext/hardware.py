"""What this machine offers a worker, decided without importing torch.

The launcher runs in processes that must stay light (the gateway's, the `sessiongate worker` CLI).
- `gpu_ids()` lists the NVIDIA GPUs a worker may use, one entry per GPU as `CUDA_VISIBLE_DEVICES` names them. It
  does not need `nvidia-smi` (container images often lack it): the driver's `/proc/driver/nvidia/gpus/<bus id>`
  entries, then the `/dev/nvidia<N>` device files, then `nvidia-smi -L`, then torch's count if torch is already
  imported in this process; `CUDA_VISIBLE_DEVICES`, when set, narrows (or empties) the list.
- `has_cuda()`: at least one such GPU; it picks between a normal SGLang worker and one with the CPU
  compatibility layer.
- `cores_per_worker(n)` is the share of this process's cores each of n CPU workers on the machine
  should compute with (`WorkerConfig.cpu_threads`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["cores_per_worker", "gpu_count_present", "gpu_ids", "has_cuda"]

_PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_DEV = Path("/dev")
_DEVICE_FILE = re.compile(r"^nvidia(\d+)$")


def _nvidia_smi_count(timeout: float) -> int:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        # A driver that hangs or cannot start is no GPU we can use.
        return 0
    if listing.returncode != 0:
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def gpu_count_present(*, proc_gpus: Path = _PROC_GPUS, dev: Path = _DEV, timeout: float = 10.0) -> int:
    """How many NVIDIA GPUs the machine has, from the first source that knows (see the module docstring)."""
    try:
        from_proc = sum(1 for entry in proc_gpus.iterdir() if entry.is_dir())
    except OSError:
        from_proc = 0
    if from_proc:
        return from_proc
    try:
        from_dev = sum(1 for entry in dev.iterdir() if _DEVICE_FILE.match(entry.name))
    except OSError:
        from_dev = 0
    if from_dev:
        return from_dev
    from_smi = _nvidia_smi_count(timeout)
    if from_smi:
        return from_smi
    torch = sys.modules.get("torch")  # never imported here just to ask: that costs seconds and GBs of libraries
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.device_count())
    return 0


def gpu_ids(environ: Mapping[str, str] | None = None, *, present: int | None = None) -> list[str]:
    """The GPUs a worker may use, as `CUDA_VISIBLE_DEVICES` entries (indices, or what that variable names)."""
    env = os.environ if environ is None else environ
    count = gpu_count_present() if present is None else present
    if count == 0:
        return []
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(index) for index in range(count)]
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    # CUDA stops at the first invalid entry ("-1" is the usual way to hide every GPU).
    valid: list[str] = []
    for entry in entries:
        if entry.lstrip("-").isdigit() and not 0 <= int(entry) < count:
            break
        valid.append(entry)
    return valid


def has_cuda(timeout: float = 10.0) -> bool:
    """True when this process may use at least one NVIDIA GPU."""
    return bool(gpu_ids(present=gpu_count_present(timeout=timeout)))


def cores_per_worker(workers: int) -> int:
    """This process's usable cores divided evenly among `workers` co-located CPU workers, at least 1.

    Each CPU worker's torch otherwise runs one OpenMP thread per core of the machine, and OpenMP threads
    spin at every operator's barrier while another worker's threads hold the cores: two busy tiny workers
    on 2 cores took 219 ms per decode step at batch 4 with 2 threads each, 6.4 ms with 1 each
    (`python -m sessiongate.benchmarks.colocated_workers`).
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // workers)

"""Whether this machine has a CUDA GPU, decided without importing torch.

The launcher runs in processes that must stay light (the gateway's, the `sessiongate worker` CLI),
and the answer picks between a normal SGLang worker and one with the CPU compatibility layer. The
same test as `scripts/setup.sh`: `nvidia-smi -L` runs and lists a GPU.
"""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["has_cuda"]


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

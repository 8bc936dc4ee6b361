"""The CPU compatibility layer: lets the real SGLang engine run where there is no CUDA.

Active ONLY where CUDA is absent (on a GPU machine it would hide the real `sgl_kernel`). The
launcher prepends `SITE_DIR` to a CPU worker's PYTHONPATH; in it,

- `sitecustomize.py` calls `activate_from_environ()` at the start of every worker process;
- `sgl_kernel/` is a stand-in package whose imports succeed and whose ops raise when called.

`activate()` installs `ImportHooks` that fix torch/torchvision (`torch_fixes`) and, as SGLang's
modules are imported, apply the patches `sglang_ext.internals.patches.cpu_patches` lists (HiCache's
CUDA-only host pool code, the torch_native extend attention), using the pure-torch functions of
`kernels`. Tests and tools that import transformers or sglang in-process on a CPU machine call
`activate()` themselves.

Environment: `SESSIONGATE_CPU_COMPAT_DISABLE`, a comma-separated list of patch groups to leave out
(`attention`, `hicache`), for measuring what a patch is worth; `SESSIONGATE_CPU_H2D_LAYER_DELAY_S`
(tests only, default 0 = off): host-to-device loads finish that many seconds per layer after the call
that started them, as on a GPU's copy stream (`deferred_copy`), so a reader that does not wait for a
load reads pages that are not there yet.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from pathlib import Path

from sessiongate.sglang_ext.cpu_compat.import_hooks import ImportHooks
from sessiongate.sglang_ext.cpu_compat.torch_fixes import add_cpu_stream_sync, define_torchvision_op_schemas

__all__ = ["DISABLE_ENV", "H2D_DELAY_ENV", "SITE_DIR", "activate", "activate_from_environ", "active_hooks"]

SITE_DIR = Path(__file__).resolve().parent / "site"
DISABLE_ENV = "SESSIONGATE_CPU_COMPAT_DISABLE"
H2D_DELAY_ENV = "SESSIONGATE_CPU_H2D_LAYER_DELAY_S"


def active_hooks() -> ImportHooks | None:
    """The compatibility hooks installed in this process, if any."""
    return next((finder for finder in sys.meta_path if isinstance(finder, ImportHooks)), None)


def activate(
    *, patch_sglang: bool = True, disabled: Collection[str] = (), h2d_layer_delay_s: float = 0.0
) -> ImportHooks:
    """Install the compatibility hooks in this process (once; later calls return the first).

    `patch_sglang=False` installs the torch/torchvision fixes only: SGLang then imports but keeps
    its own (CUDA-only or slow) code, which is what a test comparing against it needs.
    """
    existing = active_hooks()
    if existing is not None:
        return existing
    after = {"torch": [add_cpu_stream_sync]}
    if patch_sglang:
        # Imported here: the table names SGLang's modules, and only this branch needs it.
        from sessiongate.sglang_ext.internals.patches import cpu_patches

        after.update(cpu_patches(disabled=frozenset(disabled), h2d_layer_delay_s=h2d_layer_delay_s))
    hooks = ImportHooks(before={"torchvision": define_torchvision_op_schemas}, after=after)
    hooks.install()
    return hooks


def activate_from_environ(environ: Mapping[str, str] | None = None) -> ImportHooks:
    """`activate()` with the patch groups named in `SESSIONGATE_CPU_COMPAT_DISABLE` left out, and the
    host-to-device delay of `SESSIONGATE_CPU_H2D_LAYER_DELAY_S`."""
    import os

    env = os.environ if environ is None else environ
    disabled = {name.strip() for name in env.get(DISABLE_ENV, "").split(",") if name.strip()}
    delay_text = env.get(H2D_DELAY_ENV, "").strip()
    try:
        delay = float(delay_text) if delay_text else 0.0
    except ValueError:
        raise ValueError(f"{H2D_DELAY_ENV} must be a number of seconds, got {delay_text!r}") from None
    return activate(disabled=disabled, h2d_layer_delay_s=delay)

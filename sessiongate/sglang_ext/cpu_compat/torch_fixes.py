"""Fixes to torch and torchvision that the CPU build of the worker stack needs (not SGLang's).

- The PyPI torchvision wheel is CUDA-linked: with the CPU torch its `_C` extension does not load,
  and `torchvision/_meta_registrations.py` then registers fakes for `torchvision::nms` and
  `torchvision::qnms`, ops that were never defined, so `import torchvision` fails (and with it
  transformers and sglang, which import it). Defining the two schemas before torchvision loads
  lets its pure-Python parts import; calling the ops still fails, and nothing on our path does.
- `torch.cpu.Stream` has no `synchronize()`/`query()`, which device-agnostic code (SGLang's HiCache
  transfers) calls; CPU work is synchronous, so both are trivially true no-ops.

Each fix is a function run by the import hooks of `sglang_ext.cpu_compat`; importing this module
imports nothing heavy.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["TORCHVISION_OP_SCHEMAS", "add_cpu_stream_sync", "define_torchvision_op_schemas"]

TORCHVISION_OP_SCHEMAS = {
    "torchvision::nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "torchvision::qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def _torchvision_extension_loads() -> bool:
    """Whether torchvision's compiled ops load here (a CPU build of torchvision): then keep out."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    candidates = sorted(Path(spec.origin).parent.glob("_C.*"))
    if not candidates:
        return False
    try:
        torch.ops.load_library(str(candidates[0]))  # type: ignore[no-untyped-call]
    except OSError:
        # The expected case with the CUDA-linked wheel: undefined CUDA symbols.
        return False
    return True


def define_torchvision_op_schemas() -> None:
    """Define the op schemas torchvision's meta registrations expect, unless its ops really load."""
    import torch

    if _torchvision_extension_loads():
        return
    for qualname, schema in TORCHVISION_OP_SCHEMAS.items():
        namespace, name = qualname.split("::")
        if not hasattr(getattr(torch.ops, namespace), name):
            # torch.library.define keeps its Library alive for the life of the process.
            torch.library.define(qualname, schema)


def _stream_synchronize(self: object) -> None:
    """CPU work is done when the call that queued it returns: nothing to wait for."""


def _stream_query(self: object) -> bool:
    return True


def add_cpu_stream_sync(torch_module: ModuleType) -> None:
    """Give `torch.cpu.Stream` the `synchronize()` and `query()` that CUDA streams have."""
    stream_class = torch_module.cpu.Stream
    if not hasattr(stream_class, "synchronize"):
        stream_class.synchronize = _stream_synchronize
    if not hasattr(stream_class, "query"):
        stream_class.query = _stream_query

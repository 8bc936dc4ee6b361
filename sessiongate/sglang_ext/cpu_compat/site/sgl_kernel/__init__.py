"""A stand-in for `sgl_kernel`, SGLang's compiled kernel package, on machines without CUDA.

The CPU build of sgl_kernel is on no package registry, yet SGLang's CPU engine imports a few names
from it with no fallback (`from sgl_kernel import copy_all_layer_kv_cache_cpu` when
SGLANG_USE_CPU_ENGINE=1). Those names, listed in `OPS`, import here as functions that raise
`NotImplementedError` when called; with `--attention-backend torch_native` and no speculative
decoding SGLang takes its pure-torch paths and calls none of them.

Every other name, and every submodule (`sgl_kernel.scalar_type`, ...), stays missing on purpose:
SGLang guards those imports with `except ImportError` fallbacks, which must keep working.

This directory is on PYTHONPATH only in CPU workers started by `sglang_ext.launcher`: on a GPU
machine it would hide the real package.
"""

from __future__ import annotations

STAND_IN = True

# Names SGLang 0.5.23 imports from sgl_kernel under `if is_cpu():` with no fallback, at module level
# of modules a Llama worker imports (KV moves, speculative decoding). None runs without speculation.
OPS = frozenset(
    {
        "assign_draft_cache_locs_contiguous_cpu",
        "assign_extend_cache_locs_cpu",
        "assign_req_to_token_pool_cpu",
        "build_tree_kernel_efficient_cpu",
        "copy_all_layer_kv_cache_cpu",
        "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu",
        "rotate_input_ids_cpu",
        "verify_tree_greedy_cpu",
    }
)


def _missing_op(name):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is a compiled kernel; this CPU worker runs with sessiongate's sgl_kernel "
            "stand-in, which has none (SGLang reached a path that needs it)"
        )

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name):
    if name in OPS:
        return _missing_op(name)
    raise AttributeError(f"module 'sgl_kernel' (sessiongate's CPU stand-in) has no attribute {name!r}")

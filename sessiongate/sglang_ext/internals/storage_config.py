"""The storage config SGLang hands an L3 pool backend, for running a backend outside a server.

Inside a worker, SGLang's cache controller builds a `HiCacheStorageConfig` from the server's parallelism and
host-pool layout and passes it to the backend's constructor. A backend driven in-process (the pool
benchmark, the backends' own tests) needs the same object for a worker like ours: one rank of everything,
a model that is not MLA, pages laid out page-first (what `sglang_ext.launcher` asks for with a Mooncake
pool; the `file` backends do not read it), no storage metrics.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

__all__ = ["file_store", "single_rank_storage_config"]


def single_rank_storage_config(model_name: str, extra_config: dict[str, Any]) -> HiCacheStorageConfig:
    """`extra_config` is the backend's own: what `--hicache-storage-backend-extra-config` would carry."""
    return HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name=model_name,
        extra_config=extra_config,
    )


def file_store(directory: str, *, verified: bool, model_name: str = "bench") -> Any:
    """A `file` pool backend on `directory`, in-process: sessiongate's verified one (the `file` pool), or SGLang's
    own `HiCacheFile` (`file-unchecked`)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from sessiongate.sglang_ext.internals.checked_file_store import CheckedFileStore

    config = single_rank_storage_config(model_name, {"file_storage_path": directory})
    return CheckedFileStore(config) if verified else HiCacheFile(config)

"""The shared KV pools a worker can use, and SGLang's storage flags for each (`storage_args`).

Every pool sessiongate names is loaded through SGLang's `dynamic` storage backend, so the worker reports the pool's
name as configured: `file` (the default: SGLang's file layout with every page verified when read,
`internals/checked_file_store.py`), `file-unchecked` (SGLang's own file backend, which serves whatever bytes a page
file holds: for measuring what verification costs, not for serving) and `mooncake` (a Mooncake Store, every object
verified, `internals/guarded_mooncake_store.py`). Any other name is passed to SGLang as is. Imports nothing of
SGLang.
"""

from __future__ import annotations

import json

from sessiongate.sglang_ext.worker_config import WorkerConfig

__all__ = [
    "DIRECTORY_POOLS",
    "FILE_BACKEND",
    "POOL_NAMES",
    "TIMED_POOLS",
    "UNCHECKED_FILE_BACKEND",
    "storage_args",
    "storage_extra_config",
]

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# The default pool: SGLang's `file` layout with every page verified when read
# (sessiongate/sglang_ext/internals/checked_file_store.py).
FILE_BACKEND = "file"
# SGLang's own `file` backend, which serves whatever bytes a page file holds: for measuring what verification
# costs (`benchmarks.pool_checksum_bench`), not for serving.
UNCHECKED_FILE_BACKEND = "file-unchecked"
_FILE_PLUGIN: dict[str, object] = {
    "backend_name": FILE_BACKEND,
    "module_path": "sessiongate.sglang_ext.internals.checked_file_store",
    "class_name": "CheckedFileStore",
}
# Loaded through the `dynamic` backend too, so that the worker reports the pool's name as configured.
_UNCHECKED_FILE_PLUGIN: dict[str, object] = {
    "backend_name": UNCHECKED_FILE_BACKEND,
    "module_path": "sglang.srt.mem_cache.hicache_storage",
    "class_name": "HiCacheFile",
}
# SGLang's Mooncake backend with every object verified when read, which stops asking a dead master for a while
# (sessiongate/sglang_ext/internals/guarded_mooncake_store.py); `interface_v1`: SGLang's zero-copy calls, as for
# `mooncake`.
_MOONCAKE_PLUGIN: dict[str, object] = {
    "backend_name": "mooncake",
    "module_path": "sessiongate.sglang_ext.internals.guarded_mooncake_store",
    "class_name": "GuardedMooncakeStore",
    "interface_v1": 1,
}
# The pools sessiongate names, each loaded through SGLang's `dynamic` storage backend.
_PLUGIN_POOLS: dict[str, dict[str, object]] = {
    FILE_BACKEND: _FILE_PLUGIN,
    UNCHECKED_FILE_BACKEND: _UNCHECKED_FILE_PLUGIN,
    "mooncake": _MOONCAKE_PLUGIN,
}
POOL_NAMES = tuple(_PLUGIN_POOLS)
"""`WorkerConfig.storage_backend` values sessiongate knows (any other is passed to SGLang as is)."""
# The pools that keep their pages in `WorkerConfig.pool_dir`.
DIRECTORY_POOLS = (FILE_BACKEND, UNCHECKED_FILE_BACKEND)
TIMED_POOLS = (FILE_BACKEND, "mooncake")
"""The pools whose backend times its calls (`pool_timing`): with any other the load report's `pool_calls` is empty."""


def storage_args(config: WorkerConfig, *, on_cpu: bool) -> list[str]:
    """SGLang's `--hicache-storage-*` flags for the configured pool (none without one)."""
    command: list[str] = []
    if config.storage_backend is None:
        return command
    sglang_backend = "dynamic" if config.storage_backend in _PLUGIN_POOLS else config.storage_backend
    command += [
        "--hicache-storage-backend",
        sglang_backend,
        "--hicache-storage-prefetch-policy",
        config.prefetch_policy,
    ]
    extra = storage_extra_config(config)
    if extra:
        command += ["--hicache-storage-backend-extra-config", json.dumps(extra, sort_keys=True)]
    if config.storage_backend == "mooncake" and not on_cpu:
        # SGLang moves a `mooncake` pool off its default layer-first host layout, which Mooncake
        # cannot transfer; it does not know that our `dynamic` one is Mooncake. (CPU: the direct
        # io backend already implies page_first_direct.)
        command += ["--hicache-mem-layout", "page_first"]
    return command


def storage_extra_config(config: WorkerConfig) -> dict[str, object]:
    """SGLang's `--hicache-storage-backend-extra-config` for the configured pool."""
    extra: dict[str, object] = dict(_PLUGIN_POOLS.get(config.storage_backend or "", {}))
    if config.storage_backend in DIRECTORY_POOLS:
        extra["file_storage_path"] = str(config.effective_pool_dir)
    elif config.storage_backend == "mooncake":
        extra.update(
            master_server_address=config.mooncake_master,
            metadata_server=config.mooncake_metadata_server,
            global_segment_size=config.mooncake_segment_bytes,
            protocol=config.mooncake_protocol,
        )
        # The address the other workers' transfer engines reach this one's segment at.
        if config.mooncake_local_hostname is not None:
            extra["local_hostname"] = config.mooncake_local_hostname
        elif config.host not in _WILDCARD_HOSTS:
            extra["local_hostname"] = config.host
    if config.prefetch_threshold is not None:
        extra["prefetch_threshold"] = config.prefetch_threshold
    return extra

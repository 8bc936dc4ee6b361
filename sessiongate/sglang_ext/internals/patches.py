"""The version pin on SGLang (0.5.23) and the CPU patches.

SGLang's internal module paths, classes and functions change between releases (its cache API
changed three times in a year), so every reference to them lives in `sglang_ext.internals`, and
this module holds the pin the others rely on: module paths, attribute names, the patches applied to
them, and the few internal objects the plug-in reads. A different installed version fails loudly
(`UnsupportedSGLangVersion`) instead of patching code it was not written for.

Nothing is imported at module import time: the functions import SGLang (and the pure-torch
kernels) when called, which is after SGLang's own import in every caller.

CPU patches (`cpu_patches`), applied by `sglang_ext.cpu_compat` right after each module is imported:

- `attention` - `TorchNativeAttnBackend._run_sdpa_forward_extend` -> `kernels.extend_attention`
  (new query rows only, against the full KV; the original stays reachable as `__wrapped__`).
- `hicache` - `pool_host.common._cuda_host_register` -> no-op; `HostKVCache.__init__` forced to
  `pin_memory=False`; `pool_host.mha.transfer_kv_direct`, `transfer_kv_all_layer_direct_lf_pf`,
  `transfer_kv_per_layer_direct_pf_lf` (bound only under CUDA/HIP/XPU) -> pure-torch copies.
- `deferred_h2d` (opt-in, for tests: `h2d_layer_delay_s > 0`) - the GPU's timing for host-to-device
  loads: `l2_transfer.L2TransferEngine.submit_host_to_device` enqueues the layer copies on a
  `cpu_compat.deferred_copy.CopyStream` (a delay before each layer; the destination pages zeroed
  first, as undefined as on a GPU until the copy lands) and returns; `cache_controller.LayerLoadingEvent`
  gets `DeferredEvent`s, so `LayerDoneCounter.wait_until` blocks until the layer is there and the
  load ring's reuse check (`update_producer`) sees a copy still running.
- `fork_start` - `engine._set_envs_and_config` sets multiprocessing's start method to `fork` after
  SGLang's own `spawn`: the scheduler and detokenizer processes inherit the server process's imports
  instead of importing torch and SGLang again (spawn is there for CUDA, which a forked child cannot
  use; a CPU worker has none). Kept `spawn` if the process runs other threads by then (a fork
  copies only the calling thread, and the locks the others held). A forked child loads the plug-ins
  again (`plugins._plugins_loaded` reset after the fork), as a spawned one does.

The internals behind the load report and advisory prefetch (IPC with the scheduler, the
scheduler-side prefetch, the HTTP-side helpers) are the package's other modules, split along the
process seam.

What the plug-in reads from and adds to SGLang's server is `plugin_ops`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "SUPPORTED_SGLANG_VERSION",
    "UnsupportedSGLangVersion",
    "cpu_patches",
    "installed_sglang_version",
    "require_supported_version",
]

SUPPORTED_SGLANG_VERSION = "0.5.23"

TORCH_NATIVE_BACKEND_MODULE = "sglang.srt.layers.attention.torch_native_backend"
HOST_POOL_COMMON_MODULE = "sglang.srt.mem_cache.pool_host.common"
HOST_POOL_BASE_MODULE = "sglang.srt.mem_cache.pool_host.base"
HOST_POOL_MHA_MODULE = "sglang.srt.mem_cache.pool_host.mha"
CACHE_CONTROLLER_MODULE = "sglang.srt.managers.cache_controller"
L2_TRANSFER_MODULE = "sglang.srt.mem_cache.l2_transfer"
HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
ENGINE_MODULE = "sglang.srt.entrypoints.engine"
PLUGINS_MODULE = "sglang.srt.plugins"
FUNCTION_CALL_PARSER_MODULE = "sglang.srt.function_call.function_call_parser"
QWEN25_DETECTOR_MODULE = "sglang.srt.function_call.qwen25_detector"

PATCH_GROUPS = ("attention", "hicache", "deferred_h2d", "fork_start")
# Off unless asked for (`cpu_patches(h2d_layer_delay_s=...)`): a test device, not a fix.
OPT_IN_PATCH_GROUPS = ("deferred_h2d",)


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang is not the version `sglang_ext` was written against."""


def installed_sglang_version() -> str:
    from sglang.version import __version__

    return str(__version__)


def require_supported_version() -> str:
    """Return the installed SGLang version, or raise if it is not the pinned one."""
    version = installed_sglang_version()
    if version != SUPPORTED_SGLANG_VERSION:
        raise UnsupportedSGLangVersion(
            f"sessiongate's SGLang extension is pinned to sglang=={SUPPORTED_SGLANG_VERSION} (it patches and "
            f"reads SGLang internals that change between releases), but sglang=={version} is installed; "
            f"install sglang=={SUPPORTED_SGLANG_VERSION} or port sessiongate/sglang_ext/internals/patches.py"
        )
    return version


def _attribute(module: ModuleType, path: str) -> Any:
    """`module.<path>`, or an error naming the pinned version when SGLang has moved it."""
    value: Any = module
    for part in path.split("."):
        if not hasattr(value, part):
            raise UnsupportedSGLangVersion(
                f"{module.__name__}.{path} is missing from sglang {SUPPORTED_SGLANG_VERSION}"
            )
        value = getattr(value, part)
    return value


# --- CPU patches -------------------------------------------------------------------------------


def _patch_extend_attention(module: ModuleType) -> None:
    from sessiongate.sglang_ext.cpu_compat.kernels import extend_attention

    require_supported_version()
    backend = _attribute(module, "TorchNativeAttnBackend")
    original = _attribute(module, "TorchNativeAttnBackend._run_sdpa_forward_extend")

    @functools.wraps(original)
    def _run_sdpa_forward_extend(self: object, *args: Any, **kwargs: Any) -> Any:
        return extend_attention(*args, **kwargs)

    backend._run_sdpa_forward_extend = _run_sdpa_forward_extend


def _skip_cuda_host_register(buffer: Any, registration_granularity_bytes: int | None = None) -> None:
    """cudaHostRegister pins host pages for fast GPU DMA; without a GPU there is nothing to pin for."""


def _patch_host_register(module: ModuleType) -> None:
    require_supported_version()
    _attribute(module, "_cuda_host_register")
    setattr(module, "_cuda_host_register", _skip_cuda_host_register)  # noqa: B010 (mypy: a module attribute)


def _patch_host_pin_memory(module: ModuleType) -> None:
    require_supported_version()
    host_kv_cache = _attribute(module, "HostKVCache")
    original_init = _attribute(module, "HostKVCache.__init__")
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self: object, *args: Any, **kwargs: Any) -> None:
        # pin_memory=True needs an accelerator backend (torch raises without one).
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["pin_memory"] = False
        original_init(*bound.args, **bound.kwargs)

    host_kv_cache.__init__ = __init__


def _patch_mha_direct_transfers(module: ModuleType) -> None:
    from sessiongate.sglang_ext.cpu_compat import kernels

    require_supported_version()
    _attribute(module, "MHATokenToKVPoolHost")
    # The module binds these from sgl_kernel only under CUDA/HIP/XPU; its methods look them up as
    # module globals at call time, so binding them here is enough.
    for name in ("transfer_kv_direct", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_per_layer_direct_pf_lf"):
        if not hasattr(module, name):
            setattr(module, name, getattr(kernels, name))


def _patch_deferred_layer_events(module: ModuleType) -> None:
    from sessiongate.sglang_ext.cpu_compat.deferred_copy import DeferredEvent

    require_supported_version()
    loading_event = _attribute(module, "LayerLoadingEvent")
    original_init = _attribute(module, "LayerLoadingEvent.__init__")

    @functools.wraps(original_init)
    def __init__(self: Any, num_layers: int) -> None:
        original_init(self, num_layers)
        self.load_events = [DeferredEvent() for _ in range(num_layers)]
        self.start_event = DeferredEvent()

    def wait(self: Any, layer_index: int) -> None:
        # The forward runs on the calling thread: its "stream" waits by blocking.
        self.load_events[layer_index].wait()

    loading_event.__init__ = __init__
    loading_event.wait = wait


def _zero_device_pages(device_pool: Any, device_indices: Any, layers: int) -> None:
    keys = getattr(device_pool, "k_buffer", None) or ()
    values = getattr(device_pool, "v_buffer", None) or ()
    for buffer in [*keys[:layers], *values[:layers]]:
        if len(device_indices) and int(device_indices.max()) < buffer.shape[0]:
            buffer[device_indices.long()] = 0


def _patch_deferred_host_to_device(module: ModuleType, layer_delay_s: float) -> None:
    from sessiongate.sglang_ext.cpu_compat.deferred_copy import CopyJob, CopyStream, DeferredEvent

    require_supported_version()
    engine = _attribute(module, "L2TransferEngine")
    _attribute(module, "L2TransferEngine._prepare_transfers")
    completion_type = _attribute(module, "TransferCompletion")
    streams: dict[int, CopyStream] = {}

    def submit_host_to_device(
        self: Any,
        transfers: list[Any],
        *,
        transfer_layer_id_max: int,
        start_event: Any = None,
        on_layer_done: Callable[[int], None] | None = None,
    ) -> Any:
        prepared = self._prepare_transfers(transfers)
        for transfer in transfers:
            _zero_device_pages(transfer.device_pool, transfer.device_indices, transfer_layer_id_max)
        layer_events = getattr(on_layer_done, "__self__", None)  # the LayerLoadingEvent of this load's slot
        for event in getattr(layer_events, "load_events", ()):
            if isinstance(event, DeferredEvent):
                event.arm()

        def copy_layer(layer_id: int) -> None:
            for transfer in prepared:
                local = transfer.layer_mapper(layer_id) if transfer.layer_mapper is not None else layer_id
                if local is None or local >= transfer.host_pool.layer_num:
                    continue
                transfer.host_pool.load_to_device_per_layer_physical(
                    transfer.device_pool,
                    transfer.host_indices,
                    transfer.device_indices,
                    local,
                    self.io_backend,
                    is_draft=transfer.is_draft,
                )

        started, finished = DeferredEvent(), DeferredEvent()
        stream = streams.get(id(self))
        if stream is None:
            stream = streams[id(self)] = CopyStream(layer_delay_s)
        stream.submit(
            CopyJob(
                layers=transfer_layer_id_max,
                copy_layer=copy_layer,
                layer_done=on_layer_done or (lambda layer: None),
                finished=finished,
                extra_events=(started,),
            )
        )
        return completion_type(started, finished, False)

    engine.submit_host_to_device = submit_host_to_device


def _patch_fork_start(module: ModuleType) -> None:
    import importlib
    import logging
    import multiprocessing
    import os
    import threading

    require_supported_version()
    set_envs_and_config = _attribute(module, "_set_envs_and_config")
    plugins = importlib.import_module(PLUGINS_MODULE)
    _attribute(plugins, "_plugins_loaded")

    def load_plugins_again() -> None:
        # SGLang loads the plug-ins once a process (`load_plugins`, guarded by this flag); a forked child inherits
        # the flag set, and its own call (the scheduler's, the detokenizer's) would skip what a child must install:
        # sessiongate's scheduler hooks. Its hooks registry skips targets already patched.
        plugins._plugins_loaded = False  # type: ignore[attr-defined]

    @functools.wraps(set_envs_and_config)
    def set_envs_and_config_forking(*args: Any, **kwargs: Any) -> Any:
        result = set_envs_and_config(*args, **kwargs)
        threads = threading.active_count()
        if threads == 1:
            multiprocessing.set_start_method("fork", force=True)
            os.register_at_fork(after_in_child=load_plugins_again)
        else:
            logging.getLogger(__name__).info(
                "sessiongate: starting SGLang's processes with spawn, not fork: %d threads run in this process", threads
            )
        return result

    module._set_envs_and_config = set_envs_and_config_forking  # type: ignore[attr-defined]


_CPU_PATCHES: Mapping[str, Sequence[tuple[str, Callable[[ModuleType], None]]]] = {
    TORCH_NATIVE_BACKEND_MODULE: (("attention", _patch_extend_attention),),
    HOST_POOL_COMMON_MODULE: (("hicache", _patch_host_register),),
    HOST_POOL_BASE_MODULE: (("hicache", _patch_host_pin_memory),),
    HOST_POOL_MHA_MODULE: (("hicache", _patch_mha_direct_transfers),),
    CACHE_CONTROLLER_MODULE: (("deferred_h2d", _patch_deferred_layer_events),),
    ENGINE_MODULE: (("fork_start", _patch_fork_start),),
}


def cpu_patches(
    disabled: Collection[str] = (), *, h2d_layer_delay_s: float = 0.0
) -> dict[str, list[Callable[[ModuleType], None]]]:
    """Module name -> the patches to apply right after it is imported, minus the disabled groups.

    `h2d_layer_delay_s > 0` turns on the opt-in `deferred_h2d` group with that delay per layer.
    """
    unknown = set(disabled) - set(PATCH_GROUPS)
    if unknown:
        raise ValueError(f"unknown CPU patch group(s) {sorted(unknown)}; known: {list(PATCH_GROUPS)}")
    if h2d_layer_delay_s < 0:
        raise ValueError(f"h2d_layer_delay_s must be at least 0, got {h2d_layer_delay_s}")
    off = set(disabled) | (set() if h2d_layer_delay_s > 0 else set(OPT_IN_PATCH_GROUPS))
    table: dict[str, list[Callable[[ModuleType], None]]] = {}
    for module_name, patches in _CPU_PATCHES.items():
        chosen = [patch for group, patch in patches if group not in off]
        if chosen:
            table[module_name] = chosen
    if "deferred_h2d" not in off:
        table.setdefault(L2_TRANSFER_MODULE, []).append(
            functools.partial(_patch_deferred_host_to_device, layer_delay_s=h2d_layer_delay_s)
        )
    return table

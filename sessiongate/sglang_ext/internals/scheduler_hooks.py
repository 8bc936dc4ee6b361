"""Where SGLang's scheduler process calls the extension: hooks registered with SGLang's `HookRegistry`, which its
plug-in loader applies before the scheduler is built (`install_scheduler_hooks`, from `plugin`):

- AFTER `Scheduler.init_request_dispatcher`: attach a `scheduler_ops.SchedulerExtension` to the scheduler,
  route `ipc.SessiongateCall` to it, and make the idle wait poll while KV moves (`idle_wait`);
- AFTER `Scheduler.ingest_requests` (called once per event-loop iteration, busy or idle): advance
  the prefetches in flight and sample the engine's own step counters (tokens prefilled and generated,
  against the microseconds its prefill and decode steps took) into the speed meters;
- AFTER `Scheduler._add_request_to_queue`: a no-keep request is registered as it arrives (`no_keep`);
- AFTER `Scheduler.get_new_batch_prefill`: a new prefill batch that reads pages a prefetch copy is still
  loading waits for that copy (`load_guard.LoadGuard.guard_new_batch`);
- AFTER `cache_controller.storage_model_name`: the pool's keys are namespaced by model and its revision, KV
  cache dtype (FP8 variant included) and scales, page size, layout and KV shape (`sglang_ext.pool_namespace`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from sessiongate.sglang_ext import parallelism
from sessiongate.sglang_ext.internals import idle_wait
from sessiongate.sglang_ext.internals.ipc import SessiongateCall
from sessiongate.sglang_ext.internals.scheduler_ops import SchedulerExtension
from sessiongate.sglang_ext.pool_namespace import namespaced_model_name, worker_pool_layout

__all__ = ["SCHEDULER_MODULE", "install_scheduler_hooks"]

logger = logging.getLogger(__name__)

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
CACHE_CONTROLLER_MODULE = "sglang.srt.managers.cache_controller"
_EXTENSION_ATTR = "_sessiongate_extension"


def _after_init_request_dispatcher(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    from sglang.srt.runtime_context import get_server_args
    from sglang.utils import TypeBasedDispatcher

    server_args = get_server_args()
    refused = parallelism.refusal(int(server_args.tp_size), int(server_args.pp_size), int(server_args.dp_size))
    if refused is not None:
        raise RuntimeError(refused)  # the scheduler fails to start: the server exits with this in its log

    extension = SchedulerExtension(scheduler)
    setattr(scheduler, _EXTENSION_ATTR, extension)
    idle_wait.install(scheduler, extension.moves_in_flight)
    scheduler._request_dispatcher += TypeBasedDispatcher([(SessiongateCall, extension.handle_call)])


def _after_ingest_requests(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    extension: SchedulerExtension | None = getattr(scheduler, _EXTENSION_ATTR, None)
    if extension is not None:
        extension.tick()


def _after_add_request_to_queue(result: Any, scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    extension: SchedulerExtension | None = getattr(scheduler, _EXTENSION_ATTR, None)
    if extension is not None:
        extension.admit_request(req)


def _after_get_new_batch_prefill(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    extension: SchedulerExtension | None = getattr(scheduler, _EXTENSION_ATTR, None)
    if extension is not None and result is not None:
        extension.guard_new_batch(result.batch_to_run)


def _namespaced_storage_model_name(result: Any, model_name: Any, host_pool: Any, *args: Any, **kwargs: Any) -> str:
    """AFTER SGLang's `storage_model_name`: the name every storage backend keys pages on, namespaced by how this
    worker lays its KV out (`pool_namespace`)."""
    from sglang.srt.runtime_context import get_server_args

    layout = worker_pool_layout(get_server_args(), host_pool)
    name = namespaced_model_name(result, layout)
    logger.info("sessiongate: this worker's pages in the shared pool are keyed %s (%s)", name, layout)
    return name


def install_scheduler_hooks() -> bool:
    """Register the scheduler hooks, in a process that runs a scheduler; True if registered."""
    if SCHEDULER_MODULE not in sys.modules:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        f"{SCHEDULER_MODULE}.Scheduler.init_request_dispatcher", _after_init_request_dispatcher, HookType.AFTER
    )
    HookRegistry.register(f"{SCHEDULER_MODULE}.Scheduler.ingest_requests", _after_ingest_requests, HookType.AFTER)
    HookRegistry.register(
        f"{SCHEDULER_MODULE}.Scheduler.get_new_batch_prefill", _after_get_new_batch_prefill, HookType.AFTER
    )
    HookRegistry.register(
        f"{SCHEDULER_MODULE}.Scheduler._add_request_to_queue", _after_add_request_to_queue, HookType.AFTER
    )
    HookRegistry.register(
        f"{CACHE_CONTROLLER_MODULE}.storage_model_name", _namespaced_storage_model_name, HookType.AFTER
    )
    return True

"""SGLang plug-in entry point: what sessiongate adds to each SGLang worker process.

Declared in pyproject.toml as `[project.entry-points."sglang.srt.plugins"] sessiongate =
"sessiongate.sglang_ext.plugin:load_plugin"`. SGLang 0.5.23 (`sglang/srt/plugins/__init__.py`,
`load_plugins()`) calls `load_plugin()` with no arguments, once per process, early in the HTTP
server process (`launch_server`, `Engine`), in each scheduler, in the detokenizer and in the
data-parallel controller; it then applies the hooks registered with its `HookRegistry`. An
exception here is logged by SGLang and the server starts without the extension, so the
endpoints answering is the proof that it loaded.

Opt-in: installing sessiongate puts this entry point in every SGLang server of that environment,
so the plug-in does nothing (and says so in one log line, in the HTTP server process) unless the
server's environment has `SESSIONGATE_EXTENSION=1`, which `sglang_ext.launcher` sets for the
workers it starts. A plain `python -m sglang.launch_server` keeps SGLang's own behaviour (its Rust
tree core included).

What it adds:
- in every process: the tool-call parser `TINY_TOOL_CALL_PARSER` (Qwen2.5's format, with forced
  calls constrained by JSON schema; see `plugin_ops.register_json_required_tool_parser`),
  which the launcher selects for the tiny random-weight models;
- in every process: the extension's IPC types (`internals.ipc`), known to SGLang's codec;
- in the HTTP server process: a check of SGLang's arguments before anything loads (`internals.startup_check`:
  one scheduler rank, one tokenizer worker); `GET /sessiongate/v1/info` (`WorkerInfo`), `GET .../load`,
  `POST .../prefetch`, `GET`/`DELETE .../prefetch/{id}`, `POST .../sessions/{id}/retain` and
  `.../drop` (`endpoints`);
- in each scheduler process: the hooks that run prefetches, session KV operations and count
  throughput (`internals.scheduler_ops`), and SGLang's Python radix tree core, whose eviction
  order the extension can rank (`internals.kv_ops`; see docs/prefetch.md, "Priority").
"""

from __future__ import annotations

import importlib.metadata
import logging
import multiprocessing
import os

from sessiongate.sglang_ext.cpu_compat import active_hooks
from sessiongate.sglang_ext.internals import patches, plugin_ops
from sessiongate.sglang_ext.protocol import INFO_PATH, LOAD_PATH, PREFETCH_PATH, SESSIONS_PATH, WorkerInfo

__all__ = ["ENABLE_ENV", "TINY_TOOL_CALL_PARSER", "enabled", "load_plugin", "worker_info"]

logger = logging.getLogger(__name__)

TINY_TOOL_CALL_PARSER = "sessiongate-json"
ENABLE_ENV = "SESSIONGATE_EXTENSION"
"""`1` turns the plug-in on in a server's processes (the launcher sets it); anything else leaves SGLang as is."""


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "").strip() == "1"


def _is_http_server_process() -> bool:
    # SGLang starts its schedulers and detokenizer with multiprocessing; the process that serves
    # HTTP is the one the launcher started, which has no multiprocessing parent.
    return multiprocessing.parent_process() is None


def worker_info() -> WorkerInfo:
    facts = plugin_ops.server_facts()
    return WorkerInfo(
        version=importlib.metadata.version("sessiongate"),
        sglang_version=patches.installed_sglang_version(),
        cpu_compat=active_hooks() is not None,
        model_path=facts.model_path,
        served_model_name=facts.served_model_name,
        page_size=facts.page_size,
        hierarchical_cache=facts.hierarchical_cache,
        storage_backend=facts.storage_backend,
    )


async def _info_endpoint() -> dict[str, object]:
    return worker_info().model_dump(mode="json")


def load_plugin() -> None:
    """Called by SGLang's plug-in loader in every process of a worker."""
    if not enabled():
        if _is_http_server_process():
            # A warning: SGLang has not configured logging yet when it loads plug-ins, and only warnings reach
            # the server's log then (Python's last-resort handler).
            logger.warning(
                "sessiongate plug-in installed but not enabled (%s=1 turns it on; `sessiongate worker` sets it): "
                "SGLang runs unchanged",
                ENABLE_ENV,
            )
        return
    patches.require_supported_version()
    plugin_ops.register_json_required_tool_parser(TINY_TOOL_CALL_PARSER)
    # Imported here: these modules import SGLang, which only its own processes have loaded.
    from sessiongate.sglang_ext.internals import ipc, kv_ops, scheduler_hooks

    ipc.register_types()
    if _is_http_server_process():
        from sessiongate.sglang_ext.endpoints import Endpoints
        from sessiongate.sglang_ext.internals.http_ops import add_route
        from sessiongate.sglang_ext.internals.startup_check import install_startup_check

        install_startup_check()  # TP/PP/DP > 1 or several tokenizer workers: refused before the model loads

        plugin_ops.add_http_get_route(INFO_PATH, _info_endpoint)
        endpoints = Endpoints()
        add_route(LOAD_PATH, endpoints.load, ["GET"])
        add_route(PREFETCH_PATH, endpoints.start_prefetch, ["POST"])
        add_route(f"{PREFETCH_PATH}/{{prefetch_id}}", endpoints.prefetch_status, ["GET"])
        add_route(f"{PREFETCH_PATH}/{{prefetch_id}}", endpoints.cancel_prefetch, ["DELETE"])
        add_route(f"{SESSIONS_PATH}/{{session_id}}/{{operation}}", endpoints.session_kv, ["POST"])
    elif scheduler_hooks.install_scheduler_hooks():
        # Read when the scheduler builds its radix cache, after the plug-ins are loaded.
        name, value = kv_ops.PYTHON_TREE_CORE_ENV
        os.environ[name] = value

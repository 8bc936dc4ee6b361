"""Refuse, in the HTTP server process, an SGLang server the extension cannot run in, before anything is loaded.

The launcher refuses such command lines itself (`parallelism.args_refusal`); a server started some other way
(`python -m sglang.launch_server` with `SESSIONGATE_EXTENSION=1`) used to be refused only by the scheduler hook,
after the model was loaded and the host KV pool pinned. This hook runs AFTER SGLang's
`validation_hook.check_server_args`, which `Engine._launch_subprocesses` calls in the HTTP server process before it
spawns the schedulers: TP, PP or DP above 1, or more than one tokenizer worker (with which SGLang puts its API-key
check on none of the extension's routes), stop the server there with the reason.
"""

from __future__ import annotations

from typing import Any

from sessiongate.sglang_ext import parallelism

__all__ = ["VALIDATION_MODULE", "install_startup_check", "refusal_for"]

VALIDATION_MODULE = "sglang.srt.arg_groups.validation_hook"


def refusal_for(server_args: Any) -> str | None:
    """Why the extension cannot run with these SGLang server arguments, or None."""
    sizes = [int(getattr(server_args, name, 1) or 1) for name in ("tp_size", "pp_size", "dp_size")]
    return parallelism.refusal(*sizes) or parallelism.tokenizer_workers_refusal(
        int(getattr(server_args, "tokenizer_worker_num", 1) or 1)
    )


def _after_check_server_args(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> Any:
    refused = refusal_for(server_args)
    if refused is not None:
        raise ValueError(refused)
    return result


def install_startup_check() -> None:
    """Register the check; called by the plug-in in the HTTP server process."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{VALIDATION_MODULE}.check_server_args", _after_check_server_args, HookType.AFTER)

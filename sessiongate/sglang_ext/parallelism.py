"""Why the extension refuses a worker that runs more than one scheduler rank (TP, PP or DP > 1).

The extension decides on each scheduler from that scheduler's own state and clock: when a prefetch's load may
start (`PrefetchJobs.start_loads`), which nodes rank first for eviction (`kv_fate`, by `time.monotonic`),
what a no-keep request leaves behind. SGLang's tensor-parallel ranks must take the same cache decisions in
lockstep (it all-reduces its own, e.g. in `loading_check`); decisions taken on each rank's clock can diverge, and
then the ranks' trees differ and a collective hangs or a rank reads another's pages. Until those decisions come
from a value all ranks agree on, a worker with more than one rank is refused: by the launcher before it starts,
and by the scheduler hook if SGLang was started some other way. Data parallelism is refused too: the extension's
calls reach one scheduler, not the one that will serve the session.

More than one tokenizer worker (`--tokenizer-worker-num` > 1) is refused too, for another reason: SGLang then
serves HTTP from several processes and adds its API-key check to none of the routes a plug-in adds, so the
extension's endpoints (which move and delete KV) would be open to anyone who reaches the worker.
`args_refusal(args)` checks a command line before anything starts; the plug-in checks SGLang's own arguments in
the HTTP server process before the scheduler loads the model (`internals.startup_check`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["args_refusal", "parallel_sizes", "refusal", "tokenizer_workers_refusal"]

_FLAGS = {
    "tp": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size", "--dp"),
}
_TOKENIZER_WORKERS = "tokenizer_workers"
_TOKENIZER_FLAGS = ("--tokenizer-worker-num",)


def parallel_sizes(args: Sequence[str]) -> dict[str, int]:
    """The TP, PP and DP sizes an SGLang command line asks for (1 where it names none)."""
    return {name: size for name, size in _sizes(args).items() if name in _FLAGS}


def _sizes(args: Sequence[str]) -> dict[str, int]:
    every = {**_FLAGS, _TOKENIZER_WORKERS: _TOKENIZER_FLAGS}
    sizes = {name: 1 for name in every}
    for index, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        for name, flags in every.items():
            if flag in flags:
                text = inline if inline else (args[index + 1] if index + 1 < len(args) else "")
                try:
                    sizes[name] = int(text)
                except ValueError:
                    raise ValueError(f"{flag} needs a whole number, got {text!r}") from None
    return sizes


def refusal(tp_size: int, pp_size: int = 1, dp_size: int = 1) -> str | None:
    """The error to raise for these sizes, or None when the extension supports them (all 1)."""
    if tp_size == pp_size == dp_size == 1:
        return None
    return (
        f"sessiongate's SGLang extension supports one scheduler rank per worker (tp=1, pp=1, dp=1), got "
        f"tp={tp_size}, pp={pp_size}, dp={dp_size}: its cache decisions are taken on each rank's own clock and "
        "could diverge between ranks. Run one worker per GPU (`sessiongate up` does) and let the gateway spread "
        "sessions across them."
    )


def tokenizer_workers_refusal(tokenizer_workers: int) -> str | None:
    """The error to raise for this many tokenizer workers, or None for one."""
    if tokenizer_workers <= 1:
        return None
    return (
        f"sessiongate's SGLang extension needs one tokenizer worker, got --tokenizer-worker-num {tokenizer_workers}: "
        "with more, SGLang applies its --api-key check to none of the extension's endpoints (prefetch, retain, drop, "
        "load), which move and delete KV."
    )


def args_refusal(args: Sequence[str]) -> str | None:
    """Why an SGLang command line cannot run with the extension, or None: checked before anything starts."""
    sizes = _sizes(args)
    return refusal(sizes["tp"], sizes["pp"], sizes["dp"]) or tokenizer_workers_refusal(sizes[_TOKENIZER_WORKERS])

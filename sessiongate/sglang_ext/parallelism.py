"""Why the extension refuses a worker that runs more than one scheduler rank (TP, PP or DP > 1).

The extension decides on each scheduler from that scheduler's own state and clock: when a prefetch's load may
start (`SchedulerExtension._start_loads`), which nodes rank first for eviction (`kv_fate`, by `time.monotonic`),
what a no-keep request leaves behind. SGLang's tensor-parallel ranks must take the same cache decisions in
lockstep (it all-reduces its own, e.g. in `loading_check`); decisions taken on each rank's clock can diverge, and
then the ranks' trees differ and a collective hangs or a rank reads another's pages. Until those decisions come
from a value all ranks agree on, a worker with more than one rank is refused: by the launcher before it starts,
and by the scheduler hook if SGLang was started some other way. Data parallelism is refused too: the extension's
calls reach one scheduler, not the one that will serve the session.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["parallel_sizes", "refusal"]

_FLAGS = {
    "tp": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size", "--dp"),
}


def parallel_sizes(args: Sequence[str]) -> dict[str, int]:
    """The TP, PP and DP sizes an SGLang command line asks for (1 where it names none)."""
    sizes = {name: 1 for name in _FLAGS}
    for index, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        for name, flags in _FLAGS.items():
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

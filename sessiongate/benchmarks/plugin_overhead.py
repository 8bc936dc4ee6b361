"""What sessiongate's plug-in costs a worker per scheduler step: the same worker with and without it.

One tiny-model CPU worker at a time (never two at once: they would share the cores), started with the launcher's
flags, once with the plug-in (`SESSIONGATE_EXTENSION=1`: its hooks on every scheduler iteration, the Python radix
tree core it selects, its endpoints) and once without (`WorkerConfig.extension=False`: plain SGLang 0.5.23, Rust
tree core). Each is warmed up, then timed through its HTTP API:

- a decode step at batch 1 and 4: concurrent generations of 264 and of 8 tokens (each measured `--samples` times,
  the fastest kept), the extra wall time over 256 steps;
- a prefill: one 1,024-token prompt with `max_new_tokens=1` (fastest of `--samples`).

The fastest of several samples, because on a shared machine interference only ever adds time; then the median
over `--repeats` rounds, alternating which worker goes first. One OpenMP thread per worker (`--cpu-threads`), so a
busy neighbour takes a core, not a barrier. No prefetch runs during the timing: this is the price of having the
plug-in loaded, not of what it does.

    python -m sessiongate.benchmarks.plugin_overhead --repeats 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from sessiongate.benchmarks.colocated_workers import batch_seconds, prefill_s
from sessiongate.benchmarks.prefetch_bench import _context
from sessiongate.benchmarks.processes import free_port
from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
from sessiongate.sglang_ext.tiny_model import SIZES

__all__ = ["main"]

BATCHES = (1, 4)
_SHORT, _LONG = 8, 264


def _fastest(samples: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(samples))


def _one_round(config: WorkerConfig, rng: random.Random, vocab: int, samples: int) -> dict[str, float]:
    worker = start_worker(config)
    try:
        worker.wait_ready(600)
        url = worker.url
        prompts = {batch: [_context(rng, 128, vocab) for _ in range(batch)] for batch in BATCHES}
        batch_seconds(url, prompts[1], _SHORT)  # warm-up
        figures: dict[str, float] = {}
        for batch in BATCHES:
            long = _fastest(samples, lambda b=batch: batch_seconds(url, prompts[b], _LONG))  # type: ignore[misc]
            short = _fastest(samples, lambda b=batch: batch_seconds(url, prompts[b], _SHORT))  # type: ignore[misc]
            figures[f"decode_b{batch}_ms"] = 1000 * (long - short) / (_LONG - _SHORT)
        figures["prefill_1k_ms"] = 1000 * _fastest(samples, lambda: prefill_s([url], [url], 1024, rng, vocab))
        return figures
    finally:
        worker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--cpu-threads", type=int, default=1, help="OpenMP threads per worker (default 1)")
    parser.add_argument("--samples", type=int, default=3, help="samples per figure; the fastest is kept")
    args = parser.parse_args(argv)
    rng = random.Random(7)
    vocab = SIZES[args.model_size].vocab_size
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="plugin-overhead-") as tmp:
        state = Path(tmp)
        for round_ in range(args.repeats):
            for extension in (True, False) if round_ % 2 == 0 else (False, True):
                config = WorkerConfig(
                    state_dir=state,
                    model_size=args.model_size,
                    port=free_port(),
                    device="cpu",
                    cpu_threads=args.cpu_threads,
                    storage_backend="file",
                    extension=extension,
                    log_file=state / f"worker-{extension}-{round_}.log",
                )
                results[extension].append(_one_round(config, rng, vocab, args.samples))
                print(f"round {round_ + 1}, plug-in {'on' if extension else 'off'}: {results[extension][-1]}")
    keys = list(results[True][0])
    print(f"\nmedians over {args.repeats} rounds of the fastest of {args.samples} ({args.model_size} model, CPU)")
    print(f"{'':>16} {'with plug-in':>14} {'without':>10} {'difference':>12}")
    for key in keys:
        on = statistics.median(run[key] for run in results[True])
        off = statistics.median(run[key] for run in results[False])
        print(f"{key:>16} {on:>12.2f}ms {off:>8.2f}ms {on - off:>+10.2f}ms ({(on - off) / off:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

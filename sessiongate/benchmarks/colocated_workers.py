"""Several SGLang CPU workers on one machine: step times with every core each against a share of the cores each.

`batch_seconds`, `decode_step_s` and `prefill_s` are the timings; `benchmarks.sim.calibrate_cpu` uses them too.
For each thread setting, `--workers` real tiny-model workers are started side by side (as `sessiongate up` and the
replay start them), warmed up, and timed through their HTTP API, first one worker alone while the others idle,
then all of them busy at once:

- a decode step: `batch` concurrent generations of 72 and of 8 tokens; the extra wall time over 64 tokens;
- a prefill: the wall time of one 1,024-token prompt with `max_new_tokens=1`.

The settings: `all cores` is torch's default, one OpenMP thread per core in every worker; `shared cores` is
`cores_per_worker(workers)` threads each (`WorkerConfig.cpu_threads`, what the launchers now pass). With every
core each, a worker's OpenMP threads spin at each operator's barrier while the other workers' threads hold the
cores, so "all busy" is far slower than "alone"; with a share each they do not wait on one another.

    python -m sessiongate.benchmarks.colocated_workers                # 2 workers, both settings, median of 3
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from sessiongate.benchmarks.prefetch_bench import VOCAB, _context
from sessiongate.benchmarks.processes import free_port
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.worker_process import wait_all_ready

__all__ = ["Timings", "batch_seconds", "decode_step_s", "main", "measure", "prefill_s"]

_SHORT, _LONG = 8, 72


@dataclass(frozen=True, slots=True)
class Timings:
    setting: str
    threads: int | None
    decode_alone_s: dict[int, float]  # batch -> seconds per decode step
    decode_busy_s: dict[int, float]
    prefill_alone_s: float
    prefill_busy_s: float


def batch_seconds(url: str, prompts: list[list[int]], tokens: int) -> float:
    """Wall time of len(prompts) concurrent generations of `tokens` tokens each."""
    start = threading.Barrier(len(prompts) + 1)

    def one(ids: list[int]) -> None:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}}
        with httpx.Client(base_url=url, timeout=600) as client:
            start.wait()
            client.post("/generate", json=body).raise_for_status()

    threads = [threading.Thread(target=one, args=(ids,)) for ids in prompts]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def _all_at_once(urls: Sequence[str], one: Callable[[str], float]) -> float:
    """Run `one(url)` for every url at the same time; the mean of what they return."""
    out: dict[str, float] = {}
    threads = [threading.Thread(target=lambda u=u: out.__setitem__(u, one(u))) for u in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statistics.mean(out.values())


def _flush(urls: Sequence[str]) -> None:
    for url in urls:
        httpx.post(f"{url}/flush_cache", params={"timeout": 60}, timeout=120).raise_for_status()


def decode_step_s(all_urls: Sequence[str], urls: Sequence[str], batch: int, rng: random.Random, vocab: int) -> float:
    by_tokens = {}
    for tokens in (_SHORT, _LONG):
        _flush(all_urls)
        prompts = {u: [_context(rng, 128, vocab) for _ in range(batch)] for u in urls}
        by_tokens[tokens] = _all_at_once(urls, functools.partial(_batch_of, prompts, tokens))
    return (by_tokens[_LONG] - by_tokens[_SHORT]) / (_LONG - _SHORT)


def _batch_of(prompts: dict[str, list[list[int]]], tokens: int, url: str) -> float:
    return batch_seconds(url, prompts[url], tokens)


def prefill_s(all_urls: Sequence[str], urls: Sequence[str], length: int, rng: random.Random, vocab: int) -> float:
    _flush(all_urls)

    def one(url: str) -> float:
        body = {"input_ids": _context(rng, length, vocab), "sampling_params": {"max_new_tokens": 1}}
        # The client is made outside the timing: a new httpx client loads its CA bundle, tens of ms of CPU.
        with httpx.Client(base_url=url, timeout=600) as client:
            began = time.perf_counter()
            client.post("/generate", json=body).raise_for_status()
            return time.perf_counter() - began

    return _all_at_once(urls, one)


def measure(
    setting: str,
    threads: int | None,
    *,
    workers: int,
    batches: Sequence[int],
    repeats: int,
    state: Path,
    model_size: str = "tiny",
) -> Timings:
    started: list[WorkerProcess] = []
    try:
        for i in range(workers):
            config = WorkerConfig(
                state_dir=state,
                model_size=model_size,
                port=free_port(),
                device="cpu",
                cpu_threads=threads,
                max_total_tokens=4096,
                page_size=16,
                storage_backend=None,
                log_file=state / "logs" / f"{setting.replace(' ', '-')}-{i}.log",
            )
            started.append(start_worker(config))
        wait_all_ready(started, 600)  # fails as soon as any one worker fails
        urls = [w.url for w in started]
        vocab = VOCAB[model_size]
        rng = random.Random(7)
        for _ in range(2):  # warm-up: the first requests of a fresh worker are slow
            decode_step_s(urls, urls, 1, rng, vocab)
            prefill_s(urls, urls, 256, rng, vocab)

        def median(run: Callable[..., float], busy: Sequence[str], size: int) -> float:
            return statistics.median(run(urls, busy, size, rng, vocab) for _ in range(repeats))

        return Timings(
            setting=setting,
            threads=threads,
            decode_alone_s={b: median(decode_step_s, urls[:1], b) for b in batches},
            decode_busy_s={b: median(decode_step_s, urls, b) for b in batches},
            prefill_alone_s=median(prefill_s, urls[:1], 1024),
            prefill_busy_s=median(prefill_s, urls, 1024),
        )
    finally:
        for worker in started:
            worker.stop()


def render(results: Sequence[Timings], workers: int) -> str:
    lines = [
        f"| {workers} workers | threads each | "
        + " | ".join(f"decode b{b} alone / all busy ms" for b in results[0].decode_alone_s)
        + " | prefill 1,024 alone / all busy ms |",
        "|---|---:|" + "---:|" * (len(results[0].decode_alone_s) + 1),
    ]
    for r in results:
        decode = " | ".join(
            f"{r.decode_alone_s[b] * 1000:.1f} / {r.decode_busy_s[b] * 1000:.1f}" for b in r.decode_alone_s
        )
        threads = "torch default" if r.threads is None else str(r.threads)
        lines.append(
            f"| {r.setting} | {threads} | {decode} | {r.prefill_alone_s * 1000:.0f} / {r.prefill_busy_s * 1000:.0f} |"
        )
    if len(results) == 2:
        base, shared = results
        ratios = ", ".join(f"b{b} {base.decode_busy_s[b] / shared.decode_busy_s[b]:.1f}x" for b in base.decode_busy_s)
        lines.append(
            f"\nAll busy, {base.setting} over {shared.setting}: decode step {ratios}; "
            f"prefill {base.prefill_busy_s / shared.prefill_busy_s:.2f}x."
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-size", choices=tuple(VOCAB), default="tiny")
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="colocated-workers-"))
    settings = (("all cores", None), ("shared cores", cores_per_worker(args.workers)))
    results = [
        measure(
            name,
            threads,
            workers=args.workers,
            batches=args.batches,
            repeats=args.repeats,
            state=state,
            model_size=args.model_size,
        )
        for name, threads in settings
    ]
    print(render(results, args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

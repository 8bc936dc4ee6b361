"""Measure one real SGLang CPU worker and write the simulator's CPU profile (JSON).

One worker is started with `sglang_ext.launcher.start_worker` (HiCache host tier and the `file` pool, as the
replay's workers), and four things are timed through its HTTP API, each with a fresh random context so nothing
is shared between cases:

- prefill: the wall time of `/generate` with `max_new_tokens=1` for prompts of several lengths on an empty cache
  (this includes the HTTP round trip, which the real replay's TTFT includes too), fitted as a + b*n + c*n^2;
- decode: `batch` concurrent generations of 72 and of 8 tokens; the difference in wall time over 64 is one step,
  for several batch sizes and two context lengths, fitted as base + per_seq*batch + per_kv_token*kv_tokens;
- pool -> host and host -> device: a context is computed (written through to the pool), the cache is flushed,
  then `POST /sessiongate/v1/prefetch` brings it to the host tier, then to the device; the prefetch's duration
  against its `bytes_loaded`, over two context lengths, is fitted as latency + bytes / rate (the tiny model's KV
  is small, so the latency, the worker's polling and bookkeeping, dominates);
- the KV bytes per token, from the same prefetches.

The numbers describe this machine, this model and this load (other processes share the cores): the profile
records where and when it was measured, and docs/simulator.md cites the values of the run it reports.

    python -m benchmarks.sim.calibrate_cpu --model-size tiny --max-total-tokens 2048 --page-size 16 \
        --hicache-ratio 4 --out benchmarks/sim/profiles/cpu_tiny.json     # the replay's worker settings
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.prefetch_bench import VOCAB, _context, _generate, _prefetch, _wait_pool_quiet
from sglang_ext.launcher import WorkerConfig, start_worker

__all__ = ["fit_decode", "fit_move", "fit_prefill", "main"]


def _nonnegative_lstsq(design: np.ndarray, target: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: terms that come out negative (noise) are dropped and refitted."""
    active = list(range(design.shape[1]))
    while True:
        solution = np.linalg.lstsq(design[:, active], target, rcond=None)[0]
        if all(v >= 0 for v in solution) or len(active) == 1:
            coefficients = [0.0] * design.shape[1]
            for index, value in zip(active, solution, strict=True):
                coefficients[index] = max(float(value), 0.0)
            return coefficients
        active.pop(int(np.argmin(solution)))


def fit_prefill(points: Sequence[tuple[int, float]]) -> dict[str, float]:
    """seconds = a + b*n + c*n^2 (c: attention, quadratic in the prompt), coefficients >= 0."""
    n = np.array([p[0] for p in points], dtype=float)
    design = np.stack([np.ones_like(n), n, n * n], axis=1)
    a, b, c = _nonnegative_lstsq(design, np.array([p[1] for p in points]))
    return {"a_s": a, "per_token_s": b, "per_token_sq_s": c}


def fit_decode(points: Sequence[tuple[int, int, float]]) -> dict[str, float]:
    """step seconds = base + per_seq*batch + per_kv_token*(KV tokens the batch reads), coefficients >= 0."""
    design = np.array([[1.0, b, b * ctx] for b, ctx, _ in points])
    base, per_seq, per_kv = _nonnegative_lstsq(design, np.array([p[2] for p in points]))
    return {"base_s": base, "per_seq_s": per_seq, "per_kv_token_s": per_kv}


def fit_move(points: Sequence[tuple[int, float]]) -> dict[str, float]:
    """seconds = latency + bytes / rate."""
    design = np.array([[1.0, float(b)] for b, _ in points])
    latency, per_byte = _nonnegative_lstsq(design, np.array([p[1] for p in points]))
    return {"latency_s": latency, "bytes_per_s": 1.0 / per_byte if per_byte > 0 else float("inf")}


def _flush(client: httpx.Client) -> None:
    client.post("/flush_cache", params={"timeout": 60}).raise_for_status()


def _measure_prefill(
    client: httpx.Client, rng: random.Random, vocab: int, lengths: Sequence[int], repeats: int
) -> list[tuple[int, float]]:
    points = []
    for length in lengths:
        times = []
        for _ in range(repeats):
            _flush(client)
            elapsed, _ = _generate(client, _context(rng, length, vocab))
            times.append(elapsed)
        points.append((length, statistics.median(times)))
    return points


def _batch_seconds(url: str, prompts: list[list[int]], tokens: int) -> float:
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


def _measure_decode(
    url: str, rng: random.Random, vocab: int, batches: Sequence[int], contexts: Sequence[int], repeats: int
) -> list[tuple[int, int, float]]:
    """Step time = the extra wall time of a batch generating `long` instead of `short` tokens, per extra token."""
    short, long = 8, 72
    points = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for context in contexts:
            for batch in batches:
                steps = []
                for _ in range(repeats):
                    _flush(client)
                    prompts = [_context(rng, context, vocab) for _ in range(batch)]
                    few = _batch_seconds(url, prompts, short)
                    _flush(client)
                    prompts = [_context(rng, context, vocab) for _ in range(batch)]
                    many = _batch_seconds(url, prompts, long)
                    steps.append((many - few) / (long - short))
                points.append((batch, context + (short + long) // 2, statistics.median(steps)))
    return points


def _measure_moves(
    client: httpx.Client,
    pool: Path,
    rng: random.Random,
    vocab: int,
    lengths: Sequence[int],
    repeats: int,
    page_size: int,
) -> dict[str, Any]:
    to_host: list[tuple[int, float]] = []
    to_device: list[tuple[int, float]] = []
    per_token: list[float] = []
    for length in lengths:
        for _ in range(repeats):
            ids = _context(rng, length, vocab)
            _flush(client)
            before = len(list(pool.iterdir()))
            _generate(client, ids)
            _wait_pool_quiet(pool, before)
            _flush(client)
            host = _prefetch(client, ids, "host")
            device = _prefetch(client, ids, "device")
            for status, points in ((host, to_host), (device, to_device)):
                duration = (status.finished_at or status.created_at) - status.created_at
                if status.bytes_loaded > 0:
                    points.append((status.bytes_loaded, duration))
            loaded_tokens = (host.pages_in_host + host.pages_on_device) * page_size
            if host.bytes_loaded > 0 and loaded_tokens > 0:
                per_token.append(host.bytes_loaded / loaded_tokens)
    return {
        "pool_to_host": fit_move(to_host) if len(to_host) >= 2 else None,
        "host_to_device": fit_move(to_device) if len(to_device) >= 2 else None,
        "kv_bytes_per_token": round(statistics.median(per_token)) if per_token else None,
        "samples": {"pool_to_host": to_host, "host_to_device": to_device},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", choices=("tiny", "medium"), default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=31611)
    parser.add_argument("--max-total-tokens", type=int, default=WorkerConfig.max_total_tokens)
    parser.add_argument("--chunked-prefill-size", type=int, default=WorkerConfig.chunked_prefill_size)
    parser.add_argument("--max-running-requests", type=int, default=WorkerConfig.max_running_requests)
    parser.add_argument("--page-size", type=int, default=WorkerConfig.page_size)
    parser.add_argument("--hicache-ratio", type=float, default=WorkerConfig.hicache_ratio)
    parser.add_argument("--prefill-lengths", type=int, nargs="+", default=[16, 128, 256, 512, 1024, 1536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--move-lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="sim-calibrate-"))
    pool = state / "pool"
    config = WorkerConfig(
        state_dir=state,
        model_size=args.model_size,
        port=args.port,
        pool_dir=pool,
        max_total_tokens=args.max_total_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        page_size=args.page_size,
        hicache_ratio=args.hicache_ratio,
        device="cpu",
        log_file=state / "worker.log",
    )
    vocab = VOCAB[args.model_size]
    rng = random.Random(11)
    worker = start_worker(config)
    try:
        worker.wait_ready(600)
        with httpx.Client(base_url=worker.url, timeout=600) as client:
            _generate(client, _context(rng, 64, vocab))  # warm-up
            prefill = _measure_prefill(client, rng, vocab, args.prefill_lengths, args.repeats)
            decode = _measure_decode(worker.url, rng, vocab, args.batches, args.decode_contexts, args.repeats)
            moves = _measure_moves(client, pool, rng, vocab, args.move_lengths, args.repeats, config.page_size)
    finally:
        worker.stop()
    profile = {
        "kind": "cpu",
        "model_size": args.model_size,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "worker": {
            "max_total_tokens": config.max_total_tokens,
            "chunked_prefill_size": config.chunked_prefill_size,
            "max_running_requests": config.max_running_requests,
            "page_size": config.page_size,
            "hicache_ratio": config.hicache_ratio,
        },
        "prefill": {"points": prefill, "fit": fit_prefill(prefill)},
        "decode": {"points": decode, "fit": fit_decode(decode)},
        "moves": moves,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    print(json.dumps({k: profile[k] for k in ("prefill", "decode", "moves")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

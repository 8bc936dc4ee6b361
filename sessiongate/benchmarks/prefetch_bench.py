"""What an advisory prefetch is worth: TTFT of a session's next turn by where its KV is, on real workers.

Two SGLang CPU workers (the launcher's, with the sessiongate extension) share one `file` KV pool
directory. For each context length a session's turn is computed on worker A (its KV is written
through to the pool); the next turn (the same context plus `--suffix` new tokens) is then sent to
worker B, with its KV

B's radix cache (device and host) is flushed before each case, so only the case's own KV is there.

  (a) recomputed: a context no worker has seen;
  (b) pool at request time: B fetches it from the pool when the request arrives (SGLang's own path);
  (c) prefetched to host: `POST /sessiongate/v1/prefetch` target=host, finished before the request;
  (d) prefetched to device: the same with target=device.

TTFT is the client's wall time of `/generate` with `max_new_tokens=1`, the median of `--repeats`
(each repeat a fresh context, so nothing is shared between cases). Also reported: the prefetch's
own throughput (bytes loaded / prefetch duration) against a plain copy of the same bytes (reading
the session's page files from the pool directory, and a memcpy of that many bytes), and the decode
rate of a running request with and without prefetches running beside it.

    python -m sessiongate.benchmarks.prefetch_bench                               # medium model, 1k/4k/16k
    python -m sessiongate.benchmarks.prefetch_bench --model-size tiny --contexts 1024 4096 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import httpx

from sessiongate.sdk._sse import iter_events
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.models import MODEL_NAMES, MODELS
from sessiongate.sglang_ext.protocol import PREFETCH_PATH, PrefetchStatus
from sessiongate.sglang_ext.worker_process import wait_all_ready

__all__ = ["main"]

Case = Literal["recompute", "pool", "host", "device"]
CASES: tuple[Case, ...] = ("recompute", "pool", "host", "device")
VOCAB = {name: model.shape.vocab_size for name, model in MODELS.items()}


@dataclass(frozen=True)
class Turn:
    context_tokens: int
    case: Case
    ttft_s: float
    cached: dict[str, Any]
    prefetch: PrefetchStatus | None


def _context(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(length)]


def _generate(client: httpx.Client, ids: list[int]) -> tuple[float, dict[str, Any]]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_cached_tokens_details": True,
    }
    started = time.perf_counter()
    response = client.post("/generate", json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    meta = response.json()["meta_info"]
    return elapsed, cast(dict[str, Any], meta.get("cached_tokens_details") or {})


def _wait_pool_quiet(pool: Path, before: int, quiet_s: float = 1.0, timeout: float = 120.0) -> None:
    """Write-through is asynchronous: wait until the pool directory grew and stopped growing."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(list(pool.iterdir()))
        if count != last:
            last, since = count, time.monotonic()
        elif count > before and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the pool directory {pool} did not settle")


def _prefetch(client: httpx.Client, ids: list[int], target: str, timeout: float = 300.0) -> PrefetchStatus:
    """Start a prefetch and poll it until it ends; a prefetch still queued or running after `timeout` seconds is an
    error that names its last status (a worker that never ends one must not hang the benchmark)."""
    response = client.post(PREFETCH_PATH, json={"session_id": "bench", "input_ids": ids, "target": target})
    response.raise_for_status()
    prefetch_id = response.json()["prefetch_id"]
    deadline = time.monotonic() + timeout
    while True:
        status = PrefetchStatus.model_validate(client.get(f"{PREFETCH_PATH}/{prefetch_id}").json())
        if status.state not in ("queued", "running"):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"prefetch {prefetch_id} still {status.state} after {timeout:.0f} s: {status}")
        time.sleep(0.01)


def _turn(a: httpx.Client, b: httpx.Client, pool: Path, ids: list[int], suffix: list[int], case: Case) -> Turn:
    status = None
    # B starts every case empty (device and host tiers; the pool is untouched).
    b.post("/flush_cache", params={"timeout": 60}).raise_for_status()
    if case != "recompute":
        before = len(list(pool.iterdir()))
        _generate(a, ids)
        _wait_pool_quiet(pool, before)
        if case in ("host", "device"):
            status = _prefetch(b, ids, case)
    ttft, cached = _generate(b, ids + suffix)
    return Turn(len(ids), case, ttft, cached, status)


def _plain_copy_gbps(pool: Path, nbytes: int) -> tuple[float, float]:
    """GB/s of reading `nbytes` of page files from the pool directory, and of a memcpy of as many bytes."""
    import numpy as np

    newest_first = sorted(pool.iterdir(), key=lambda path: path.stat().st_mtime, reverse=True)
    read = 0
    started = time.perf_counter()
    for path in newest_first:
        read += len(path.read_bytes())
        if read >= nbytes:
            break
    file_s = time.perf_counter() - started
    source = np.ones(max(nbytes, 1), dtype=np.uint8)
    started = time.perf_counter()
    copy = source.copy()
    memcpy_s = time.perf_counter() - started
    assert copy.nbytes == source.nbytes
    return read / file_s / 1e9, source.nbytes / memcpy_s / 1e9


def _decode_rate(b: httpx.Client, vocab: int, tokens: int, during: Any = None) -> float:
    """Tokens per second of one streamed generation on B, optionally while `during()` runs beside it."""
    rng = random.Random(tokens)
    body = {
        "input_ids": _context(rng, 64, vocab),
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    stamps: list[float] = []
    worker: threading.Thread | None = None
    with b.stream("POST", "/generate", json=body) as response:
        for event in iter_events(response.iter_lines()):
            if not event.done:
                stamps.append(time.perf_counter())
                if len(stamps) == 5 and during is not None:
                    worker = threading.Thread(target=during)
                    worker.start()
    if worker is not None:
        worker.join()
    # Skip the first chunks: prefill and start-up.
    steady = stamps[5:]
    return (len(steady) - 1) / (steady[-1] - steady[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", "--model", dest="model_size", choices=MODEL_NAMES, default="medium")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--suffix", type=int, default=32, help="new tokens of the next turn")
    parser.add_argument("--decode-tokens", type=int, default=200)
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args(argv)

    longest = max(args.contexts) + args.suffix
    # Room on each device for one context per case and repeat in flight, at least.
    max_total = max(4096, 2 * longest + 1024) // 64 * 64
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="prefetch-bench-"))
    pool = state / "pool"
    configs = [
        WorkerConfig(
            state_dir=state,
            model_size=args.model_size,
            port=port,
            pool_dir=pool,
            max_total_tokens=max_total,
            chunked_prefill_size=2048,
            cpu_threads=cores_per_worker(2),
            gpu_share=2,
            log_file=state / f"{name}.log",
            extra_args=("--context-length", str(longest + 64)),
        )
        for name, port in (("a", 31501), ("b", 31502))
    ]
    workers: list[WorkerProcess] = []
    try:
        for config in configs:
            workers.append(start_worker(config))
        wait_all_ready(workers, 600)  # fails as soon as any one worker fails
        return _run(args, workers, pool)
    finally:
        for worker in workers:
            worker.stop()


def _run(args: argparse.Namespace, workers: list[WorkerProcess], pool: Path) -> int:
    vocab = VOCAB[args.model_size]
    rng = random.Random(7)
    turns: list[Turn] = []
    with (
        httpx.Client(base_url=workers[0].url, timeout=600) as a,
        httpx.Client(base_url=workers[1].url, timeout=600) as b,
    ):
        _generate(b, _context(rng, 128, vocab))  # warm-up
        for length in args.contexts:
            for _ in range(args.repeats):
                for case in CASES:
                    ids = _context(rng, length, vocab)
                    turns.append(_turn(a, b, pool, ids, _context(rng, args.suffix, vocab), case))
        plain = {}
        for length in args.contexts:
            loaded = [t.prefetch.bytes_loaded for t in turns if t.prefetch and t.context_tokens == length]
            plain[length] = _plain_copy_gbps(pool, max(loaded))

        stall_ids = [_context(rng, min(args.contexts), vocab) for _ in range(4)]
        for ids in stall_ids:
            before = len(list(pool.iterdir()))
            _generate(a, ids)
            _wait_pool_quiet(pool, before)

        def prefetch_all() -> None:
            for ids in stall_ids:
                _prefetch(b, ids, "device")

        alone = _decode_rate(b, vocab, args.decode_tokens)
        beside = _decode_rate(b, vocab, args.decode_tokens, during=prefetch_all)

    _report(args, turns, plain, alone, beside)
    if args.json is not None:
        raw = [asdict(turn) | {"prefetch": turn.prefetch.model_dump() if turn.prefetch else None} for turn in turns]
        args.json.write_text(json.dumps({"turns": raw, "decode_alone": alone, "decode_beside": beside}, indent=1))
    return 0


def _report(
    args: argparse.Namespace,
    turns: list[Turn],
    plain: dict[int, tuple[float, float]],
    alone: float,
    beside: float,
) -> None:
    print(f"model {args.model_size}, {args.repeats} repeats, next turn = context + {args.suffix} tokens\n")
    print(
        "| context | recompute | pool at request | prefetched host | prefetched device "
        "| recompute/host | recompute/device |"
    )
    print("|---|---|---|---|---|---|---|")
    for length in args.contexts:
        ttft = {
            case: statistics.median(t.ttft_s for t in turns if t.context_tokens == length and t.case == case)
            for case in CASES
        }
        print(
            f"| {length} | {ttft['recompute'] * 1e3:.0f} ms | {ttft['pool'] * 1e3:.0f} ms "
            f"| {ttft['host'] * 1e3:.0f} ms "
            f"| {ttft['device'] * 1e3:.0f} ms | {ttft['recompute'] / ttft['host']:.1f}x "
            f"| {ttft['recompute'] / ttft['device']:.1f}x |"
        )
    print("\ncached tokens of the next turn by tier (last repeat):")
    for turn in turns[-len(CASES) * args.repeats :: args.repeats]:
        print(f"  {turn.context_tokens} {turn.case}: {turn.cached}")
    print("\n| context | prefetch to host GB/s | prefetch to device GB/s | file read GB/s | memcpy GB/s |")
    print("|---|---|---|---|---|")
    for length in args.contexts:
        rates = {}
        for target in ("host", "device"):
            runs = [t.prefetch for t in turns if t.prefetch and t.context_tokens == length and t.case == target]
            rates[target] = statistics.median(
                p.bytes_loaded / max((p.finished_at or p.created_at) - p.created_at, 1e-9) / 1e9 for p in runs
            )
        file_gbps, memcpy_gbps = plain[length]
        print(f"| {length} | {rates['host']:.2f} | {rates['device']:.2f} | {file_gbps:.2f} | {memcpy_gbps:.2f} |")
    print(f"\ndecode of a running request: {alone:.1f} tok/s alone, {beside:.1f} tok/s with prefetches beside it")


if __name__ == "__main__":
    raise SystemExit(main())

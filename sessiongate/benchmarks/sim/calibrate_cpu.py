"""Measure real SGLang CPU workers as the replay runs them and write the simulator's CPU profile (JSON).

`--colocated` workers (2, as the replay) are started side by side with `sglang_ext.launcher.start_worker`, each with
its share of the cores (`cores_per_worker`), HiCache's host tier and the shared `file` pool; worker 0 is timed
through its HTTP API while the others idle, each case with a fresh random context so nothing is shared:

- prefill: the wall time of `/generate` with `max_new_tokens=1` for prompts of several lengths on an empty cache
  (this includes the HTTP round trip, which the real replay's TTFT includes too), fitted as a + b*n + c*n^2;
- decode: `batch` concurrent generations of 72 and of 8 tokens; the difference in wall time over 64 is one step,
  for several batch sizes and two context lengths, fitted as base + per_seq*batch + per_kv_token*kv_tokens;
- moves, as a request pays them: a context is computed (written through to the pool), then the same prompt plus
  a page of new tokens is sent three ways: with the context still on the device (also what a device hit costs),
  after a flush and a prefetch of it into the host tier only (`POST /sessiongate/v1/prefetch`, target host), and
  after a flush with the context in the pool only. The TTFT over the device case is host -> device; the pool
  case over the host case is pool -> host. The medians per context size are fitted as latency + bytes / rate
  (the tiny model's KV is small, so the latency - scheduling, per-page lookups and copies - dominates). The KV
  bytes per token come from the prefetch;
- the front: a streamed chat turn through a real `sessiongate serve` (SQLite store, as the replay's gateway) whose
  context is on the device, against `/generate` with as many tokens and the same hit: what the gateway, the chat
  template and tokenizer and SSE add to every turn; and the CPU seconds everything but the engine's scheduler
  (the worker's HTTP/tokenizer and detokenizer processes, the gateway, the client) spends per turn and per
  streamed token, and per advisory prefetch (`/v1/sessions/{id}/advise`), on the same cores;
- sharing: a decode step and a 1,024-token prefill with every worker busy at once, over worker 0 alone
  (`benchmarks.colocated_workers`): what two workers on these cores cost each other.

The numbers describe this machine, this model and this load (other processes share the cores): the profile
records where and when it was measured, and docs/simulator.md cites the values of the run it reports.

    python -m sessiongate.benchmarks.sim.calibrate_cpu --model-size tiny --max-total-tokens 2048 --page-size 64 \
        --hicache-ratio 4 --out sessiongate/benchmarks/sim/profiles/cpu_tiny.json     # the replay's worker settings
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from sessiongate.benchmarks.colocated_workers import batch_seconds, decode_step_s, prefill_s
from sessiongate.benchmarks.prefetch_bench import VOCAB, _context, _generate, _prefetch, _wait_pool_quiet
from sessiongate.benchmarks.processes import GatewayServer, free_port, local_gateway_env
from sessiongate.sdk._sse import iter_events
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, WorkerProcess, start_worker
from sessiongate.sglang_ext.models import MODEL_NAMES
from sessiongate.sglang_ext.worker_config import CPU_CHUNKED_PREFILL_SIZE, CPU_MAX_RUNNING_REQUESTS
from sessiongate.sglang_ext.worker_process import wait_all_ready

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
                    few = batch_seconds(url, prompts, short)
                    _flush(client)
                    prompts = [_context(rng, context, vocab) for _ in range(batch)]
                    many = batch_seconds(url, prompts, long)
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
    by_length: dict[int, dict[str, list[float]]] = {}
    device_hits: dict[int, list[float]] = {}  # cached tokens -> TTFT of the prompt with `page_size` more
    per_token: list[float] = []
    skipped = 0
    for length in lengths:
        for _ in range(repeats):
            ids = _context(rng, length, vocab)
            suffix = _context(rng, page_size, vocab)
            _flush(client)
            before = len(list(pool.iterdir()))
            _generate(client, ids)
            _wait_pool_quiet(pool, before)
            on_device, device_hit = _generate(client, ids + suffix)
            _flush(client)
            host = _prefetch(client, ids, "host")
            in_host, host_hit = _generate(client, ids + suffix)
            _flush(client)
            in_pool, pool_hit = _generate(client, ids + suffix)
            # A sample counts only if each request found the context where it was meant to be.
            full = length // page_size * page_size
            found = (device_hit.get("device"), host_hit.get("host"), pool_hit.get("storage"))
            if found != (full, full, full) or host.bytes_loaded <= 0:
                skipped += 1
                continue
            samples = by_length.setdefault(host.bytes_loaded, {"host_to_device": [], "pool_to_host": []})
            samples["host_to_device"].append(in_host - on_device)
            samples["pool_to_host"].append(in_pool - in_host)
            device_hits.setdefault(full, []).append(on_device)
            per_token.append(host.bytes_loaded / full)
    if len(by_length) < 2:
        raise RuntimeError(f"too few clean move samples ({skipped} skipped): see the worker's log")
    # Each difference of two TTFTs carries both one's noise: fit the medians per size, not the samples.
    to_host = [(size, statistics.median(s["pool_to_host"])) for size, s in sorted(by_length.items())]
    to_device = [(size, statistics.median(s["host_to_device"])) for size, s in sorted(by_length.items())]
    return {
        "pool_to_host": fit_move(to_host),
        "host_to_device": fit_move(to_device),
        "kv_bytes_per_token": round(statistics.median(per_token)),
        "medians": {"pool_to_host": to_host, "host_to_device": to_device},
        # [cached tokens, new tokens, median TTFT]: what a request pays for a device hit (cpu_profile's hit overhead).
        "device_hit_s": [[n, page_size, statistics.median(t)] for n, t in sorted(device_hits.items())],
        "samples": {str(size): samples for size, samples in sorted(by_length.items())},
        "skipped": skipped,
    }


def _measure_front(
    worker: WorkerProcess, state: Path, rng: random.Random, vocab: int, repeats: int, page_size: int
) -> dict[str, Any]:
    """TTFT of a chat turn through the gateway against `/generate` of as many tokens, both with a device hit."""
    gateway = GatewayServer(
        state / "logs",
        workers=[worker.url],
        env={**local_gateway_env(state / "front.db"), "SESSIONGATE_ROUTING_POLICY": "round_robin"},
    )
    through_front: list[float] = []
    direct: list[float] = []
    try:
        gateway.wait_ready(60)
        with (
            httpx.Client(base_url=gateway.url, timeout=600) as front,
            httpx.Client(base_url=worker.url, timeout=600) as engine,
        ):
            model = front.get("/v1/models").json()["data"][0]["id"]
            for n in range(repeats + 1):  # the first pair warms the gateway's path up
                messages = [
                    {"role": "system", "content": " ".join(f"w{rng.randrange(vocab)}" for _ in range(300))},
                    {"role": "user", "content": "hello"},
                ]
                answer, _ = _chat(front, model, messages, f"calibrate-{n}")
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "go on"}]
                _, ttft = _chat(front, model, messages, f"calibrate-{n}")
                tokens = int(
                    front.get(f"/v1/sessions/calibrate-{n}/turns").json()["data"][-1]["usage"]["prompt_tokens"]
                )
                ids = _context(rng, tokens, vocab)
                _generate(engine, ids[: tokens - page_size])
                same_hit, _ = _generate(engine, ids)
                if n:
                    through_front.append(ttft)
                    direct.append(same_hit)
            cpu = _front_cpu(front, model, worker, gateway, rng, repeats)
    finally:
        gateway.stop()
    return {
        "overhead_s": max(statistics.median(through_front) - statistics.median(direct), 0.0),
        **cpu,
        "samples": {"through_front_s": through_front, "generate_s": direct},
    }


def _front_cpu(
    front: httpx.Client, model: str, worker: WorkerProcess, gateway: GatewayServer, rng: random.Random, repeats: int
) -> dict[str, float]:
    """CPU seconds that everything but the engine's scheduler spends on a turn, fitted per turn + per streamed token:
    the worker's HTTP/tokenizer and detokenizer processes, the gateway and this client, on the scheduler's cores.
    Turns of a ~700-token prompt (the replay's size), 8 and 40 tokens out, each a new session."""
    per_length: dict[int, float] = {}
    sessions: list[str] = []
    for tokens in (8, 40):
        turns = 4 * repeats
        before = _front_cpu_seconds(worker, gateway)
        for _ in range(turns):
            words = " ".join(f"w{rng.randrange(1000)}" for _ in range(600))
            body = {"model": model, "messages": [{"role": "user", "content": words}], "max_tokens": tokens}
            with front.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True, "ignore_eos": True}
            ) as response:
                response.raise_for_status()
                sessions.append(response.headers["x-session-id"])
                for _ in response.iter_lines():
                    pass
        per_length[tokens] = (_front_cpu_seconds(worker, gateway) - before) / turns
    per_token = max((per_length[40] - per_length[8]) / 32, 0.0)
    # An advisory per session, its context only in the pool (flushed from device and host), as the gateway's
    # advisor sends it: the context read from the store, rendered by the worker, the prefetch and its polls.
    with httpx.Client(base_url=worker.url, timeout=600) as engine:
        _flush(engine)
    pause_s = 0.25  # one at a time: the prefetch and its polls end before the next
    before = _front_cpu_seconds(worker, gateway)
    time.sleep(pause_s * len(sessions))  # what the same time costs idle (load polls, health checks), to subtract
    idle = _front_cpu_seconds(worker, gateway) - before
    before += idle
    for session in sessions:
        front.post(f"/v1/sessions/{session}/advise", json={"kind": "explicit"}).raise_for_status()
        time.sleep(pause_s)
    per_advisory = max(_front_cpu_seconds(worker, gateway) - before - idle, 0.0) / len(sessions)
    return {
        "cpu_s_per_turn": max(per_length[8] - 8 * per_token, 0.0),
        "cpu_s_per_output_token": per_token,
        "cpu_s_per_advisory": per_advisory,
    }


def _front_cpu_seconds(worker: WorkerProcess, gateway: GatewayServer) -> float:
    processes = [psutil.Process(), psutil.Process(gateway.pid)]
    top = psutil.Process(worker.pid)
    processes += [p for p in [top, *top.children(recursive=True)] if p.name() != "sglang::scheduler"]
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def _chat(client: httpx.Client, model: str, messages: list[dict[str, str]], session: str) -> tuple[str, float]:
    """One streamed chat turn, as the replay sends it: (its answer, seconds to the first content byte)."""
    body = {"model": model, "messages": messages, "max_tokens": 8, "stream": True, "ignore_eos": True}
    began = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": session}) as response:
        response.raise_for_status()
        for event in iter_events(response.iter_lines()):
            if event.done:
                continue
            for choice in event.json().get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first if first is not None else time.perf_counter() - began
                    parts.append(content)
    return "".join(parts), first if first is not None else time.perf_counter() - began


def _measure_sharing(urls: Sequence[str], rng: random.Random, vocab: int, repeats: int) -> dict[str, Any]:
    """Every worker busy at once over worker 0 alone, for a decode step (batch 4) and a 1,024-token prefill."""

    def median(run: Callable[..., float], busy: Sequence[str], size: int) -> float:
        return statistics.median(run(urls, busy, size, rng, vocab) for _ in range(repeats))

    decode = (median(decode_step_s, urls[:1], 4), median(decode_step_s, urls, 4))
    prefill = (median(prefill_s, urls[:1], 1024), median(prefill_s, urls, 1024))
    return {
        "decode_busy_over_alone": decode[1] / decode[0],
        "prefill_busy_over_alone": prefill[1] / prefill[0],
        "samples": {"decode_step_s": decode, "prefill_1024_s": prefill},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", "--model", dest="model_size", choices=MODEL_NAMES, default="tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--colocated", type=int, default=2, help="workers side by side, as the replay runs them")
    parser.add_argument("--max-total-tokens", type=int, default=None, help="default: the model's (WorkerConfig)")
    parser.add_argument("--chunked-prefill-size", type=int, default=CPU_CHUNKED_PREFILL_SIZE)
    parser.add_argument("--max-running-requests", type=int, default=CPU_MAX_RUNNING_REQUESTS)
    parser.add_argument("--page-size", type=int, default=WorkerConfig.page_size)
    parser.add_argument("--hicache-ratio", type=float, default=WorkerConfig.hicache_ratio)
    parser.add_argument("--prefill-lengths", type=int, nargs="+", default=[16, 128, 256, 512, 1024, 1536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--move-lengths", type=int, nargs="+", default=[256, 768, 1536])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.max_total_tokens is None:
        args.max_total_tokens = WorkerConfig(model_size=args.model_size).effective_max_total_tokens

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="sim-calibrate-"))
    pool = state / "pool"
    threads = cores_per_worker(args.colocated)
    configs = [
        WorkerConfig(
            state_dir=state,
            model_size=args.model_size,
            port=free_port(),
            pool_dir=pool,
            cpu_threads=threads,
            max_total_tokens=args.max_total_tokens,
            chunked_prefill_size=args.chunked_prefill_size,
            max_running_requests=args.max_running_requests,
            page_size=args.page_size,
            hicache_ratio=args.hicache_ratio,
            device="cpu",
            log_file=state / "logs" / f"worker-{i}.log",
        )
        for i in range(args.colocated)
    ]
    vocab = VOCAB[args.model_size]
    rng = random.Random(11)
    workers: list[WorkerProcess] = []
    try:
        for config in configs:
            workers.append(start_worker(config))
        wait_all_ready(workers, 600)  # fails as soon as any one worker fails
        worker = workers[0]
        with httpx.Client(base_url=worker.url, timeout=600) as client:
            for length in (64, 600, 1100):  # warm-up: a fresh worker's first requests are slow
                _generate(client, _context(rng, length, vocab))
            prefill = _measure_prefill(client, rng, vocab, args.prefill_lengths, args.repeats)
            decode = _measure_decode(worker.url, rng, vocab, args.batches, args.decode_contexts, args.repeats)
            moves = _measure_moves(client, pool, rng, vocab, args.move_lengths, args.repeats, args.page_size)
            front = _measure_front(worker, state, rng, vocab, args.repeats, args.page_size)
        urls = [w.url for w in workers]
        sharing = _measure_sharing(urls, rng, vocab, args.repeats) if len(urls) > 1 else None
    finally:
        for worker in workers:
            worker.stop()
    profile = {
        "kind": "cpu",
        "model_size": args.model_size,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "worker": {
            "max_total_tokens": args.max_total_tokens,
            "chunked_prefill_size": args.chunked_prefill_size,
            "max_running_requests": args.max_running_requests,
            "page_size": args.page_size,
            "hicache_ratio": args.hicache_ratio,
            "colocated": args.colocated,
            "cpu_threads": threads,
        },
        "prefill": {"points": prefill, "fit": fit_prefill(prefill)},
        "decode": {"points": decode, "fit": fit_decode(decode)},
        "moves": moves,
        "front": front,
        "sharing": sharing,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    print(json.dumps({k: profile[k] for k in ("prefill", "decode", "moves", "front", "sharing")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The pool link's rate for a model on this machine: its prefill measured on a real worker, then the arithmetic.

`pool_link.pool_link_rate_mbit` needs a model's KV bytes per token and its prefill rate here. This starts one CPU
worker per model (no pool, no host tier: a prefill and nothing else), sends a warm-up and then `--repeats` cold
prompts of `--prompt-tokens` random token ids (no two share a first token, so nothing is cached) with
`max_new_tokens=1`, takes the median time to the answer as the prefill's, and prints, per model, the rate at which
reading a context from the pool costs the share of its prefill that an 8B model's read over a 100 Gb/s link costs
an H100 (docs/benchmarks.md, "An emulated pool link").

    python -m sessiongate.benchmarks.pool_link_rate --models tiny medium smollm2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from sessiongate.benchmarks.pool_link import H100_POOL_READ_RATIO, pool_link_rate_mbit
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
from sessiongate.sglang_ext.models import MODEL_NAMES, kv_bytes_per_token, model_dir
from sessiongate.sglang_ext.ports import pick_port

__all__ = ["PrefillRate", "main", "measure_prefill"]


@dataclass(frozen=True)
class PrefillRate:
    model: str
    prompt_tokens: int
    prefill_s: list[float]
    kv_bytes_per_token: int

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens / statistics.median(self.prefill_s)

    def rate_mbit(self, ratio: float = H100_POOL_READ_RATIO) -> float:
        return pool_link_rate_mbit(self.kv_bytes_per_token, self.tokens_per_s, ratio)


def _prompt(rng: random.Random, first: int, length: int, vocab: int) -> list[int]:
    return [first] + [rng.randrange(3, vocab) for _ in range(length - 1)]


def measure_prefill(model: str, state_dir: Path, prompt_tokens: int, repeats: int, cpu_threads: int) -> PrefillRate:
    config = WorkerConfig(
        state_dir=state_dir,
        model_size=model,
        port=pick_port(),
        hierarchical_cache=False,
        storage_backend=None,
        max_total_tokens=max(4096, 2 * prompt_tokens) // 64 * 64,
        cpu_threads=cpu_threads,
        log_file=state_dir / f"prefill-{model}.log",
    )
    worker = start_worker(config)
    try:
        worker.wait_ready(900.0)
        vocab = int(json.loads((model_dir(state_dir, model) / "config.json").read_text())["vocab_size"])
        rng = random.Random(27)
        times: list[float] = []
        with httpx.Client(base_url=worker.url, timeout=600.0) as client:
            for attempt in range(repeats + 1):  # the first warms the worker up
                body = {
                    "input_ids": _prompt(rng, 3 + attempt, prompt_tokens, vocab),
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                }
                started = time.perf_counter()
                response = client.post("/generate", json=body)
                elapsed = time.perf_counter() - started
                response.raise_for_status()
                cached = response.json()["meta_info"].get("cached_tokens", 0)
                if cached:
                    raise RuntimeError(f"{model}: a cold prompt found {cached} tokens cached")
                if attempt:
                    times.append(elapsed)
    finally:
        worker.stop()
    return PrefillRate(model, prompt_tokens, times, kv_bytes_per_token(model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=["tiny"])
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ratio", type=float, default=H100_POOL_READ_RATIO)
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=cores_per_worker(2),
        help="the worker's threads; default: as each of the replay's two workers runs (half the cores)",
    )
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="pool-link-rate-"))
    results = [
        measure_prefill(model, state, args.prompt_tokens, args.repeats, args.cpu_threads) for model in args.models
    ]
    print(
        f"read/prefill ratio {args.ratio:.3f}; cold prefill of {args.prompt_tokens} tokens on {args.cpu_threads} "
        f"thread(s), median of {args.repeats}"
    )
    print("| model | KV bytes/token | prefill (s) | prefill tokens/s | link rate (Mbit/s) |")
    print("|---|---|---|---|---|")
    for result in results:
        runs = ", ".join(f"{s:.3f}" for s in result.prefill_s)
        print(
            f"| {result.model} | {result.kv_bytes_per_token:,} | {runs} | {result.tokens_per_s:,.0f} "
            f"| {result.rate_mbit(args.ratio):,.0f} |"
        )
    if args.json is not None:
        rows = [
            {**asdict(r), "tokens_per_s": r.tokens_per_s, "rate_mbit": r.rate_mbit(args.ratio), "ratio": args.ratio}
            for r in results
        ]
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

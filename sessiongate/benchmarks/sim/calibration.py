"""The simulator's hardware numbers, as data: one `Calibration` per machine the model stands for.

A batch step of a worker (continuous batching: one forward pass over the step's new tokens, i.e. a prefill chunk
plus one token per decoding sequence) takes

    step_s = forward_s(new_tokens)                          linear interpolation in a measured table
           + attention_s_per_pair * prefill_attention_pairs  each prefill token against the context before it
           + kv_read_s_per_token * decode_kv_tokens          each decoding sequence reads its whole KV
           + per_seq_s * decoding_sequences                  per-sequence overhead (sampling, bookkeeping)

and KV moves take bytes / rate on two per-worker channels: pool -> host (the NIC) and host -> device (PCIe).
`request_overhead_s` is added to every request's arrival (HTTP, the gateway, chat template and tokenising,
scheduling, streaming the first chunk back) so that simulated TTFTs compare with client-side measurements.

Two calibrations:

- `h100_llama8b()`: an H100 serving Llama-3.1-8B. `forward_s` is the sum of vidur's per-operator H100 times for
  Llama-2-7B at tensor parallelism 1 (`calibration/h100_meta-llama_Llama-2-7b-hf_mlp.csv`, MIT, microsoft/vidur;
  1 token 5.6 ms, 512 tokens 12.0 ms, 2,048 tokens 40 ms, as the traces README says), scaled by 1.08, the ratio
  of Llama-3-8B's per-layer weights to Llama-2-7B's (GQA attention 42M + MLP 176M against 67M + 135M). The
  attention term is set so that a 2,048-token prefill runs at 40k tokens/s (README: 35-45k tokens/s including
  attention). Decode reads 128 KiB of KV per token (README) at 2.7 TB/s (README). PCIe Gen5 host -> device
  55 GB/s (README, measured); pool -> host 21.75 GB/s, one 200 Gbps NIC's share of Mooncake's 87 GB/s on
  4x200 Gbps (README, FAST'25). Device KV: (80 GB x 0.88 SGLang static memory fraction - 16 GB of weights) /
  128 KiB = 414k tokens; host tier 2x the device (SGLang's default `hicache_ratio`); pool 2M tokens (256 GiB)
  per worker, an assumption. Chunked prefill 4,096 tokens (the table's end), 128 running requests at most,
  sessions cut at Llama-3.1's 128k-token context window (one ShareGPT conversation has a 161k-token prompt).
- `cpu_profile(path)`: our SGLang CPU workers, from a JSON profile written by `calibrate_cpu.py` on real workers
  started as the replay starts them; every number comes from that file (docs/simulator.md quotes the profile it
  used). KV moves are what a request pays to find its prefix in host or pool, and the request overhead includes
  the gateway in front.
"""

from __future__ import annotations

import bisect
import csv
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sessiongate.benchmarks.workloads import traces_dir
from sessiongate.gateway.routing import CostModel

__all__ = ["PROFILES_DIR", "Calibration", "cpu_profile", "h100_llama8b"]

# The committed CPU profiles, one per model size (`cpu_<size>.json`), written by calibrate_cpu.py.
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

H100_VIDUR_CSV = "calibration/h100_meta-llama_Llama-2-7b-hf_mlp.csv"
_VIDUR_LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
LLAMA2_7B_LAYERS = 32
LLAMA3_8B_OVER_LLAMA2_7B = 1.08
LLAMA3_8B_KV_BYTES_PER_TOKEN = 131_072
H100_PREFILL_TOKENS_PER_S = 40_000.0
H100_PREFILL_REFERENCE_TOKENS = 2048
H100_HBM_BYTES_PER_S = 2.7e12
H100_PCIE_HOST_TO_DEVICE_BYTES_PER_S = 55e9
RDMA_200GBPS_NIC_BYTES_PER_S = 87e9 / 4
LLAMA31_CONTEXT_TOKENS = 131_072
H100_DEVICE_KV_TOKENS = int((80e9 * 0.88 - 16.06e9) / LLAMA3_8B_KV_BYTES_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class Calibration:
    name: str
    label: str  # "simulated H100" | "simulated CPU": how reports label the figures
    kv_bytes_per_token: int
    forward_points: tuple[tuple[int, float], ...]  # (new tokens in the step, seconds), increasing
    attention_s_per_pair: float
    kv_read_s_per_token: float
    per_seq_s: float
    host_to_device_bytes_per_s: float
    pool_to_host_bytes_per_s: float
    device_kv_tokens: int
    host_kv_tokens: int
    pool_kv_tokens_per_worker: int
    chunk_tokens: int
    max_running: int
    page_tokens: int = 64
    request_overhead_s: float = 0.0
    pool_to_host_latency_s: float = 0.0  # fixed cost of one move on top of bytes / rate
    host_to_device_latency_s: float = 0.0
    max_context_tokens: int | None = None  # the model's context window: longer sessions are cut (workloads)
    # Workers that share one machine's `cores` with the front (our CPU workers; None: GPUs, sharing nothing). A step
    # takes the measured slowdown longer while every other worker computes too (in proportion when only some do),
    # and longer again while the busy workers and the front's processes want more than the cores: the front spends
    # `front_cpu_s_per_turn` + `front_cpu_s_per_token` per streamed token of CPU on them (engine/Machine).
    cores: int | None = None
    shared_prefill_slowdown: float = 1.0
    shared_decode_slowdown: float = 1.0
    front_cpu_s_per_turn: float = 0.0
    front_cpu_s_per_token: float = 0.0
    front_cpu_s_per_advisory: float = 0.0  # the gateway's advisor and the worker's HTTP process, per prefetch
    # CPU workers: a KV copy runs on the worker's own core (SGLang's cache-controller thread beside the scheduler's),
    # so its time also delays the worker's next step; on a GPU copies overlap the compute.
    moves_on_compute: bool = False
    # What a request that finds its prefix cached pays beyond its forward pass (prefix matching, the hit's
    # bookkeeping), measured as device-hit TTFT minus the fitted prefill of its new tokens.
    hit_overhead_s: float = 0.0
    source: str = ""

    def forward_s(self, tokens: int) -> float:
        points = self.forward_points
        if tokens <= points[0][0]:
            return points[0][1]
        i = bisect.bisect_left(points, (tokens, -1.0))
        if i >= len(points):
            i = len(points) - 1  # extrapolate along the last segment
        (n0, t0), (n1, t1) = points[i - 1], points[i]
        return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)

    def step_s(self, new_tokens: int, attention_pairs: float, decode_kv_tokens: int, decoding: int) -> float:
        return (
            self.forward_s(new_tokens)
            + self.attention_s_per_pair * attention_pairs
            + self.kv_read_s_per_token * decode_kv_tokens
            + self.per_seq_s * decoding
        )

    def prefill_after_s(self, new_tokens: int, cached_tokens: int) -> float:
        """A prefill of `new_tokens` after `cached_tokens` already cached, alone on an idle worker."""
        return self.step_s(new_tokens, new_tokens * (cached_tokens + new_tokens / 2), 0, 0)

    def prefill_s(self, prompt_tokens: int) -> float:
        """One request's prefill alone on an idle worker, chunked as the engine chunks it."""
        total, done = 0.0, 0
        while done < prompt_tokens:
            chunk = min(self.chunk_tokens, prompt_tokens - done)
            total += self.step_s(chunk, chunk * (done + chunk / 2), 0, 0)
            done += chunk
        return total

    def cost_model(self) -> CostModel:
        """The `kv_aware` policy's settings for this hardware (what an operator would configure)."""
        typical_batch = 32
        typical_batch = min(typical_batch, self.max_running)
        decode_step = self.step_s(typical_batch, 0, typical_batch * 1024, typical_batch)
        pool_to_device = 1.0 / (1.0 / self.pool_to_host_bytes_per_s + 1.0 / self.host_to_device_bytes_per_s)
        reference = min(H100_PREFILL_REFERENCE_TOKENS, self.device_kv_tokens // 2)
        return CostModel(
            default_prefill_tokens_per_s=reference / self.prefill_s(reference),
            default_decode_tokens_per_s=typical_batch / decode_step,
            kv_bytes_per_token=self.kv_bytes_per_token,
            host_to_device_bytes_per_s=self.host_to_device_bytes_per_s,
            pool_to_device_bytes_per_s=pool_to_device,
            host_to_device_latency_s=self.host_to_device_latency_s,
            pool_to_device_latency_s=self.pool_to_host_latency_s + self.host_to_device_latency_s,
        )

    def with_capacity(self, *, device_kv_tokens: int | None = None, host_kv_tokens: int | None = None) -> Calibration:
        return replace(
            self,
            device_kv_tokens=device_kv_tokens if device_kv_tokens is not None else self.device_kv_tokens,
            host_kv_tokens=host_kv_tokens if host_kv_tokens is not None else self.host_kv_tokens,
        )


def _vidur_forward_points(path: Path) -> tuple[tuple[int, float], ...]:
    by_tokens: dict[int, list[float]] = {}
    with path.open() as rows:
        for row in csv.DictReader(rows):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            ms = float(row["time_stats.emb.mean"]) + LLAMA2_7B_LAYERS * sum(
                float(row[f"time_stats.{op}.mean"]) for op in _VIDUR_LAYER_OPS
            )
            by_tokens.setdefault(int(row["num_tokens"]), []).append(ms)
    points: list[tuple[int, float]] = []
    for tokens in sorted(by_tokens):
        seconds = sum(by_tokens[tokens]) / len(by_tokens[tokens]) / 1000 * LLAMA3_8B_OVER_LLAMA2_7B
        # Small batches are noise around a floor (1 token 5.6 ms, 2 tokens 5.5 ms): keep the table monotone.
        points.append((tokens, max(seconds, points[-1][1] if points else 0.0)))
    return tuple(points)


def h100_llama8b(*, traces: Path | None = None) -> Calibration:
    forward = _vidur_forward_points((traces or traces_dir()) / H100_VIDUR_CSV)
    base = Calibration(
        name="h100-llama3.1-8b",
        label="simulated H100",
        kv_bytes_per_token=LLAMA3_8B_KV_BYTES_PER_TOKEN,
        forward_points=forward,
        attention_s_per_pair=0.0,
        kv_read_s_per_token=LLAMA3_8B_KV_BYTES_PER_TOKEN / H100_HBM_BYTES_PER_S,
        per_seq_s=0.0,
        host_to_device_bytes_per_s=H100_PCIE_HOST_TO_DEVICE_BYTES_PER_S,
        pool_to_host_bytes_per_s=RDMA_200GBPS_NIC_BYTES_PER_S,
        device_kv_tokens=H100_DEVICE_KV_TOKENS,
        host_kv_tokens=2 * H100_DEVICE_KV_TOKENS,
        pool_kv_tokens_per_worker=2_000_000,
        chunk_tokens=4096,
        max_running=128,
        page_tokens=64,
        max_context_tokens=LLAMA31_CONTEXT_TOKENS,
        source=f"vidur {H100_VIDUR_CSV} x{LLAMA3_8B_OVER_LLAMA2_7B}; traces README constants",
    )
    n = H100_PREFILL_REFERENCE_TOKENS
    target_s = n / H100_PREFILL_TOKENS_PER_S
    attention = max(target_s - base.forward_s(n), 0.0) / (n * n / 2)
    return replace(base, attention_s_per_pair=attention)


def cpu_profile(path: Path) -> Calibration:
    """A calibration from `calibrate_cpu.py`'s JSON: our CPU workers as measured on one machine."""
    profile: dict[str, Any] = json.loads(path.read_text())
    prefill, decode, moves, worker = (
        profile["prefill"]["fit"],
        profile["decode"]["fit"],
        profile["moves"],
        profile["worker"],
    )
    per_token = prefill["per_token_s"]
    base = decode["base_s"]
    sharing: dict[str, Any] = profile.get("sharing") or {}  # None: one worker measured alone
    front: dict[str, Any] = profile.get("front") or {}  # none in profiles measured without a front
    # The step's forward cost is linear in its tokens; a decoding sequence's cost beyond one token's forward
    # (sampling, bookkeeping) is `per_seq_s`; what a lone prefill costs beyond one step is request overhead, and
    # so is what the front adds to a turn (profiles measured without one have no "front").
    forward = ((1, base + per_token), (100_000, base + per_token * 100_000))
    device = int(worker["max_total_tokens"])
    cal = Calibration(
        name=f"cpu-{profile['model_size']}",
        label="simulated CPU",
        kv_bytes_per_token=int(moves["kv_bytes_per_token"]),
        forward_points=forward,
        attention_s_per_pair=2 * prefill["per_token_sq_s"],
        kv_read_s_per_token=decode["per_kv_token_s"],
        per_seq_s=max(decode["per_seq_s"] - per_token, 0.0),
        host_to_device_bytes_per_s=float(moves["host_to_device"]["bytes_per_s"]),
        pool_to_host_bytes_per_s=float(moves["pool_to_host"]["bytes_per_s"]),
        device_kv_tokens=device,
        host_kv_tokens=int(device * float(worker["hicache_ratio"])),
        pool_kv_tokens_per_worker=10_000_000,
        chunk_tokens=int(worker["chunked_prefill_size"]),
        max_running=int(worker["max_running_requests"]),
        page_tokens=int(worker["page_size"]),
        request_overhead_s=max(prefill["a_s"] - base, 0.0) + float(front.get("overhead_s", 0.0)),
        pool_to_host_latency_s=float(moves["pool_to_host"]["latency_s"]),
        host_to_device_latency_s=float(moves["host_to_device"]["latency_s"]),
        cores=int(profile["machine"]["cpus"]),
        # Below 1 is noise: a worker does not get faster because another one computes beside it.
        shared_prefill_slowdown=max(float(sharing.get("prefill_busy_over_alone", 1.0)), 1.0),
        shared_decode_slowdown=max(float(sharing.get("decode_busy_over_alone", 1.0)), 1.0),
        front_cpu_s_per_turn=float(front.get("cpu_s_per_turn", 0.0)),
        front_cpu_s_per_token=float(front.get("cpu_s_per_output_token", 0.0)),
        front_cpu_s_per_advisory=float(front.get("cpu_s_per_advisory", 0.0)),
        moves_on_compute=True,
        source=f"{path.name}, measured {profile['measured_at']} on {profile['machine']['platform']}",
    )
    # A device hit's TTFT beyond the fitted request overhead and prefill of its new tokens (profiles without
    # device-hit timings have none).
    over = [
        ttft - cal.request_overhead_s - cal.prefill_after_s(new, cached)
        for cached, new, ttft in moves.get("device_hit_s", [])
    ]
    return replace(cal, hit_overhead_s=max(statistics.median(over), 0.0)) if over else cal

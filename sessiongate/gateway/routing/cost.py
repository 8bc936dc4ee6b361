"""The cost model behind `kv_aware` routing: seconds until a request's first token on a given worker.

Three terms, all in seconds, so they add up:

    wait(w)     = queued(w) * typical_prefill_tokens / prefill_tps(w) + running(w) / decode_tps(w)
    memory(w)   = active_kv(w) * min(1, (active_kv(w) + queued_tokens(w) + prompt) / device_kv(w)) / prefill_tps(w)
    resident(w) = [host_tokens > 0] * host_to_device_latency_s
                + host_tokens * kv_bytes_per_token / host_to_device_bytes_per_s
                + [pool_tokens > 0] * pool_to_device_latency_s
                + pool_tokens * kv_bytes_per_token / pool_to_device_bytes_per_s
                + recompute_tokens / prefill_tps(w)

Each request queued ahead (the report's queue, plus what the gateway sent since the report) delays our first token
by the prefill work of a typical request, or by the queued prompt tokens when the view counts them and they are
more (`WorkerView.active_prefill_tokens`, from the worker's `queued_prefill_tokens`); the running batch delays it
by about one decode step, `running / decode_tps` (decode_tps is the batch's aggregate rate), because continuous
batching admits a newcomer at the next step. A worker without a load report has only the gateway's in-flight
count, all of it counted as queued.
A worker whose device KV pool is full admits a queued request only when a running one ends, which depends on output
lengths nobody knows yet: `memory` counts the running sequences' KV (the report's tokens in use) as work ahead in
proportion to how full the pool would be. On the simulated H100 under device pressure it cut kv_aware's mean TTFT
3.8x and p99 17x for long-context agents (docs/simulator.md), and moved nothing measurable with plentiful memory.
The prompt is split by where its leading tokens are believed to be: on `w`'s device (free), in `w`'s host tier
(a PCIe copy), in the shared pool (a pool read), or nowhere (recomputed at `w`'s prefill rate). The prefill and
decode speeds come from the workers' load reports (measured while working) when they have one, else from the
configured default; transfer rates, the fixed cost of one move (scheduling, per-page lookups and copies, paid
however few bytes move) and the KV size per token are settings (they depend on the model and the hardware, not on
load; `sessiongate/benchmarks/sim/calibrate_cpu.py` measures them for our CPU workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from .views import KVResidency, WorkerView

__all__ = ["CostModel", "Placement", "split_prompt"]


@dataclass(frozen=True, slots=True)
class Placement:
    """How many of a prompt's tokens are found in each tier of one worker (they sum to the prompt)."""

    device: int
    host: int
    pool: int
    recompute: int


def split_prompt(prompt_tokens: int, kv: KVResidency, worker_id: str) -> Placement:
    """Split a prompt by the fastest tier holding each of its leading tokens, as seen from `worker_id`."""
    on_device = min(kv.device.get(worker_id, 0), prompt_tokens)
    in_host = min(max(kv.host.get(worker_id, 0), on_device), prompt_tokens)
    in_pool = min(max(kv.pool, in_host), prompt_tokens)
    return Placement(
        device=on_device,
        host=in_host - on_device,
        pool=in_pool - in_host,
        recompute=prompt_tokens - in_pool,
    )


@dataclass(frozen=True, slots=True)
class CostModel:
    typical_prefill_tokens: int = 512
    default_prefill_tokens_per_s: float = 4000.0
    default_decode_tokens_per_s: float = 1000.0
    kv_bytes_per_token: int = 131_072
    host_to_device_bytes_per_s: float = 16e9
    pool_to_device_bytes_per_s: float = 2e9
    host_to_device_latency_s: float = 0.0
    pool_to_device_latency_s: float = 0.0

    def prefill_rate(self, worker: WorkerView) -> float:
        reported = worker.prefill_tokens_per_s
        return reported if reported and reported > 0 else self.default_prefill_tokens_per_s

    def decode_rate(self, worker: WorkerView) -> float:
        reported = worker.decode_tokens_per_s
        return reported if reported and reported > 0 else self.default_decode_tokens_per_s

    def wait_s(self, worker: WorkerView) -> float:
        if worker.running is None or worker.queued is None:
            queued, running = worker.in_flight, 0
        else:
            queued, running = worker.queued + worker.in_flight_since_report, worker.running
        ahead = queued * self.typical_prefill_tokens
        if worker.active_prefill_tokens is not None:
            # The prompt tokens queued are known (the worker's report; the simulator counts them exactly): a
            # long-context queue is not `typical_prefill_tokens` a request. The count stays a floor: short prompts
            # queued behind a full batch wait for running requests to end, which their few tokens do not show.
            tokens = worker.active_prefill_tokens + worker.in_flight_since_report * self.typical_prefill_tokens
            ahead = max(ahead, tokens)
        return ahead / self.prefill_rate(worker) + running / self.decode_rate(worker)

    def resident_s(self, placement: Placement, worker: WorkerView) -> float:
        per_token = self.kv_bytes_per_token
        seconds = placement.recompute / self.prefill_rate(worker)
        if placement.host:
            seconds += self.host_to_device_latency_s + placement.host * per_token / self.host_to_device_bytes_per_s
        if placement.pool:
            seconds += self.pool_to_device_latency_s + placement.pool * per_token / self.pool_to_device_bytes_per_s
        return seconds

    def memory_wait_s(self, prompt_tokens: int, worker: WorkerView) -> float:
        """Device memory ahead of this request, in seconds of prefill work.

        SGLang admits a request only when its KV fits beside the running sequences', so on a worker whose pool they
        nearly fill a newcomer waits for running requests to end, which neither the queue nor the batch count shows
        (the "not modelled" case above). The running sequences' KV counts as work ahead in proportion to how full
        the pool would be with the queued prompts and this one: little while memory is plentiful, all of it when
        the pool is full. 0 where the view does not say (no load report, or no pool size)."""
        active = worker.active_kv_tokens
        if active is None or not worker.device_kv_tokens:
            return 0.0
        filled = active + (worker.active_prefill_tokens or 0) + prompt_tokens
        return active * min(filled / worker.device_kv_tokens, 1.0) / self.prefill_rate(worker)

    def score_s(self, prompt_tokens: int, kv: KVResidency, worker: WorkerView) -> float:
        """Expected seconds to this request's first token on `worker` (lower is better)."""
        return (
            self.wait_s(worker)
            + self.memory_wait_s(prompt_tokens, worker)
            + self.resident_s(split_prompt(prompt_tokens, kv, worker.id), worker)
        )

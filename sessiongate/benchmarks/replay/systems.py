"""The systems a replay compares, each started by the harness on the same SGLang workers and model.

| system              | workers' KV tiers                 | in front                               | hints |
|---------------------|-----------------------------------|----------------------------------------|-------|
| recompute           | device radix cache only           | sessiongate, round_robin               | no    |
| sticky              | device + HiCache host offload     | sessiongate, sticky                    | no    |
| sglang-router       | device + host + shared file pool  | SGLang's router (sglang-router), cache_aware | no |
| smg                 | device + host + shared file pool  | SGLang's model gateway (smg 1.13), cache_aware | no |
| kv_aware            | device + host + shared file pool  | sessiongate, kv_aware                  | no    |
| kv_aware+advisories | device + host + shared file pool  | sessiongate, kv_aware                  | yes   |
| kv_aware+oracle     | device + host + shared file pool  | sessiongate, kv_aware                  | the oracle's |
| dynamo_cost         | device + host + shared file pool  | sessiongate, Dynamo's KV-router cost   | no    |
| kv_aware+toolkv     | device + host + shared file pool  | sessiongate, kv_aware                  | tool results |

Hints: kv_aware+advisories posts the planned hints (`/advise`, `/typing`); kv_aware+oracle posts a perfect one
for every turn after the first, at the ideal lead before it (`driver.ReplayOptions.oracle_lead_s`: the ceiling of
what any hint can gain); kv_aware+toolkv posts none of them, only
each tool's result (`/tool_results`) when the tool returns, so its advisories are the tool-call KV lifecycle's
alone (sessiongate/gateway/advisor/toolkv.py: keep or offload at each tool call, from the durations those results
taught it). The systems without hints run the gateway with that lifecycle off (`SESSIONGATE_ADVISORY_TOOL_KV`):
the model's tool calls would otherwise start it in every sessiongate front. smg and sglang-router route by the
prompt's prefix (cache_aware's radix tree): they need no session header, and the workers' `sglext` chunk (tokens
found per tier) comes through smg unchanged.

`running_stack` starts fresh workers (a new pool directory each time; with `ClusterConfig.pool_link`, a new
Mooncake Store behind an emulated link instead) so every system starts with cold caches,
then the gateway (`sessiongate serve`) or the router as its own process, warms them up (`warm_up`), and stops them
all on exit. Workers that share the machine share its cores (`cores_per_worker`). The gateway's kv_aware runs
with `ClusterConfig.cost`, the cost model an operator would configure for these workers (the simulator's, from
the same CPU profile: `Calibration.cost_model()`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sessiongate.benchmarks.pool_link import FarPool, LinkSpec, PoolLink, far_pool
from sessiongate.benchmarks.processes import (
    GatewayServer,
    ManagedProcess,
    SglangRouterProcess,
    SmgProcess,
    free_port,
    local_gateway_env,
)
from sessiongate.gateway.routing import CostModel
from sessiongate.gateway.settings import ENV_PREFIX
from sessiongate.sglang_ext import models
from sessiongate.sglang_ext.hardware import cores_per_worker
from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
from sessiongate.sglang_ext.worker_process import WorkerProcess, wait_all_ready

__all__ = [
    "SYSTEMS",
    "ClusterConfig",
    "Stack",
    "SystemSpec",
    "cost_model_env",
    "gateway_env",
    "kv_bytes_per_token",
    "prefetch_bytes",
    "running_stack",
    "warm_up",
]

ADMIN_KEY = "replay-bench-admin"


@dataclass(frozen=True, slots=True)
class SystemSpec:
    name: str
    front: str  # "sessiongate" | "sglang-router" | "smg"
    policy: str  # the gateway's routing policy, or the router's
    hierarchical_cache: bool
    shared_pool: bool
    hints: bool
    # Post each tool's result to the gateway when the tool returns (the tool-call KV lifecycle's signal).
    tool_results: bool = False
    # The oracle's hints (every turn, at the ideal lead) in place of the planned ones.
    oracle: bool = False


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s  # name, front, policy, hierarchical_cache, shared_pool, hints
    for s in (
        SystemSpec("recompute", "sessiongate", "round_robin", False, False, False),
        SystemSpec("sticky", "sessiongate", "sticky", True, False, False),
        SystemSpec("sglang-router", "sglang-router", "cache_aware", True, True, False),
        SystemSpec("smg", "smg", "cache_aware", True, True, False),
        SystemSpec("kv_aware", "sessiongate", "kv_aware", True, True, False),
        SystemSpec("kv_aware+advisories", "sessiongate", "kv_aware", True, True, True),
        SystemSpec("kv_aware+oracle", "sessiongate", "kv_aware", True, True, False, oracle=True),
        SystemSpec("dynamo_cost", "sessiongate", "dynamo_cost", True, True, False),
        SystemSpec("kv_aware+toolkv", "sessiongate", "kv_aware", True, True, False, tool_results=True),
    )
}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    state_dir: Path  # the made model lives here (shared by every run); logs and pools go to the run's folder
    model_size: str = "tiny"
    workers: int = 2
    # Small on purpose: sessions must be evicted from the device between turns, as in production.
    max_total_tokens: int = 2048
    # The workers' default page. With 16-token pages a pool hit costs about what recomputing costs on these CPUs
    # (58 us a token, per-page overhead); with 64, 22 us (benchmarks/sim/calibrate_cpu.py --page-size 16 / 64).
    page_size: int = 64
    hicache_ratio: float = 4.0
    max_running_requests: int = 8
    worker_start_timeout_s: float = 600.0
    # kv_aware's cost model; None: the gateway's defaults (GPU-sized rates) with the model's KV bytes per token.
    cost: CostModel | None = None
    # The shared pool behind an emulated network link (`benchmarks.pool_link`: a Mooncake Store in a network
    # namespace, the workers lending it nothing); None: the pool is a directory on this machine.
    pool_link: LinkSpec | None = None


def kv_bytes_per_token(model_size: str) -> int:
    """K and V of every layer in float32 (the CPU workers' dtype)."""
    return models.kv_bytes_per_token(model_size)


@dataclass
class Stack:
    spec: SystemSpec
    url: str  # where the driver sends requests: the gateway or the router
    workers: list[WorkerProcess]
    front: ManagedProcess

    @property
    def worker_urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def advisory_stats(self) -> dict[str, Any] | None:
        if self.spec.front != "sessiongate":
            return None
        response = httpx.get(
            f"{self.url}/v1/admin/advisories/stats", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
        )
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        stats["prefetch_bytes"] = prefetch_bytes(httpx.get(f"{self.url}/metrics", timeout=10).text)
        return stats


def prefetch_bytes(exposition: str) -> int:
    """The `sessiongate_prefetch_bytes` counter of the gateway's Prometheus exposition: KV bytes its finished
    prefetches loaded, as the workers reported them (0 when absent)."""
    for line in exposition.splitlines():
        name, _, value = line.partition(" ")
        if name == "sessiongate_prefetch_bytes_total":
            return int(float(value))
    return 0


def start_workers(
    spec: SystemSpec, cluster: ClusterConfig, run_dir: Path, far: FarPool | None = None
) -> list[WorkerProcess]:
    pool_dir = run_dir / f"pool-{spec.name.replace('+', '-')}-{time.monotonic_ns()}"
    started: list[WorkerProcess] = []
    try:
        for _ in range(cluster.workers):
            port = free_port()
            config = WorkerConfig(
                state_dir=cluster.state_dir,
                model_size=cluster.model_size,
                port=port,
                device="cpu",
                cpu_threads=cores_per_worker(cluster.workers),
                max_total_tokens=cluster.max_total_tokens,
                page_size=cluster.page_size,
                max_running_requests=cluster.max_running_requests,
                hierarchical_cache=spec.hierarchical_cache,
                hicache_ratio=cluster.hicache_ratio,
                storage_backend="file" if spec.shared_pool else None,
                pool_dir=pool_dir,
                log_file=run_dir / "logs" / f"{spec.name}-worker-{port}.log",
            )
            if far is not None and spec.shared_pool:
                config = far.pool_of(config)
            started.append(start_worker(config))
        wait_all_ready(started, cluster.worker_start_timeout_s)  # fails as soon as any one worker fails
    except BaseException:
        for worker in started:
            worker.stop()
        raise
    return started


@contextlib.contextmanager
def running_stack(spec: SystemSpec, cluster: ClusterConfig, run_dir: Path) -> Iterator[Stack]:
    """Fresh workers (cold caches, an empty pool) and the system's front, stopped on exit."""
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stop:
        far = None
        if cluster.pool_link is not None and spec.shared_pool:
            link_spec = cluster.pool_link
            link = stop.enter_context(PoolLink(f"rp{os.getpid() % 10**7}", link_spec.rate_mbit, link_spec.delay_ms))
            ports = (free_port(), free_port(), free_port())
            far = stop.enter_context(far_pool(link, log_dir, pool_bytes=link_spec.pool_bytes, ports=ports))
        workers = start_workers(spec, cluster, run_dir, far)
        for worker in workers:
            stop.callback(worker.stop)
        front = start_front(spec, cluster, [w.url for w in workers], run_dir)
        stop.callback(front.stop)
        warm_up(_url(front), [w.url for w in workers], models.MODELS[cluster.model_size].shape.vocab_size)
        yield Stack(spec, _url(front), workers, front)


# Prompt lengths that reach every code path of a turn: one page, a typical prompt, and one past the chunked
# prefill size (1,024), so its second chunk attends to a cached first one.
_WARM_UP_PROMPTS = (16, 600, 1100)


def warm_up(front_url: str, worker_urls: list[str], vocab_size: int) -> None:
    """Take each worker's and the front's first-request costs out of the measurement, then empty the caches.

    A fresh CPU worker's first requests take 0.4-0.8 s where later ones take 50 ms (torch and oneDNN set up their
    kernels); unwarmed, they were the slowest turn of every system and set its p99 at light load. Random token
    ids are sent straight to each worker, alone and four at once (streamed), and one chat turn through the front;
    then `/flush_cache` drops what they left on the device and in host memory. Their pages written to the pool
    stay there, under keys no session's text can produce.
    """
    rng = random.Random(0)

    def tokens(length: int) -> list[int]:
        return [rng.randrange(16, vocab_size) for _ in range(length)]

    def generate(client: httpx.Client, length: int, *, stream: bool = False) -> None:
        body = {
            "input_ids": tokens(length),
            "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
            "stream": stream,
        }
        client.post("/generate", json=body).raise_for_status()

    for url in worker_urls:
        with httpx.Client(base_url=url, timeout=600) as client:
            for length in _WARM_UP_PROMPTS:
                generate(client, length)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: generate(client, 200, stream=True), range(4)))
    with httpx.Client(base_url=front_url, timeout=600) as client:
        models = client.get("/v1/models").json().get("data") or [{"id": "default"}]
        turn = {"model": models[0]["id"], "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4}
        client.post("/v1/chat/completions", json={**turn, "stream": True}).raise_for_status()
    for url in worker_urls:
        httpx.post(f"{url}/flush_cache", params={"timeout": 60}, timeout=120).raise_for_status()


def _url(front: ManagedProcess) -> str:
    url: str = getattr(front, "url")  # noqa: B009 - GatewayServer and the routers all have one
    return url


def start_front(spec: SystemSpec, cluster: ClusterConfig, worker_urls: list[str], run_dir: Path) -> ManagedProcess:
    log_dir = run_dir / "logs"
    if spec.front in ("sglang-router", "smg"):
        kind = SglangRouterProcess if spec.front == "sglang-router" else SmgProcess
        router = kind(log_dir, workers=worker_urls, policy=spec.policy)
        try:
            router.wait_ready(120)
        except BaseException:
            router.stop()
            raise
        return router
    database = run_dir / f"gateway-{spec.name.replace('+', '-')}-{time.monotonic_ns()}.db"
    env = gateway_env(spec, cluster, database)
    gateway = GatewayServer(log_dir, workers=worker_urls, env=env)
    try:
        gateway.wait_ready(60)
        _wait_all_routable(gateway.url, len(worker_urls))
    except BaseException:
        gateway.stop()
        raise
    return gateway


def gateway_env(spec: SystemSpec, cluster: ClusterConfig, database: Path) -> dict[str, str]:
    """The settings of the gateway in front of `spec`'s workers."""
    return {
        **local_gateway_env(database),
        "SESSIONGATE_ROUTING_POLICY": spec.policy,
        "SESSIONGATE_ADMIN_KEY": ADMIN_KEY,
        # The cost model's KV size: the model's, not the 8B default.
        "SESSIONGATE_KV_BYTES_PER_TOKEN": str(kv_bytes_per_token(cluster.model_size)),
        **(cost_model_env(cluster.cost) if cluster.cost is not None else {}),
        "SESSIONGATE_LOG_JSON": "false",
        # A system without hints is a baseline: no tool-call KV lifecycle either (the model's tool calls would
        # otherwise start it in every sessiongate front).
        "SESSIONGATE_ADVISORY_TOOL_KV": str(spec.hints or spec.tool_results).lower(),
    }


def cost_model_env(cost: CostModel) -> dict[str, str]:
    """The gateway's settings for `cost` (each `CostModel` field is the setting of the same name)."""
    return {f"{ENV_PREFIX}{f.name.upper()}": str(getattr(cost, f.name)) for f in dataclasses.fields(cost)}


def _wait_all_routable(url: str, count: int, timeout_s: float = 60.0) -> None:
    """Until the gateway's health checks have admitted every worker (and read its load report)."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    while time.monotonic() < deadline:
        workers = httpx.get(f"{url}/v1/admin/workers", headers=headers, timeout=10).json()["data"]
        if sum(1 for w in workers if w["routable"] and w["load"] is not None) == count:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{url}: not every worker routable after {timeout_s} s")

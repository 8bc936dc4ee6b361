"""What the gateway adds to a non-streamed turn, measured side by side against calling the worker directly.

Two conversations of the same shape run interleaved, one straight to the worker and one through the gateway
(a real `sessiongate serve` process with its SQLite store), so both see the same engine, cache state and machine
noise; the order alternates every turn. Each turn appends a user message and the previous answer, so the
gateway does its full session work (delta of the history, two store writes, routing).

    python -m sessiongate.benchmarks.gateway_overhead --start-worker            # a real SGLang CPU worker, tiny model
    python -m sessiongate.benchmarks.gateway_overhead --worker-url http://127.0.0.1:30001
    python -m sessiongate.benchmarks.gateway_overhead --fake-worker  # an instant fake: the gateway's own cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from .processes import FakeWorkerProcess, GatewayServer, local_gateway_env

__all__ = ["main", "percentile"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(worker_url: str, gateway_url: str, turns: int, sessions: int, max_tokens: int) -> dict[str, list[float]]:
    model = httpx.get(f"{worker_url}/v1/models", timeout=10).json()["data"][0]["id"]
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    with httpx.Client(timeout=120) as client:
        for s in range(sessions):
            history = {path: [{"role": "system", "content": f"Session {s} on the {path} path."}] for path in times}
            for t in range(turns):
                order = ("direct", "gateway") if (s + t) % 2 == 0 else ("gateway", "direct")
                for path in order:
                    history[path].append({"role": "user", "content": f"Question {t} of session {s}: go on."})
                    url = worker_url if path == "direct" else gateway_url
                    headers = {"x-session-id": f"overhead-{os.getpid()}-{s}"} if path == "gateway" else {}
                    body = {"model": model, "messages": history[path], "max_tokens": max_tokens, "temperature": 0}
                    started = time.perf_counter()
                    response = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                    elapsed = time.perf_counter() - started
                    response.raise_for_status()
                    history[path].append(
                        {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}
                    )
                    if t > 0:  # the first turn of each session warms connections and caches
                        times[path].append(elapsed * 1000)
    return times


def report(times: dict[str, list[float]]) -> str:
    direct, gateway = times["direct"], times["gateway"]
    lines = [f"{'path':<10}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}"]
    for name, values in times.items():
        lines.append(
            f"{name:<10}{len(values):>6}{statistics.median(values):>10.2f}"
            f"{percentile(values, 0.99):>10.2f}{statistics.fmean(values):>10.2f}"
        )
    added = [g - d for g, d in zip(gateway, direct, strict=True)]
    lines.append(
        f"added by the gateway, per turn (paired): p50 {statistics.median(added):.2f} ms, "
        f"p99 {percentile(added, 0.99):.2f} ms, mean {statistics.fmean(added):.2f} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--worker-url")
    source.add_argument("--start-worker", action="store_true", help="start a real SGLang worker (tiny model)")
    source.add_argument("--fake-worker", action="store_true", help="start the instant fake worker")
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--turns", type=int, default=21)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--gateway-port", type=int, default=8090)
    parser.add_argument("--worker-port", type=int, default=30090)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="sessiongate-bench-") as tmp, ExitStack() as stack:
        work_dir = Path(tmp)
        worker_url = args.worker_url
        if args.fake_worker:
            fake = FakeWorkerProcess(work_dir, port=args.worker_port)
            stack.callback(fake.stop)
            fake.wait_ready()
            worker_url = fake.url
        elif args.start_worker:
            from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker

            worker_handle = start_worker(WorkerConfig(port=args.worker_port, state_dir=work_dir))
            stack.callback(worker_handle.stop)
            worker_handle.wait_ready(timeout=300)
            worker_url = worker_handle.url
        gateway = GatewayServer(
            work_dir, workers=[worker_url], env=local_gateway_env(work_dir / "bench.db"), port=args.gateway_port
        )
        stack.callback(gateway.stop)
        gateway.wait_http(f"{gateway.url}/readyz", timeout_s=60)  # a worker is routable
        cpu_before = gateway.cpu_seconds()
        times = run(worker_url, gateway.url, args.turns, args.sessions, args.max_tokens)
        gateway_cpu_ms = (gateway.cpu_seconds() - cpu_before) * 1000 / (args.sessions * args.turns)
        print(
            f"worker {worker_url} ({'fake' if args.fake_worker else 'SGLang'}), "
            f"{args.sessions} sessions x {args.turns} turns, max_tokens {args.max_tokens}, concurrency 1"
        )
        print(report(times))
        print(f"gateway CPU per turn (user + system, every turn of the run): {gateway_cpu_ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

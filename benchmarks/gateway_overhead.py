"""What the gateway adds to a non-streamed turn, measured side by side against calling the worker directly.

Two conversations of the same shape run interleaved, one straight to the worker and one through the gateway
(a real `sessiongate serve` process with its SQLite store), so both see the same engine, cache state and machine
noise; the order alternates every turn. Each turn appends a user message and the previous answer, so the
gateway does its full session work (delta of the history, two store writes, routing).

    python -m benchmarks.gateway_overhead --start-worker            # a real SGLang CPU worker, tiny model
    python -m benchmarks.gateway_overhead --worker-url http://127.0.0.1:30001
    python -m benchmarks.gateway_overhead --fake-worker             # an instant fake: the gateway's own cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

__all__ = ["main"]


def _wait(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready")


def _percentile(values: list[float], q: float) -> float:
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
            f"{_percentile(values, 0.99):>10.2f}{statistics.fmean(values):>10.2f}"
        )
    added = [g - d for g, d in zip(gateway, direct, strict=True)]
    lines.append(
        f"added by the gateway, per turn (paired): p50 {statistics.median(added):.2f} ms, "
        f"p99 {_percentile(added, 0.99):.2f} ms, mean {statistics.fmean(added):.2f} ms"
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

    children: list[subprocess.Popen[bytes]] = []
    worker_handle = None
    with tempfile.TemporaryDirectory(prefix="sessiongate-bench-") as tmp:
        try:
            worker_url = args.worker_url
            if args.fake_worker:
                worker_url = f"http://127.0.0.1:{args.worker_port}"
                children.append(
                    subprocess.Popen([sys.executable, "-m", "benchmarks.fake_worker", "--port", str(args.worker_port)])
                )
                _wait(f"{worker_url}/health")
            elif args.start_worker:
                from sglang_ext.launcher import WorkerConfig, start_worker

                worker_handle = start_worker(WorkerConfig(port=args.worker_port, state_dir=Path(tmp)))
                worker_handle.wait_ready(timeout=300)
                worker_url = worker_handle.url
            gateway_url = f"http://127.0.0.1:{args.gateway_port}"
            env = {
                **os.environ,
                "SESSIONGATE_ALLOW_UNAUTHENTICATED": "1",  # a local benchmark: no keys
                "SESSIONGATE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
                "SESSIONGATE_LOG_LEVEL": "warning",
            }
            children.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "sessiongate.cli",
                        "serve",
                        "--port",
                        str(args.gateway_port),
                        "--worker",
                        worker_url,
                    ],
                    env=env,
                )
            )
            _wait(f"{gateway_url}/readyz")
            times = run(worker_url, gateway_url, args.turns, args.sessions, args.max_tokens)
            print(
                f"worker {worker_url} ({'fake' if args.fake_worker else 'SGLang'}), "
                f"{args.sessions} sessions x {args.turns} turns, max_tokens {args.max_tokens}, concurrency 1"
            )
            print(report(times))
        finally:
            for child in children:
                child.terminate()
                child.wait(30)
            if worker_handle is not None:
                worker_handle.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`sessiongate up`: the embedded default in one command.

Starts N SGLang workers with the sessiongate extension (SmolLM2-135M-Instruct unless `--model` names another
model or `--model-path` gives one; CPU engine flags where there is no GPU; on a GPU machine one GPU per worker
where there are enough, else workers share GPUs with a split `--mem-fraction-static`, each started once the one
before it on its GPU is ready; each worker's host KV pool is its share of the machine's host memory:
`sglang_ext.gpu_placement`), all sharing one KV pool (`--pool`, every page verified when read: a directory by
default; `mooncake`: a Mooncake Store, whose master `up` starts first), then the
gateway on SQLite in front of them; waits until everything is ready, prints where it listens, optionally runs the
demo, and stops every process it started on Ctrl-C or SIGTERM (or when one of them dies). A worker that dies or is
not ready in time stops the start-up at once, with the end of its log. `SESSIONGATE_WORKER_API_KEY`, when set,
becomes the workers' `--api-key` (and the gateway, which inherits the environment, sends it).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

import httpx

from .demo import run_demo

if TYPE_CHECKING:
    from sessiongate.sglang_ext.gpu_placement import GpuPlacement

__all__ = ["run_up"]


class _Child(Protocol):
    """A process `up` started and must stop: a worker or the gateway."""

    def poll(self) -> int | None: ...

    def stop(self, timeout: float = ...) -> object: ...


class _Stop(Exception):
    """SIGTERM, turned into an exception so the same clean-up runs as for Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop


class GatewayProcess:
    """The gateway as a child process, with its log in a file."""

    def __init__(
        self, *, port: int, workers: list[str], database_url: str, log_path: Path, defaults: dict[str, str]
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        # The embedded default is for local use: callers need no key unless the user asks for keys. `defaults`
        # yield to the user's environment too.
        env = {
            "SESSIONGATE_ALLOW_UNAUTHENTICATED": "true",
            **defaults,
            **os.environ,
            "SESSIONGATE_DATABASE_URL": database_url,
        }
        command = [sys.executable, "-m", "sessiongate.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        for url in workers:
            command += ["--worker", url]
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the gateway exited with code {self.process.returncode}; "
                    f"see {self.log_path}:\n{_tail(self.log_path)}"
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the gateway was not ready after {timeout_s:.0f} s; see {self.log_path}")

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _gateway_defaults(args: argparse.Namespace) -> dict[str, str]:
    """The router's cost model prices moving a session's KV by its bytes: those of the named model served."""
    from sessiongate.sglang_ext.models import kv_bytes_per_token

    if args.model_path:
        return {}  # unknown: the gateway's default, or the user's SESSIONGATE_KV_BYTES_PER_TOKEN
    return {"SESSIONGATE_KV_BYTES_PER_TOKEN": str(kv_bytes_per_token(args.model_size))}


def _describe(model_size: str) -> str:
    from sessiongate.sglang_ext.models import MODELS

    if MODELS[model_size].real:
        return f"the {model_size} model (SmolLM2-135M-Instruct; the first start converts it, about 20 s)"
    return f"the generated random-weight {model_size} model (its words are noise)"


def _gpu_placements(workers: int) -> list[GpuPlacement]:
    """Where each worker runs on this machine's GPUs (`gpu_placement`); empty on a machine without one."""
    from sessiongate.sglang_ext.gpu_placement import place_workers
    from sessiongate.sglang_ext.hardware import gpu_ids

    gpus = gpu_ids()
    if not gpus:
        return []
    placements = place_workers(workers, gpus)
    shared = [f"{p.gpu_id} ({p.sharing} workers, --mem-fraction-static {p.mem_fraction_static})" for p in placements]
    alone = all(p.sharing == 1 for p in placements)
    print(f"GPUs: {', '.join(p.gpu_id for p in placements) if alone else '; '.join(shared)}", flush=True)
    return placements


def _host_pool_gb(workers: int, on_gpu: bool) -> int | None:
    """On a GPU machine each worker's host KV pool (GB), decided once for all of them before any starts."""
    if not on_gpu:
        return None
    from sessiongate.sglang_ext.gpu_placement import available_host_memory_bytes, host_kv_pool_gb

    return host_kv_pool_gb(workers, available_host_memory_bytes())


def run_up(args: argparse.Namespace) -> int:
    from sessiongate.sglang_ext.hardware import cores_per_worker
    from sessiongate.sglang_ext.launcher import WorkerConfig, start_worker
    from sessiongate.sglang_ext.mooncake import MasterConfig, start_master
    from sessiongate.sglang_ext.worker_process import WorkerProcess, WorkerStartError, stop_all, wait_all_ready

    state_dir = Path(args.state_dir).resolve()
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pool_dir = state_dir / "kv-pool"
    signal.signal(signal.SIGTERM, _on_sigterm)
    started: list[_Child] = []
    try:
        master = None
        if args.pool == "mooncake":
            # Started first so that it is stopped last: the workers' clients talk to it until they exit.
            master = start_master(MasterConfig(log_file=logs / "mooncake-master.log"))
            started.append(master)
            master.wait_ready()
        pool = f"the Mooncake Store at {master.config.master_address}" if master else f"{args.pool} pool {pool_dir}"
        model = args.model_path or _describe(args.model_size)
        print(f"starting {args.workers} worker(s) with {model}, sharing {pool} ...", flush=True)
        try:
            placements = _gpu_placements(args.workers)
            host_pool_gb = _host_pool_gb(args.workers, bool(placements))
        except ValueError as error:
            print(f"sessiongate up: {error}", file=sys.stderr)
            return 2
        workers = []
        for i in range(args.workers):
            # Started one after another: the first one makes the model (SmolLM2: converts it once, ~20 s), the
            # others find it made.
            place = placements[i] if placements else None
            config = WorkerConfig(
                model_path=Path(args.model_path) if args.model_path else None,
                model_size=args.model_size,
                state_dir=state_dir,
                port=args.worker_base_port + i,
                storage_backend=args.pool,
                pool_dir=pool_dir,
                log_file=logs / f"worker-{i + 1}.log",
                cpu_threads=cores_per_worker(args.workers),
                device="cuda" if place else "cpu",
                gpu_id=place.gpu_id if place else None,
                mem_fraction_static=place.mem_fraction_static if place else None,
                machine_workers=args.workers,
                hicache_size=host_pool_gb,
                api_key=os.environ.get("SESSIONGATE_WORKER_API_KEY") or None,
            )
            worker = start_worker(master.config.pool_of(config) if master else config)
            started.append(worker)
            workers.append(worker)
            if place is not None and place.wait_before_next:
                # The next worker on this GPU sizes its share from what this one leaves free.
                worker.wait_ready(timeout=600)
        wait_all_ready(workers, timeout=600)
        gateway = GatewayProcess(
            port=args.port,
            workers=[w.url for w in workers],
            database_url=f"sqlite+aiosqlite:///{state_dir / 'sessiongate.db'}",
            log_path=logs / "gateway.log",
            defaults=_gateway_defaults(args),
        )
        started.append(gateway)
        gateway.wait_ready(timeout_s=60)

        print("\nsessiongate is up:")
        print(f"  gateway   {gateway.url}   (OpenAI API at {gateway.url}/v1, metrics at {gateway.url}/metrics)")
        print(f"  chat page {gateway.url}/ui")
        for i, worker in enumerate(workers):
            print(f"  worker {i + 1}  {worker.url}")
        print(f"  store     {state_dir / 'sessiongate.db'}\n  KV pool   {pool}\n  logs      {logs}")
        if os.environ.get("SESSIONGATE_ALLOW_UNAUTHENTICATED", "true").lower() in ("1", "true", "yes", "on"):
            print(
                "  authentication: NONE (local use only; SESSIONGATE_ALLOW_UNAUTHENTICATED=false to require keys,"
                " `sessiongate keys create --tenant T` to make them)\n",
                flush=True,
            )
        else:
            print("  authentication: tenant API keys (`sessiongate keys create --tenant T`)\n", flush=True)
        if args.demo:
            run_demo(base_url=gateway.url)
            if args.exit_after_demo:
                return 0
        print("press Ctrl-C to stop", flush=True)
        while True:
            for child in started:
                code = child.poll()
                if code is not None:
                    print(f"a child process exited unexpectedly (code {code}); stopping", file=sys.stderr)
                    return 1
            time.sleep(0.5)
    except WorkerStartError as error:
        print(f"sessiongate up: a worker failed to start: {error}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Stop):
        print("\nstopping ...", flush=True)
        return 0
    finally:
        # In the reverse order of their start (the gateway first, the Mooncake master last), the workers together:
        # their drains side by side, each SGLang server taking seconds to shut down.
        running = [child for child in started if isinstance(child, WorkerProcess)]
        for child in reversed(started):
            if not isinstance(child, WorkerProcess):
                child.stop()
            elif child is running[-1]:  # the first worker reached
                stop_all(running)
        print("stopped", flush=True)

"""Start, watch and stop a real SGLang server with the sessiongate extension loaded.

- `build_command(config)`: the `python -m sglang.launch_server ...` command line;
- `build_env(config, environ)`: its environment (on a machine without CUDA: the CPU engine and
  sessiongate's compatibility layer on PYTHONPATH, see `sglang_ext.cpu_compat`);
- `start_worker(config)`: makes the named model (`WorkerConfig.model_size`, `sglang_ext.models`) if no
  model path is given, starts the server in its own
  process group and returns a `WorkerProcess` (`url`, `wait_ready()`, `stop()`);
- `worker_main(argv)`: the `sessiongate worker` command - runs one worker in the foreground and
  stops it cleanly on SIGINT/SIGTERM.

The extension itself is loaded by SGLang through its plug-in entry point (`sglang_ext.plugin`);
the launcher imports nothing of SGLang or torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from sessiongate.sglang_ext import parallelism
from sessiongate.sglang_ext.cpu_compat import SITE_DIR
from sessiongate.sglang_ext.gpu_placement import available_host_memory_bytes, equal_gpu_fraction, host_kv_pool_gb
from sessiongate.sglang_ext.hardware import has_cuda
from sessiongate.sglang_ext.models import MODELS, model_dir
from sessiongate.sglang_ext.plugin import ENABLE_ENV, TINY_TOOL_CALL_PARSER
from sessiongate.sglang_ext.pool_backends import DIRECTORY_POOLS, storage_args
from sessiongate.sglang_ext.ports import PortClaims, PortTaken
from sessiongate.sglang_ext.tiny_model import is_complete
from sessiongate.sglang_ext.worker_config import (
    CPU_CHUNKED_PREFILL_SIZE,
    CPU_MAX_RUNNING_REQUESTS,
    WorkerConfig,
    parse_worker_config,
)
from sessiongate.sglang_ext.worker_process import WorkerProcess, WorkerStartError

__all__ = [
    "WorkerConfig",
    "WorkerProcess",
    "WorkerStartError",
    "build_command",
    "build_env",
    "resolve_config",
    "start_worker",
    "worker_main",
]

# SGLang's file backend reads its directory from this variable before anything else: one left in
# the environment would silently point a worker away from its configured pool.
_FILE_BACKEND_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
# With priority eviction: the priority of a request that names none. Above 0, so a request sent with
# priority 0 (a one-off) is evicted before any session's KV.
DEFAULT_REQUEST_PRIORITY = 1


def resolve_config(config: WorkerConfig) -> WorkerConfig:
    """Decide `device="auto"` (once: it runs `nvidia-smi`) and make relative paths absolute."""
    device = config.device
    if device == "auto":
        device = "cuda" if has_cuda() else "cpu"
    return config.replace(
        device=device,
        state_dir=config.state_dir.resolve(),
        # A hub id stays as given; a local directory becomes absolute.
        model_path=(
            config.model_path.resolve() if config.model_path and config.model_path.exists() else config.model_path
        ),
        pool_dir=config.effective_pool_dir.resolve(),
        # On CPU the named model's pool size; on a GPU None stays None: SGLang sizes the pool from the GPU's memory.
        max_total_tokens=config.effective_max_total_tokens if device == "cpu" else config.max_total_tokens,
        log_file=config.effective_log_file.resolve(),
        # On a GPU the host pool's GB, decided once from what the machine has available now.
        hicache_size=config.hicache_size if device == "cpu" else _host_pool_gb(config),
    )


def _host_pool_gb(config: WorkerConfig) -> int | None:
    """A GPU worker's `--hicache-size`: as given, else its share of the machine's available host memory."""
    if config.hicache_size is not None or not config.hierarchical_cache:
        return config.hicache_size
    return host_kv_pool_gb(config.machine_workers, available_host_memory_bytes())


def _on_cpu(config: WorkerConfig) -> bool:
    return config.device == "cpu" or (config.device == "auto" and not has_cuda())


def _named_model_dir(config: WorkerConfig) -> Path:
    return model_dir(config.state_dir, config.model_size)


def served_model_name(config: WorkerConfig) -> str | None:
    """The name users see (`/v1/models`, the chat page, responses): as configured; else a named model's own name, or a
    local model directory's name. SGLang's default is the model path, a directory of this machine. None: a hub id,
    which is a name already."""
    if config.served_model_name is not None:
        return config.served_model_name
    if config.model_path is None:
        return MODELS[config.model_size].served_name
    if config.model_path.is_dir():
        return config.model_path.name
    return None


def build_command(config: WorkerConfig) -> list[str]:
    """The SGLang server command line for `config` (run it with `build_env`'s environment)."""
    on_cpu = _on_cpu(config)
    model_path = config.model_path if config.model_path is not None else _named_model_dir(config)
    command = [
        config.python or sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        config.host,
        "--port",
        str(config.port),
        "--dtype",
        config.dtype or ("float32" if on_cpu else "auto"),
        "--page-size",
        str(config.page_size),
        "--log-level",
        config.log_level,
        "--enable-cache-report",
        "--enable-metrics",
        # An idle scheduler blocks on its input instead of spinning a core (see internals/idle_wait.py).
        "--sleep-on-idle",
    ]
    # On CPU the small defaults; on a GPU SGLang sizes what is not given from the GPU's memory and the model.
    sizes = {
        "--max-total-tokens": config.effective_max_total_tokens if on_cpu else config.max_total_tokens,
        "--max-running-requests": config.max_running_requests or (CPU_MAX_RUNNING_REQUESTS if on_cpu else None),
        "--chunked-prefill-size": config.chunked_prefill_size or (CPU_CHUNKED_PREFILL_SIZE if on_cpu else None),
        "--context-length": config.context_length,
        "--mem-fraction-static": None if on_cpu else _mem_fraction_static(config),
        "--nccl-port": config.nccl_port,
    }
    for flag, value in sizes.items():
        if value is not None:
            command += [flag, str(value)]
    if config.api_key:
        command += ["--api-key", config.api_key]
    served_name = served_model_name(config)
    if served_name is not None:
        command += ["--served-model-name", served_name]
    if config.extension and (config.model_path is None or is_complete(config.model_path)):
        # The models sessiongate makes (here, or by another worker and shared by path) carry its ChatML
        # template with Qwen 2.5's tool-call format (`sglang_ext.tiny_tokenizer`): that parser, and forced calls
        # in compact JSON, which a random-weight model ends instead of padding with whitespace.
        parser = config.tool_call_parser or TINY_TOOL_CALL_PARSER
        command += ["--tool-call-parser", parser, "--constrained-json-disable-any-whitespace"]
    elif config.tool_call_parser is not None:
        command += ["--tool-call-parser", config.tool_call_parser]
    if on_cpu:
        command += ["--device", "cpu", "--attention-backend", "torch_native"]
    if config.priority_eviction:
        command += [
            "--enable-priority-scheduling",
            "--radix-eviction-policy",
            "priority",
            "--default-priority-value",
            str(DEFAULT_REQUEST_PRIORITY),
        ]
    if config.hierarchical_cache:
        # On a GPU an explicit size: a ratio turns SGLang's host-memory sizing off and asks for ~2x the GPU's KV pool.
        host_pool_gb = config.hicache_size if on_cpu else _host_pool_gb(config)
        host_pool = (
            ["--hicache-size", str(host_pool_gb)] if host_pool_gb else ["--hicache-ratio", str(config.hicache_ratio)]
        )
        command += ["--enable-hierarchical-cache", *host_pool, "--hicache-write-policy", "write_through"]
        io_backend = config.hicache_io_backend or ("direct" if on_cpu else None)
        if io_backend is not None:
            command += ["--hicache-io-backend", io_backend]
        command += storage_args(config, on_cpu=on_cpu)
    return command + list(config.extra_args)


def _mem_fraction_static(config: WorkerConfig) -> float | None:
    """As given; else, for workers sharing one GPU, an equal split of it; else SGLang's default (None)."""
    if config.mem_fraction_static is not None or config.gpu_share == 1:
        return config.mem_fraction_static
    return equal_gpu_fraction(config.gpu_share)


HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def build_env(config: WorkerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: `environ` plus what the worker needs on this machine."""
    env = dict(environ)
    env.pop(_FILE_BACKEND_DIR_ENV, None)
    if config.extension:
        env[ENABLE_ENV] = "1"  # the plug-in is opt-in: SGLang servers not started here stay as they are
    else:
        env.pop(ENABLE_ENV, None)
    # SGLang's `/health` runs a one-token generation unless told otherwise: the gateway's poll every few seconds
    # would be a forward pass per worker that shows up as load (and waits a second). Liveness of the server is
    # what the poll asks; a scheduler that stops answering is caught by the turns' own timeouts. An operator's
    # own setting wins.
    env.setdefault(HEALTH_GENERATION_ENV, "false")
    if not _on_cpu(config) and config.gpu_id is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(config.gpu_id)  # one GPU per worker: SGLang uses the first it sees
    if _on_cpu(config):
        # Without it SGLang takes its CUDA paths (and fails importing vllm's rotary op).
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        pythonpath = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(SITE_DIR) + (os.pathsep + pythonpath if pythonpath else "")
        if config.cpu_threads is not None:
            # torch sizes its OpenMP (and MKL) pools from this at start-up, in every process the server forks.
            env["OMP_NUM_THREADS"] = str(config.cpu_threads)
    return env


def _ensure_model(config: WorkerConfig, env: Mapping[str, str]) -> None:
    """Make the named model when no path is configured, in a child process with the worker's environment
    (it imports torch and transformers; SmolLM2's first conversion takes about 20 s)."""
    if config.model_path is not None:
        return
    directory = _named_model_dir(config)
    if is_complete(directory):
        return
    command = [config.python or sys.executable, "-m", "sessiongate.sglang_ext.models", str(directory)]
    made = subprocess.run(
        [*command, "--model", config.model_size], env=dict(env), capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        raise WorkerStartError(f"making the {config.model_size} model in {directory} failed:\n{made.stderr[-4000:]}")


def _claim_ports(config: WorkerConfig, claims: PortClaims) -> WorkerConfig:
    """Claim the worker's HTTP port and its torch.distributed port (picked when not given): see `ports`."""
    try:
        claims.claim(config.host if config.host not in ("", "::") else "0.0.0.0", config.port)
        # torch's store listens on every interface: the port must be free on all of them.
        nccl_port = (
            claims.claim("0.0.0.0", config.nccl_port) if config.nccl_port is not None else claims.claim_free("0.0.0.0")
        )
    except PortTaken as error:
        claims.release_all()
        raise WorkerStartError(f"cannot start the worker at {config.url}: {error}") from None
    return config.replace(nccl_port=nccl_port)


def _shown(command: list[str]) -> str:
    """The command line for the log, without the API key."""
    return " ".join(
        "<api-key>" if index and command[index - 1] == "--api-key" else arg for index, arg in enumerate(command)
    )


def start_worker(config: WorkerConfig) -> WorkerProcess:
    """Start the SGLang server for `config` in its own process group; call `wait_ready()` next.

    Raises `WorkerStartError` at once when the configuration asks for more than one scheduler rank or tokenizer
    worker (`parallelism`), when a GPU machine's host memory leaves no host KV pool, or a port is taken; the ports
    are released when the worker is stopped.
    """
    refused = parallelism.args_refusal(config.extra_args)
    if refused is not None:
        raise WorkerStartError(refused)
    try:
        config = resolve_config(config)
    except ValueError as error:
        raise WorkerStartError(str(error)) from None
    env = build_env(config, os.environ)
    _ensure_model(config, env)
    log_file = config.effective_log_file
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if config.storage_backend in DIRECTORY_POOLS:
        config.effective_pool_dir.mkdir(parents=True, exist_ok=True)
    claims = PortClaims()  # this worker's own: released when it stops
    config = _claim_ports(config, claims)
    command = build_command(config)
    try:
        with log_file.open("ab") as log:
            log.write(f"\n=== sessiongate: starting {_shown(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    except BaseException:
        claims.release_all()
        raise
    return WorkerProcess(config=config, process=process, log_file=log_file, claims=claims)


def worker_main(argv: list[str] | None = None) -> int:
    """`sessiongate worker [flags] [-- sglang args]`: run one worker until SIGINT/SIGTERM.

    `argv` defaults to `sys.argv[1:]`. Returns 0 after a requested stop, 1 when the worker could
    not start, or SGLang's exit code when it ended on its own.
    """
    config = parse_worker_config(sys.argv[1:] if argv is None else argv, os.environ)
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run_in_foreground(config, stop_requested)
    except WorkerStartError as error:
        print(f"sessiongate worker: {error}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_in_foreground(config: WorkerConfig, stop_requested: threading.Event) -> int:
    worker = start_worker(config)
    try:
        print(f"sessiongate worker: starting {worker.url} (log: {worker.log_file})", file=sys.stderr)
        worker.wait_ready(timeout=600.0, cancel=stop_requested)
        if not stop_requested.is_set():
            print(f"sessiongate worker: ready at {worker.url} (pid {worker.pid})", file=sys.stderr)
        while not stop_requested.wait(0.5):
            if worker.process.poll() is not None:
                print(f"sessiongate worker: SGLang exited ({worker.process.returncode})", file=sys.stderr)
                return worker.process.returncode or 1
        return 0
    finally:
        worker.stop()

"""The settings of one SGLang worker started by sessiongate, and how they are read from a CLI.

`WorkerConfig` is the single source of each default. `parse_worker_config(argv, environ)` builds
one from command-line flags, each of which falls back to an environment variable
`SESSIONGATE_WORKER_<FIELD>` and then to the field's default (flag > environment > default).
Arguments after a bare `--` (or in `SESSIONGATE_WORKER_EXTRA_ARGS`, shell-quoted) are passed to
SGLang unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sglang_ext.models import MODEL_NAMES, MODELS, ModelName

__all__ = [
    "CPU_CHUNKED_PREFILL_SIZE",
    "CPU_MAX_RUNNING_REQUESTS",
    "CPU_MAX_TOTAL_TOKENS",
    "ENV_PREFIX",
    "WorkerConfig",
    "parse_worker_config",
]

ENV_PREFIX = "SESSIONGATE_WORKER_"

# A CPU worker's sizes when none are given: small enough for a 24 GiB developer machine running two workers
# (without `--max-total-tokens` SGLang sized a CPU KV pool at 15.6 GB). On a GPU SGLang sizes them itself.
CPU_MAX_TOTAL_TOKENS = 4096
CPU_MAX_RUNNING_REQUESTS = 8
CPU_CHUNKED_PREFILL_SIZE = 1024

Device = Literal["auto", "cpu", "cuda"]
PrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]


@dataclass(frozen=True)
class WorkerConfig:
    """One SGLang worker: model, address, KV cache tiers, and where its files go."""

    model_path: Path | None = None
    """A model directory or hub id; None makes the named `model_size` model under `state_dir`."""
    model_size: ModelName = "tiny"
    """Which model to make when `model_path` is None (`sglang_ext.models`): `tiny` or `medium` (random
    weights, noise) or `smollm2` (SmolLM2-135M-Instruct, real answers; converted once, about 20 s)."""
    state_dir: Path = Path(".sessiongate")
    """Made models, the default pool directory and the default log files live here."""
    host: str = "127.0.0.1"
    port: int = 30000
    device: Device = "auto"
    """`auto`: CUDA when the machine has an NVIDIA GPU (`hardware.gpu_count`), else CPU with the compatibility
    layer."""
    gpu_id: str | None = None
    """On a GPU: the one GPU this worker uses, an index or a UUID (its `CUDA_VISIBLE_DEVICES`); None: what the
    environment allows (SGLang takes the first visible one). `sessiongate up` gives each worker its own."""
    dtype: str | None = None
    """SGLang's `--dtype`; None: `float32` on CPU (AVX2 has no fast fp16/bf16 matmul: 2k-token prefill
    of the medium model took 9.3 s in float16, 1.2 s in float32), `auto` on GPU."""
    cpu_threads: int | None = None
    """Threads of the CPU engine's torch operators (`OMP_NUM_THREADS`); ignored on GPU. None: torch's default,
    one per core, right for a worker alone on its machine. Workers that share a machine must share its cores
    (`sglang_ext.hardware.cores_per_worker`): with every core each, their OpenMP threads spin against each
    other and a decode step becomes 9-34x slower (docs/sglang-on-cpu.md)."""
    max_total_tokens: int | None = None
    """Device KV pool size in tokens. None: on CPU the named model's (`sglang_ext.models`: 4096 for tiny and
    medium, 8192 for smollm2), `CPU_MAX_TOTAL_TOKENS` for a `model_path` (without it SGLang sizes a CPU pool from
    free memory: 15.6 GB on a 24 GiB machine); on a GPU SGLang's sizing from `mem_fraction_static`, what a real
    model needs."""
    mem_fraction_static: float | None = None
    """On a GPU: the fraction of its memory for weights and the KV pool (SGLang's `--mem-fraction-static`);
    None: SGLang's default for the GPU and model."""
    context_length: int | None = None
    """SGLang's `--context-length`; None: the model's own."""
    page_size: int = 64
    max_running_requests: int | None = None
    """None: `CPU_MAX_RUNNING_REQUESTS` on CPU, SGLang's default on a GPU."""
    chunked_prefill_size: int | None = None
    """None: `CPU_CHUNKED_PREFILL_SIZE` on CPU, SGLang's default on a GPU."""
    served_model_name: str | None = None
    hierarchical_cache: bool = True
    """HiCache: a host-memory tier under the device pool, written through, and the L3 storage below."""
    hicache_ratio: float = 2.0
    """Host pool size as a multiple of the device pool."""
    hicache_io_backend: str | None = None
    """None: `direct` on CPU (the only one without CUDA kernels), SGLang's default on GPU."""
    storage_backend: str | None = "file"
    """The KV pool shared by the workers (HiCache's L3 backend): `file`, a directory (`pool_dir`);
    `checked-file`, the same with a checksum per page (a damaged page is a miss); `mooncake`, a Mooncake
    Store (`mooncake_*`); any other SGLang backend name as is; None for no pool."""
    pool_dir: Path | None = None
    """The `file` backend's directory, shared by all local workers; None: `<state_dir>/kv-pool`."""
    mooncake_master: str = "127.0.0.1:50051"
    """`host:port` of the `mooncake_master` RPC service (see `sglang_ext.mooncake`)."""
    mooncake_metadata_server: str = "http://127.0.0.1:8080/metadata"
    """The transfer engine's metadata service: the master's own HTTP one, or `P2PHANDSHAKE`."""
    mooncake_segment_bytes: int = 512 << 20
    """Memory this worker lends to the Mooncake pool; pages it writes live there, so the pool holds
    at most the sum over the workers, and a stopped worker takes its share with it."""
    mooncake_protocol: str = "tcp"
    """The transfer engine's protocol: `tcp` anywhere, `rdma` with an RDMA NIC."""
    prefetch_policy: PrefetchPolicy = "wait_complete"
    priority_eviction: bool = False
    """SGLang's priority scheduling and `priority` radix eviction: a request's `priority` (default 1 when it
    has none) is its KV's priority in the cache, the lowest evicted first (then LRU); a one-off request sent
    with priority 0 leaves the device before any default-priority session's KV."""
    prefetch_threshold: int | None = None
    """Fewest tokens worth a prefetch from L3; None keeps SGLang's default (256)."""
    tool_call_parser: str | None = None
    """SGLang's `--tool-call-parser`; None: `sessiongate-json` for the tiny models, none otherwise."""
    log_file: Path | None = None
    """None: `<state_dir>/logs/worker-<port>.log`."""
    log_level: str = "info"
    python: str | None = None
    """The interpreter that runs SGLang; None: this one."""
    extension: bool = True
    """Load sessiongate's plug-in (`SESSIONGATE_EXTENSION=1`); False: plain SGLang with the same flags, for
    comparisons (`benchmarks.plugin_overhead`)."""
    nccl_port: int | None = None
    """The port of the worker's torch.distributed store (SGLang's `--nccl-port`, its only TCP port besides `port`
    here); None: the launcher picks a free one and claims it (`sglang_ext.ports`), so workers started side by side
    cannot take each other's ports."""
    api_key: str | None = None
    """SGLang's `--api-key`: every endpoint but `/health*` and `/metrics` (the extension's included) then wants
    `Authorization: Bearer <key>`; the gateway sends `SESSIONGATE_WORKER_API_KEY`. Workers belong on a private
    network all the same."""
    extra_args: tuple[str, ...] = ()

    @property
    def effective_max_total_tokens(self) -> int:
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        return MODELS[self.model_size].kv_tokens if self.model_path is None else CPU_MAX_TOTAL_TOKENS

    @property
    def effective_pool_dir(self) -> Path:
        return self.pool_dir if self.pool_dir is not None else self.state_dir / "kv-pool"

    @property
    def effective_log_file(self) -> Path:
        return self.log_file if self.log_file is not None else self.state_dir / "logs" / f"worker-{self.port}.log"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def _optional(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() in ("", "none") else convert(text)

    return parse


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


# Field -> how its text is read; the field's type decides, so a new field needs a line here.
_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "model_path": _optional(Path),
    "model_size": str,
    "state_dir": Path,
    "host": str,
    "port": int,
    "device": str,
    "gpu_id": _optional(str),
    "dtype": _optional(str),
    "cpu_threads": _optional(_positive),
    "max_total_tokens": _optional(_positive),
    "mem_fraction_static": _optional(float),
    "context_length": _optional(_positive),
    "page_size": int,
    "max_running_requests": _optional(_positive),
    "chunked_prefill_size": _optional(int),
    "served_model_name": _optional(str),
    "hierarchical_cache": _boolean,
    "hicache_ratio": float,
    "hicache_io_backend": _optional(str),
    "storage_backend": _optional(str),
    "pool_dir": _optional(Path),
    "mooncake_master": str,
    "mooncake_metadata_server": str,
    "mooncake_segment_bytes": int,
    "mooncake_protocol": str,
    "prefetch_policy": str,
    "priority_eviction": _boolean,
    "prefetch_threshold": _optional(int),
    "tool_call_parser": _optional(str),
    "log_file": _optional(Path),
    "log_level": str,
    "python": _optional(str),
    "extension": _boolean,
    "nccl_port": _optional(int),
    "api_key": _optional(str),
}
_SECRET_FIELDS = ("api_key",)
_CHOICES: dict[str, Sequence[str]] = {
    "model_size": MODEL_NAMES,
    "device": ("auto", "cpu", "cuda"),
    "prefetch_policy": ("best_effort", "wait_complete", "timeout"),
}


def _build_parser(environ: Mapping[str, str], prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one SGLang worker with the sessiongate extension, in the foreground.",
        epilog=f"Each flag defaults to ${ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}PORT). "
        "Arguments after `--` go to SGLang unchanged.",
    )
    for field in dataclasses.fields(WorkerConfig):
        if field.name == "extra_args":
            continue
        convert = _CONVERTERS[field.name]
        env_name = ENV_PREFIX + field.name.upper()
        default = convert(environ[env_name]) if env_name in environ else field.default
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=convert,
            default=default,
            choices=_CHOICES.get(field.name),
            metavar=field.name.upper(),
            help=f"(default: {'<set>' if field.name in _SECRET_FIELDS and default else default}; env {env_name})",
        )
    return parser


def parse_worker_config(
    argv: Sequence[str], environ: Mapping[str, str], prog: str = "sessiongate worker"
) -> WorkerConfig:
    """Flags > `SESSIONGATE_WORKER_*` environment > `WorkerConfig` defaults."""
    args = list(argv)
    extra: list[str] = shlex.split(environ.get(ENV_PREFIX + "EXTRA_ARGS", ""))
    if "--" in args:
        split = args.index("--")
        args, extra = args[:split], args[split + 1 :]
    namespace = _build_parser(environ, prog).parse_args(args)
    return WorkerConfig(**vars(namespace), extra_args=tuple(extra))

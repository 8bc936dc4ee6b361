"""The settings of one SGLang worker started by sessiongate, and how they are read from a CLI.

`WorkerConfig` is the single source of each default. `parse_worker_config(argv, environ)` builds
one from command-line flags, each of which falls back to an environment variable
`SESSIONGATE_WORKER_<FIELD>` and then to the field's default (flag > environment > default).
Arguments after a bare `--` (or in `SESSIONGATE_WORKER_EXTRA_ARGS`, shell-quoted) are passed to
SGLang unchanged.

One idiom (`sessiongate.settings_base.EnvSettings`, as `gateway.settings.GatewaySettings`): ranges are field
constraints, the documentation is each field's docstring (the CLI's help and docs/configuration.md are made from
them); the constructor, `from_env`, `replace` and the CLI validate the same fields the same way; a bad value is one
`WorkerConfigError` naming its variable (the CLI: its flag or variable, as a usage error). The constructor reads no
environment.
"""

from __future__ import annotations

import argparse
import shlex
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sessiongate.settings_base import EnvSettings
from sessiongate.sglang_ext.models import MODELS, ModelName

__all__ = [
    "CPU_CHUNKED_PREFILL_SIZE",
    "CPU_MAX_RUNNING_REQUESTS",
    "CPU_MAX_TOTAL_TOKENS",
    "ENV_PREFIX",
    "WorkerConfig",
    "WorkerConfigError",
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
Positive = Annotated[int, Field(ge=1)]


class WorkerConfigError(ValueError):
    """A worker setting has a value that cannot be used; the message names the variable."""


class WorkerConfig(EnvSettings):
    """One SGLang worker: model, address, KV cache tiers, and where its files go."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, protected_namespaces=())
    error_type = WorkerConfigError

    # For mypy, EnvSettings' constructor (values as text too), not the one it would synthesize from the fields.
    if TYPE_CHECKING:

        def __init__(self, _labels: Mapping[str, str] | None = None, **values: Any) -> None: ...

    model_path: Path | None = None
    """A model directory or hub id; None makes the named `model_size` model under `state_dir`."""
    model_size: ModelName = "tiny"
    """Which model to make when `model_path` is None (`sglang_ext.models`): `tiny` or `medium` (random
    weights, noise) or `smollm2` (SmolLM2-135M-Instruct, real answers; converted once, about 20 s)."""
    state_dir: Path = Path(".sessiongate")
    """Made models, the default pool directory and the default log files live here."""
    host: str = "127.0.0.1"
    """The address the worker's HTTP server listens on."""
    port: int = 30000
    """The port the worker's HTTP server listens on."""
    device: Device = "auto"
    """`auto`: CUDA when the machine has an NVIDIA GPU (`hardware.gpu_count`), else CPU with the compatibility
    layer."""
    gpu_id: str | None = None
    """On a GPU: the one GPU this worker uses, an index or a UUID (its `CUDA_VISIBLE_DEVICES`); None: what the
    environment allows (SGLang takes the first visible one). `sessiongate up` gives each worker its own."""
    dtype: str | None = None
    """SGLang's `--dtype`; None: `float32` on CPU (AVX2 has no fast fp16/bf16 matmul: 2k-token prefill
    of the medium model took 9.3 s in float16, 1.2 s in float32), `auto` on GPU."""
    cpu_threads: Positive | None = None
    """Threads of the CPU engine's torch operators (`OMP_NUM_THREADS`); ignored on GPU. None: torch's default,
    one per core, right for a worker alone on its machine. Workers that share a machine must share its cores
    (`sglang_ext.hardware.cores_per_worker`): with every core each, their OpenMP threads spin against each
    other and a decode step becomes 9-34x slower (docs/sglang-on-cpu.md)."""
    max_total_tokens: Positive | None = None
    """Device KV pool size in tokens. None: on CPU the named model's (`sglang_ext.models`: 4096 for tiny and
    medium, 8192 for smollm2), `CPU_MAX_TOTAL_TOKENS` for a `model_path` (without it SGLang sizes a CPU pool from
    free memory: 15.6 GB on a 24 GiB machine); on a GPU SGLang's sizing from `mem_fraction_static`, what a real
    model needs."""
    mem_fraction_static: float | None = None
    """On a GPU: the fraction of its memory for weights and the KV pool (SGLang's `--mem-fraction-static`);
    None: SGLang's default for the GPU and model."""
    context_length: Positive | None = None
    """SGLang's `--context-length`; None: the model's own."""
    page_size: int = 64
    """Tokens per KV page (SGLang's `--page-size`): the unit of caching, prefetch and the pool."""
    max_running_requests: Positive | None = None
    """None: `CPU_MAX_RUNNING_REQUESTS` on CPU, SGLang's default on a GPU."""
    chunked_prefill_size: int | None = None
    """None: `CPU_CHUNKED_PREFILL_SIZE` on CPU, SGLang's default on a GPU."""
    served_model_name: str | None = None
    """The model name the worker answers to (SGLang's `--served-model-name`); None: its path."""
    hierarchical_cache: bool = True
    """HiCache: a host-memory tier under the device pool, written through, and the L3 storage below."""
    hicache_ratio: float = 2.0
    """On CPU: the host pool's size as a multiple of the device pool (SGLang's `--hicache-ratio`)."""
    hicache_size: Positive | None = None
    """The host pool in GB (SGLang's `--hicache-size`). None: on CPU `hicache_ratio`; on a GPU this machine's
    available host memory, less a reserve, shared among `machine_workers` (`sglang_ext.gpu_placement`): a ratio
    there asks for ~2x the GPU's KV pool in pinned memory, more than a 128 GiB machine has."""
    gpu_share: Positive = 1
    """On a GPU, when `mem_fraction_static` is None: how many workers share this worker's GPU; above 1 each asks
    for an equal split of `gpu_placement.SHARED_GPU_FRACTION`, safe in whatever order they start (`sessiongate up`
    places its workers itself: `gpu_placement.place_workers`)."""
    machine_workers: Positive = 1
    """How many workers share this machine's host memory (`sessiongate up` sets it): each one's host pool is a
    share of it."""
    hicache_io_backend: str | None = None
    """None: `direct` on CPU (the only one without CUDA kernels), SGLang's default on GPU."""
    storage_backend: str | None = "file"
    """The KV pool shared by the workers (HiCache's L3 backend): `file`, a directory (`pool_dir`) in SGLang's
    file layout with every page verified when read (a damaged page is a miss); `mooncake`, a Mooncake Store
    (`mooncake_*`), verified the same way; `file-unchecked`, SGLang's own `file` backend, which serves whatever
    a page file holds (to measure what verification costs, not to serve); any other SGLang backend name as is;
    None for no pool."""
    pool_dir: Path | None = None
    """The `file` backend's directory, shared by all local workers; None: `<state_dir>/kv-pool`."""
    mooncake_master: str = "127.0.0.1:50051"
    """`host:port` of the `mooncake_master` RPC service (see `sglang_ext.mooncake`)."""
    mooncake_metadata_server: str = "http://127.0.0.1:8080/metadata"
    """The transfer engine's metadata service: the master's own HTTP one, or `P2PHANDSHAKE`."""
    mooncake_segment_bytes: int = 512 << 20
    """Memory this worker lends to the Mooncake pool; pages it writes live there, so the pool holds
    at most the sum over the workers, and a stopped worker takes its share with it. 0: none, a client only
    (the pool lives in storage nodes, `sglang_ext.mooncake_node`, and every page crosses the network)."""
    mooncake_local_hostname: str | None = None
    """The address this worker's Mooncake client registers and is reached at; None: `host` (unless it is a
    wildcard, then SGLang's default). A pool across a network (`benchmarks.pool_link`) needs the address of the
    interface that faces it."""
    mooncake_protocol: str = "tcp"
    """The transfer engine's protocol: `tcp` anywhere, `rdma` with an RDMA NIC."""
    prefetch_policy: PrefetchPolicy = "wait_complete"
    """HiCache's L3 prefetch policy (SGLang's `--hicache-storage-prefetch-policy`)."""
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
    """SGLang's `--log-level`."""
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
    """Arguments passed to SGLang unchanged (shell-quoted in the environment; on the command line, after `--`)."""

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

    @field_validator("extra_args", mode="before")
    @classmethod
    def _split_extra_args(cls, value: Any) -> Any:
        return tuple(shlex.split(value)) if isinstance(value, str) else value  # shell-quoted, from the environment

    @model_validator(mode="before")
    @classmethod
    def _text_none_and_blank(cls, data: Any) -> Any:
        # From a flag or the environment, "none" (or nothing) means None for an optional setting: `--model-path none`.
        if not isinstance(data, dict):
            return data
        return {k: None if _none_text(v) and _optional_field(k) else v for k, v in data.items()}


_SECRET_FIELDS = ("api_key",)


def _environment(environ: Mapping[str, str]) -> dict[str, Any]:
    return WorkerConfig.env_values(environ)


def _none_text(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() in ("", "none")


def _optional_field(name: str) -> bool:
    field = WorkerConfig.model_fields.get(name)
    if field is None:
        return False
    annotation = field.annotation
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _choices(name: str) -> tuple[str, ...]:
    annotation = WorkerConfig.model_fields[name].annotation
    return tuple(str(a) for a in get_args(annotation)) if get_origin(annotation) is Literal else ()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _build_parser(environ: Mapping[str, str], prog: str) -> argparse.ArgumentParser:
    """Flags as text: `WorkerConfig` converts and checks them, as it does the environment's."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one SGLang worker with the sessiongate extension, in the foreground.",
        epilog=f"Each flag defaults to ${ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}PORT). "
        "Arguments after `--` go to SGLang unchanged.",
    )
    from_env = _environment(environ)
    for name, field in WorkerConfig.model_fields.items():
        if name == "extra_args":
            continue
        env_name = ENV_PREFIX + name.upper()
        default = from_env.get(name, field.default)
        shown = "<set>" if name in _SECRET_FIELDS and default else default
        choices = _choices(name)
        parser.add_argument(
            _flag(name),
            dest=name,
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=(f"{field.description.split(chr(10))[0]} " if field.description else "")
            + (f"One of {', '.join(choices)}. " if choices else "")
            + f"(default: {shown}; env {env_name})",
        )
    return parser


def parse_worker_config(
    argv: Sequence[str], environ: Mapping[str, str], prog: str = "sessiongate worker"
) -> WorkerConfig:
    """Flags > `SESSIONGATE_WORKER_*` environment > `WorkerConfig` defaults; a bad value is a usage error (exit 2)
    naming the flag or the variable it came from."""
    args = list(argv)
    passthrough: list[str] | None = None
    if "--" in args:
        split = args.index("--")
        args, passthrough = args[:split], args[split + 1 :]
    parser = _build_parser(environ, prog)
    flags = vars(parser.parse_args(args))
    values = {**_environment(environ), **flags}
    if passthrough is not None:
        values["extra_args"] = tuple(passthrough)
    try:
        return WorkerConfig(_labels={name: _flag(name) for name in flags}, **values)
    except WorkerConfigError as error:
        parser.error(str(error))

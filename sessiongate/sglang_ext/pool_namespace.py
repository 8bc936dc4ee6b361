"""The namespace of a worker's pages in the shared KV pool: model and its revision, KV dtype and scales, page size,
layout and KV shape.

SGLang keys a pool page by the hash of its tokens and suffixes the key with the *served model name* (the file
backend's `_{model}_{tp_rank}_{tp_size}`, Mooncake's key prefix). Two workers that serve under one name but keep
their KV differently would read each other's bytes as their own: a wrong answer, not a miss. The extension therefore
replaces the model name SGLang hands every storage backend with `<served name>-sg<digest>`, the digest covering
everything that decides a page's bytes (`PoolLayout`), so such workers share nothing and each other's pages are
misses. Workers that agree on all of it (the point of a shared pool) keep sharing.

What decides a page's bytes, and why each is its own field:
- the KV cache dtype as configured (`--kv-cache-dtype`): every FP8 format is stored as `torch.uint8` in the host
  pool, so the host pool's dtype alone keys an fp8_e4m3 and an fp8_e5m2 worker alike (the hole this closes);
- the KV scales: FP8 KV is stored divided by per-layer `k_scale`/`v_scale`; workers with other scales (another
  quantized checkpoint, another `--quantization-param-path`) decode each other's bytes wrongly (`kv_scales_digest`);
- the model's revision: the same config with other weights (two fine-tunes of one base) makes other KV for the same
  tokens (`model_revision`: the weight files' headers and a sample of their bytes, or the hub revision);
- the model's config, the host pool's dtype, page size, layout and KV shape, as before.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PoolLayout",
    "kv_scales_digest",
    "model_fingerprint",
    "model_revision",
    "namespaced_model_name",
    "worker_pool_layout",
]

_SAMPLE_BYTES = 64 << 10
_SCALE_TENSOR = re.compile(r"(^|\.)(k_scale|v_scale|kv_scale|k_cache_scale|v_cache_scale)$")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_KV_SHAPE_ATTRS = ("layer_num", "head_num", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "size_per_token")


@dataclass(frozen=True)
class PoolLayout:
    """What decides the bytes of one page in the pool."""

    model: str
    """The model's identity: its config (architecture, sizes, rope, ...), or its path when there is none."""
    kv_dtype: str
    """The host pool's dtype (`torch.uint8` for every FP8 format)."""
    page_size: int
    layout: str
    """The host pool's memory layout (`layer_first`, `page_first`, `page_first_direct`, ...)."""
    kv_shape: tuple[int, ...]
    """Layers, KV heads and head dim (or what the pool has instead), and the bytes per token."""
    kv_cache_dtype: str = "auto"
    """SGLang's `--kv-cache-dtype` (`auto`, `bf16`, `fp8_e4m3`, `fp8_e5m2`, ...) and the device pool's dtype."""
    kv_scales: str = ""
    """A digest of the KV scales the worker stores its KV with (`kv_scales_digest`); empty: none."""
    revision: str = ""
    """The weights' identity (`model_revision`)."""


def model_fingerprint(model_path: str) -> str:
    """The model's config as canonical JSON when `model_path` is a local directory with one, else the path."""
    config = Path(model_path) / "config.json"
    try:
        return json.dumps(json.loads(config.read_text()), sort_keys=True)
    except (OSError, ValueError):
        return model_path


def model_revision(model_path: str, revision: str | None = None) -> str:
    """What identifies the weights: for a local directory a digest of each weight file's name, size, safetensors
    header and 64 KiB from its start, middle and end (a fine-tune changes nearly every weight: a few MB read, not the
    whole checkpoint); for a hub id the id and `revision`."""
    directory = Path(model_path)
    files = sorted(p for p in directory.glob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    if not files:
        return f"{model_path}@{revision or 'main'}"
    digest = hashlib.sha256((revision or "").encode())
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as weights:
            for offset in (0, max(0, size // 2 - _SAMPLE_BYTES // 2), max(0, size - _SAMPLE_BYTES)):
                weights.seek(offset)
                digest.update(weights.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def kv_scales_digest(model_path: str, quantization_param_path: str | None = None) -> str:
    """A digest of the KV scales a worker stores FP8 KV with, empty when it has none (scale 1).

    The scale tensors' values read from the safetensors checkpoint (`*.k_scale`, `*.v_scale`, `*.kv_scale`), the
    config's KV quantization (`quantization_config`, e.g. `kv_cache_scheme`), and the `--quantization-param-path`
    file's bytes.
    """
    digest = hashlib.sha256()
    found = False
    directory = Path(model_path)
    try:
        quantization = json.loads((directory / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        quantization = None
    if quantization:
        digest.update(json.dumps(quantization, sort_keys=True).encode())
        found = True
    for path in sorted(directory.glob("*.safetensors")):
        for name, value in _scale_tensors(path):
            digest.update(name.encode() + b"=" + value)
            found = True
    if quantization_param_path:
        try:
            digest.update(Path(quantization_param_path).read_bytes())
        except OSError:
            digest.update(quantization_param_path.encode())
        found = True
    return digest.hexdigest()[:16] if found else ""


def _scale_tensors(path: Path) -> list[tuple[str, bytes]]:
    """(name, raw bytes) of each KV-scale tensor in one safetensors file, read by the offsets in its header."""
    try:
        with path.open("rb") as weights:
            (header_size,) = struct.unpack("<Q", weights.read(8))
            header = json.loads(weights.read(header_size))
            scales = []
            for name in sorted(header):
                if name == "__metadata__" or not _SCALE_TENSOR.search(name):
                    continue
                start, end = header[name]["data_offsets"]
                weights.seek(8 + header_size + start)
                scales.append((name, weights.read(end - start)))
            return scales
    except (OSError, ValueError, KeyError, struct.error):
        return []


def worker_pool_layout(server_args: Any, host_pool: Any) -> PoolLayout:
    """The layout of a worker's pages, from SGLang's server arguments and its host KV pool (read by attribute)."""
    model_path = str(server_args.model_path)
    device_pool = getattr(host_pool, "device_pool", None)
    return PoolLayout(
        model=model_fingerprint(model_path),
        kv_dtype=str(getattr(host_pool, "dtype", None)),
        page_size=int(getattr(host_pool, "page_size", 0)),
        layout=str(getattr(host_pool, "layout", None)),
        kv_shape=tuple(int(getattr(host_pool, name)) for name in _KV_SHAPE_ATTRS if hasattr(host_pool, name)),
        # The FP8 variant: the host pool keeps every FP8 format as uint8.
        kv_cache_dtype=f"{getattr(server_args, 'kv_cache_dtype', 'auto')}/{getattr(device_pool, 'dtype', None)}",
        kv_scales=kv_scales_digest(model_path, getattr(server_args, "quantization_param_path", None)),
        revision=model_revision(model_path, getattr(server_args, "revision", None)),
    )


def namespaced_model_name(served_name: str | None, layout: PoolLayout) -> str:
    digest = hashlib.sha256(json.dumps(asdict(layout), sort_keys=True).encode()).hexdigest()[:12]
    return f"{served_name}-sg{digest}" if served_name else f"sg{digest}"

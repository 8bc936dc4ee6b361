"""The namespace of a worker's pages in the shared KV pool: model, KV dtype, page size, layout and KV shape.

SGLang keys a pool page by the hash of its tokens and suffixes the key with the *served model name* (the file
backend's `_{model}_{tp_rank}_{tp_size}`, Mooncake's key prefix). Two workers that serve under one name but keep
their KV differently (another dtype, another host layout, another page size, another model with the same name)
would read each other's bytes as their own: a wrong answer, not a miss. The extension therefore replaces the
model name SGLang hands every storage backend with `<served name>-sg<digest>`, the digest covering everything
that decides a page's bytes (`PoolLayout`), so such workers share nothing and each other's pages are misses.
Workers that agree on all of it (the point of a shared pool) keep sharing.

Known limit: two different checkpoints with the same config and the same served name (two fine-tunes of one base)
look alike here; give them different `--served-model-name`s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["PoolLayout", "model_fingerprint", "namespaced_model_name"]


@dataclass(frozen=True)
class PoolLayout:
    """What decides the bytes of one page in the pool."""

    model: str
    """The model's identity: its config (architecture, sizes, rope, ...), or its path when there is none."""
    kv_dtype: str
    page_size: int
    layout: str
    """The host pool's memory layout (`layer_first`, `page_first`, `page_first_direct`, ...)."""
    kv_shape: tuple[int, ...]
    """Layers, KV heads and head dim (or what the pool has instead), and the bytes per token."""


def model_fingerprint(model_path: str) -> str:
    """The model's config as canonical JSON when `model_path` is a local directory with one, else the path."""
    config = Path(model_path) / "config.json"
    try:
        return json.dumps(json.loads(config.read_text()), sort_keys=True)
    except (OSError, ValueError):
        return model_path


def namespaced_model_name(served_name: str | None, layout: PoolLayout) -> str:
    digest = hashlib.sha256(json.dumps(asdict(layout), sort_keys=True).encode()).hexdigest()[:12]
    return f"{served_name}-sg{digest}" if served_name else f"sg{digest}"

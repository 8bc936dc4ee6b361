"""Pool keys for every KV dtype, KV scales and model revision (in-process: SGLang's own pool classes, no server).

SGLang cannot start a CPU worker with FP8 KV ("ValueError: CPU FP8 KV cache requires Intel AMX support.",
`mem_cache/kv_cache_configurator.py`), so the FP8 case is checked here with SGLang 0.5.23's device KV pool built
in FP8 on CPU (whose host copy SGLang keeps as `torch.uint8` for every FP8 format) and its `file` pool backend;
the float32/bfloat16 case runs on real workers in test_pool_namespace_engine.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sessiongate.sglang_ext.pool_namespace import (
    PoolLayout,
    kv_scales_digest,
    model_revision,
    namespaced_model_name,
    worker_pool_layout,
)

PAGE_TOKENS = 64


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file by hand: an 8-byte header size, the JSON header, then the tensors' bytes."""
    header: dict[str, Any] = {}
    data = b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def make_model(directory: Path, weight: bytes, k_scale: float | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    tensors = {"model.embed_tokens.weight": ("F32", [len(weight) // 4], weight)}
    if k_scale is not None:
        tensors["model.layers.0.self_attn.k_scale"] = ("F32", [], struct.pack("<f", k_scale))
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


def fp8_worker(model: Path, kv_cache_dtype: str) -> tuple[Any, Any]:
    """SGLang's server arguments and host pool as the namespace hook sees them, over SGLang's real device pool."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    dtype = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kv_cache_dtype]
    device_pool = MHATokenToKVPool(
        size=4 * PAGE_TOKENS,
        page_size=PAGE_TOKENS,
        dtype=dtype,
        head_num=2,
        head_dim=32,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )
    # What `MHATokenToKVPoolHost.__init__` keeps of it (`pool_host/mha.py`: `self.dtype = device_pool.store_dtype`).
    host_pool = SimpleNamespace(
        dtype=device_pool.store_dtype,
        device_pool=device_pool,
        page_size=PAGE_TOKENS,
        layout="page_first_direct",
        layer_num=2,
        head_num=2,
        head_dim=32,
        size_per_token=2 * 2 * 32 * 2,
    )
    server_args = SimpleNamespace(
        model_path=str(model), kv_cache_dtype=kv_cache_dtype, quantization_param_path=None, revision=None
    )
    return server_args, host_pool


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_model(tmp_path / "model", b"\x01" * 4096)


def test_two_fp8_variants_never_read_each_others_pages(cpu_compat: bool, model: Path, tmp_path: Path) -> None:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from sessiongate.sglang_ext.internals.storage_config import single_rank_storage_config

    e4m3_args, e4m3_host = fp8_worker(model, "fp8_e4m3")
    e5m2_args, e5m2_host = fp8_worker(model, "fp8_e5m2")
    assert e4m3_host.dtype == e5m2_host.dtype == torch.uint8  # the hole: the host pool's dtype alone keys them alike
    e4m3 = worker_pool_layout(e4m3_args, e4m3_host)
    e5m2 = worker_pool_layout(e5m2_args, e5m2_host)
    assert e4m3.kv_dtype == e5m2.kv_dtype
    old_fields = ("model", "kv_dtype", "page_size", "layout", "kv_shape")
    assert [getattr(e4m3, f) for f in old_fields] == [getattr(e5m2, f) for f in old_fields]
    names = namespaced_model_name("m", e4m3), namespaced_model_name("m", e5m2)
    assert names[0] != names[1]
    assert names[0] == namespaced_model_name("m", worker_pool_layout(*fp8_worker(model, "fp8_e4m3")))  # sharing

    # One pool directory, SGLang's own file backend under each worker's name: a page one writes is a miss for the
    # other, never bytes read as its own.
    pool = tmp_path / "pool"
    writer, reader = (HiCacheFile(single_rank_storage_config(name, {"file_storage_path": str(pool)})) for name in names)
    page = torch.arange(PAGE_TOKENS * 256, dtype=torch.uint8)
    assert writer.set("page-hash-1", page)
    assert writer.exists("page-hash-1")
    assert not reader.exists("page-hash-1")
    assert reader.batch_exists(["page-hash-1"]) == 0
    assert reader.get("page-hash-1", torch.zeros_like(page)) is None
    assert torch.equal(writer.get("page-hash-1", torch.zeros_like(page)), page)


def test_kv_scales_key_the_pool(tmp_path: Path) -> None:
    plain = make_model(tmp_path / "plain", b"\x01" * 64)
    scaled = make_model(tmp_path / "scaled", b"\x01" * 64, k_scale=0.5)
    rescaled = make_model(tmp_path / "rescaled", b"\x01" * 64, k_scale=0.25)
    assert kv_scales_digest(str(plain)) == ""  # no scales: FP8 KV stored with scale 1
    assert kv_scales_digest(str(scaled)) not in ("", kv_scales_digest(str(rescaled)))
    params = tmp_path / "kv_scales.json"
    params.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.5}}}}')
    assert kv_scales_digest(str(plain), str(params)) != ""
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({**config, "quantization_config": {"kv_cache_scheme": "fp8"}}))
    assert kv_scales_digest(str(plain)) != ""


def test_the_model_revision_keys_the_pool(tmp_path: Path) -> None:
    # Same config, other weights (two fine-tunes of one base): other KV for the same tokens.
    base = make_model(tmp_path / "base", bytes(range(256)) * 1024)
    tuned = make_model(tmp_path / "tuned", bytes(reversed(range(256))) * 1024)
    copy = make_model(tmp_path / "copy", bytes(range(256)) * 1024)
    assert model_revision(str(base)) == model_revision(str(copy))  # the same weights elsewhere share
    assert model_revision(str(base)) != model_revision(str(tuned))
    assert model_revision("org/model", "abc123") != model_revision("org/model", "def456")
    layouts = [
        PoolLayout(model="{}", kv_dtype="torch.bfloat16", page_size=64, layout="layer_first", kv_shape=(2,), revision=r)
        for r in (model_revision(str(base)), model_revision(str(tuned)))
    ]
    assert namespaced_model_name("m", layouts[0]) != namespaced_model_name("m", layouts[1])

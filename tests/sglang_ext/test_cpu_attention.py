"""The CPU layer's extend attention against SGLang's own torch_native `_run_sdpa_forward_extend`."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from sessiongate.sglang_ext.cpu_compat.kernels import extend_attention
from sessiongate.sglang_ext.internals import patches


@pytest.fixture(scope="module")
def backend_module(cpu_compat: bool) -> ModuleType:
    return importlib.import_module(patches.TORCH_NATIVE_BACKEND_MODULE)


@dataclass(frozen=True)
class Batch:
    query: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    prefix_lens: torch.Tensor
    extend_lens: torch.Tensor

    def args(self, output: torch.Tensor) -> tuple[Any, ...]:
        return (
            self.query,
            output,
            self.k_cache,
            self.v_cache,
            self.req_to_token,
            self.req_pool_indices,
            self.seq_lens,
            self.prefix_lens,
            self.extend_lens,
        )


def make_batch(prefix_and_extend: list[tuple[int, int]], heads: int = 4, kv_heads: int = 2, dim: int = 16) -> Batch:
    """Sequences with cached prefixes of mixed lengths, their KV scattered over a shuffled pool."""
    generator = torch.Generator().manual_seed(7)
    pool_size, max_len = 512, 96
    k_cache = torch.randn(pool_size, kv_heads, dim, generator=generator)
    v_cache = torch.randn(pool_size, kv_heads, dim, generator=generator)
    slots = torch.randperm(pool_size, generator=generator)
    req_to_token = torch.zeros(8, max_len, dtype=torch.int64)
    req_pool_indices = torch.tensor([5, 1, 7, 2, 0, 3][: len(prefix_and_extend)])
    taken = 0
    for req, (prefix, extend) in zip(req_pool_indices.tolist(), prefix_and_extend, strict=True):
        req_to_token[req, : prefix + extend] = slots[taken : taken + prefix + extend]
        taken += prefix + extend
    total_new = sum(extend for _, extend in prefix_and_extend)
    return Batch(
        query=torch.randn(total_new, heads, dim, generator=generator),
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=torch.tensor([p + e for p, e in prefix_and_extend]),
        prefix_lens=torch.tensor([p for p, _ in prefix_and_extend]),
        extend_lens=torch.tensor([e for _, e in prefix_and_extend]),
    )


MIXED = [(0, 9), (23, 4), (40, 1), (7, 30), (64, 17)]


@pytest.mark.parametrize(
    "options",
    [
        {"causal": True, "enable_gqa": True},
        {"causal": True, "enable_gqa": True, "sliding_window_size": 6},
        {"causal": False, "enable_gqa": True},
        {"causal": True, "enable_gqa": True, "scaling": 0.3},
    ],
    ids=["causal", "sliding-window", "bidirectional", "scaled"],
)
def test_extend_attention_matches_sglang(backend_module: ModuleType, options: dict[str, Any]) -> None:
    backend_class = backend_module.TorchNativeAttnBackend
    method = backend_class._run_sdpa_forward_extend
    # If the patch is in place in this process, compare against what it wrapped.
    original = getattr(method, "__wrapped__", method)
    batch = make_batch(MIXED)
    expected = torch.zeros_like(batch.query)
    original(object.__new__(backend_class), *batch.args(expected), **options)
    actual = torch.full_like(batch.query, float("nan"))
    extend_attention(*batch.args(actual), **options)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_extend_attention_plain_prefill_uses_no_mask(backend_module: ModuleType) -> None:
    """A batch with no cached prefix (the cold case) gives the same result through SDPA's is_causal."""
    batch = make_batch([(0, 12), (0, 5)])
    backend_class = backend_module.TorchNativeAttnBackend
    original = getattr(backend_class._run_sdpa_forward_extend, "__wrapped__", backend_class._run_sdpa_forward_extend)
    expected = torch.zeros_like(batch.query)
    original(object.__new__(backend_class), *batch.args(expected), causal=True, enable_gqa=True)
    actual = extend_attention(*batch.args(torch.empty_like(batch.query)), causal=True, enable_gqa=True)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_patch_replaces_the_method_and_keeps_the_original(backend_module: ModuleType) -> None:
    original = getattr(
        backend_module.TorchNativeAttnBackend._run_sdpa_forward_extend,
        "__wrapped__",
        backend_module.TorchNativeAttnBackend._run_sdpa_forward_extend,
    )
    stand_in = SimpleNamespace(
        __name__=patches.TORCH_NATIVE_BACKEND_MODULE,
        TorchNativeAttnBackend=type("TorchNativeAttnBackend", (), {"_run_sdpa_forward_extend": original}),
    )
    (patch,) = patches.cpu_patches()[patches.TORCH_NATIVE_BACKEND_MODULE]
    patch(stand_in)  # type: ignore[arg-type]
    patched = stand_in.TorchNativeAttnBackend._run_sdpa_forward_extend
    assert patched is not original
    assert patched.__wrapped__ is original
    batch = make_batch(MIXED)
    expected = extend_attention(*batch.args(torch.empty_like(batch.query)), causal=True, enable_gqa=True)
    actual = patched(None, *batch.args(torch.empty_like(batch.query)), causal=True, enable_gqa=True)
    torch.testing.assert_close(actual, expected)


def test_disabled_patch_groups_are_left_out() -> None:
    table = patches.cpu_patches(disabled={"attention"})
    assert patches.TORCH_NATIVE_BACKEND_MODULE not in table
    assert patches.HOST_POOL_MHA_MODULE in table
    with pytest.raises(ValueError, match="unknown CPU patch group"):
        patches.cpu_patches(disabled={"atention"})

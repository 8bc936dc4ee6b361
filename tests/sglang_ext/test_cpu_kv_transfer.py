"""The CPU layer's HiCache "direct" transfers equal plain index copies between the pool layouts."""

from __future__ import annotations

import pytest
import torch

from sessiongate.sglang_ext.cpu_compat.kernels import (
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_direct,
    transfer_kv_per_layer_direct_pf_lf,
)

LAYERS, HEADS, DIM, PAGE = 3, 2, 8, 4
DEVICE_TOKENS, HOST_PAGES = 64, 12


def page_run(pages: list[int]) -> torch.Tensor:
    """Token indices of whole pages, in the given page order."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(3)


def test_transfer_kv_direct_is_an_index_copy(generator: torch.Generator) -> None:
    src = [torch.randn(DEVICE_TOKENS, HEADS, DIM, generator=generator) for _ in range(2 * LAYERS)]
    dst = [torch.zeros(DEVICE_TOKENS, HEADS, DIM) for _ in range(2 * LAYERS)]
    src_indices, dst_indices = page_run([3, 0, 9]), page_run([1, 14, 6])
    transfer_kv_direct(src, dst, src_indices, dst_indices, page_size=PAGE)
    for source, target in zip(src, dst, strict=True):
        expected = torch.zeros_like(target)
        expected[dst_indices] = source[src_indices]
        torch.testing.assert_close(target, expected, rtol=0, atol=0)


def test_device_to_host_page_first_all_layers(generator: torch.Generator) -> None:
    k_layers = [torch.randn(DEVICE_TOKENS, HEADS, DIM, generator=generator) for _ in range(LAYERS)]
    v_layers = [torch.randn(DEVICE_TOKENS, HEADS, DIM, generator=generator) for _ in range(LAYERS)]
    host_k = torch.zeros(HOST_PAGES, LAYERS, PAGE, HEADS, DIM)
    host_v = torch.zeros_like(host_k)
    device_indices = torch.tensor([5, 6, 7, 8, 40, 41, 42, 43, 12, 13, 14, 15])  # any slots
    host_pages = [7, 2, 10]
    transfer_kv_all_layer_direct_lf_pf(
        k_layers + v_layers, [host_k, host_v], device_indices, page_run(host_pages), page_size=PAGE
    )
    for layer in range(LAYERS):
        for run, page in enumerate(host_pages):
            rows = device_indices[run * PAGE : (run + 1) * PAGE]
            torch.testing.assert_close(host_k[page, layer], k_layers[layer][rows], rtol=0, atol=0)
            torch.testing.assert_close(host_v[page, layer], v_layers[layer][rows], rtol=0, atol=0)
    untouched = [p for p in range(HOST_PAGES) if p not in host_pages]
    assert not host_k[untouched].any()
    assert not host_v[untouched].any()


def test_host_page_first_to_device_one_layer(generator: torch.Generator) -> None:
    host_k = torch.randn(HOST_PAGES, LAYERS, PAGE, HEADS, DIM, generator=generator)
    host_v = torch.randn(HOST_PAGES, LAYERS, PAGE, HEADS, DIM, generator=generator)
    device_k = torch.zeros(DEVICE_TOKENS, HEADS, DIM)
    device_v = torch.zeros_like(device_k)
    host_pages, layer = [4, 11], 1
    device_indices = torch.tensor([30, 31, 32, 33, 0, 1, 2, 3])
    transfer_kv_per_layer_direct_pf_lf(
        [host_k, host_v], [device_k, device_v], page_run(host_pages), device_indices, layer_id=layer, page_size=PAGE
    )
    for run, page in enumerate(host_pages):
        rows = device_indices[run * PAGE : (run + 1) * PAGE]
        torch.testing.assert_close(device_k[rows], host_k[page, layer], rtol=0, atol=0)
        torch.testing.assert_close(device_v[rows], host_v[page, layer], rtol=0, atol=0)
    assert int((device_k != 0).any(dim=(1, 2)).sum()) == len(device_indices)


def test_round_trip_device_host_device(generator: torch.Generator) -> None:
    """What HiCache does: back a prefix up to the host, evict it, load it back elsewhere."""
    k_layers = [torch.randn(DEVICE_TOKENS, HEADS, DIM, generator=generator) for _ in range(LAYERS)]
    v_layers = [torch.randn(DEVICE_TOKENS, HEADS, DIM, generator=generator) for _ in range(LAYERS)]
    host_k = torch.zeros(HOST_PAGES, LAYERS, PAGE, HEADS, DIM)
    host_v = torch.zeros_like(host_k)
    original, host, restored = page_run([2, 5]), page_run([9, 0]), page_run([13, 7])
    transfer_kv_all_layer_direct_lf_pf(k_layers + v_layers, [host_k, host_v], original, host, page_size=PAGE)
    for layer in range(LAYERS):
        transfer_kv_per_layer_direct_pf_lf(
            [host_k, host_v], [k_layers[layer], v_layers[layer]], host, restored, layer_id=layer, page_size=PAGE
        )
        torch.testing.assert_close(k_layers[layer][restored], k_layers[layer][original], rtol=0, atol=0)
        torch.testing.assert_close(v_layers[layer][restored], v_layers[layer][original], rtol=0, atol=0)


def test_partial_pages_are_refused() -> None:
    with pytest.raises(ValueError, match="whole number"):
        transfer_kv_all_layer_direct_lf_pf(
            [torch.zeros(8, 1, 1)] * 2, [torch.zeros(2, 1, PAGE, 1, 1)] * 2, torch.arange(3), torch.arange(3), PAGE
        )

"""Pure-torch stand-ins for the CUDA kernels SGLang's CPU path lacks or does inefficiently.

Nothing here knows SGLang: these are plain functions over tensors, with the signatures of the
kernels they replace, so that `sglang_ext.internals.patches` can bind them in place of the
originals and tests can compare them against reference index copies.

- `extend_attention`: the extend (prefill) attention of the `torch_native` backend. SGLang's
  version builds a full-length query over the whole sequence (cached prefix included) and runs
  causal attention over all L x L positions, then keeps the new rows. This one computes only the
  new query rows against the full KV, with the causal mask aligned to the bottom right (query
  row i sits at absolute position prefix + i), so a prefix-cache hit skips the prefix's attention.
- `transfer_kv_direct`, `transfer_kv_per_layer_direct_pf_lf`, `transfer_kv_all_layer_direct_lf_pf`:
  the HiCache "direct" io-backend copies between the device pool's per-layer buffers (token-major,
  `[tokens, heads, dim]`) and the host pool's layouts (layer-first `[tokens, heads, dim]` per layer,
  or page-first-direct `[pages, layers, page_size, heads, dim]`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.functional import scaled_dot_product_attention

__all__ = [
    "extend_attention",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
]


def _causal_mask(
    *, q_len: int, kv_len: int, query_offset: int, sliding_window_size: int | None, device: torch.device
) -> torch.Tensor:
    """Boolean mask [q_len, kv_len]: True where query row i (at position query_offset + i) may attend."""
    q_pos = torch.arange(query_offset, query_offset + q_len, device=device).unsqueeze(1)
    k_pos = torch.arange(kv_len, device=device).unsqueeze(0)
    allowed = k_pos <= q_pos
    if sliding_window_size is not None and sliding_window_size > -1:
        allowed &= k_pos >= q_pos - sliding_window_size
    return allowed


def extend_attention(
    query: torch.Tensor,
    output: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    encoder_lens: torch.Tensor | None = None,
    scaling: float | None = None,
    enable_gqa: bool = False,
    causal: bool = False,
    is_cross_attn: bool = False,
    sliding_window_size: int | None = None,
) -> torch.Tensor:
    """Extend attention over a batch of sequences; writes and returns `output`.

    Shapes as in SGLang's `TorchNativeAttnBackend._run_sdpa_forward_extend`: `query` and `output`
    are `[num_new_tokens, num_heads, head_dim]` (the batch's new tokens, concatenated), `k_cache` and
    `v_cache` are `[pool_tokens, num_kv_heads, head_dim]`, `req_to_token[req, pos]` is the pool
    slot of a sequence's token. Each sequence's new rows attend to its whole KV (prefix + new).
    """
    if not seq_lens.shape[0] == extend_prefix_lens.shape[0] == extend_seq_lens.shape[0]:
        raise ValueError("seq_lens, extend_prefix_lens and extend_seq_lens must have one entry per sequence")
    # [tokens, heads, dim] -> [heads, tokens, dim], the layout scaled_dot_product_attention expects.
    heads_first = query.movedim(0, query.dim() - 2)
    # One host sync for all the per-sequence lengths instead of one per .item().
    q_lens = extend_seq_lens.tolist()
    prefix_lens = extend_prefix_lens.tolist()
    kv_lens = seq_lens.tolist()
    enc_lens = encoder_lens.tolist() if encoder_lens is not None else None
    start_q = 0
    for seq, (q_len, prefix_len, kv_len) in enumerate(zip(q_lens, prefix_lens, kv_lens, strict=True)):
        end_q = start_q + q_len
        if q_len == 0:
            continue
        if enc_lens is None:
            start_kv, end_kv = 0, kv_len
        elif is_cross_attn:
            start_kv, end_kv = 0, enc_lens[seq]
        else:
            start_kv, end_kv = enc_lens[seq], enc_lens[seq] + kv_len
        tokens = req_to_token[req_pool_indices[seq], start_kv:end_kv]
        key = k_cache[tokens].movedim(0, query.dim() - 2)
        value = v_cache[tokens].movedim(0, query.dim() - 2)
        seq_query = heads_first[:, start_q:end_q, :]
        if not (seq_query.dtype == key.dtype == value.dtype):
            key = key.to(seq_query.dtype)
            value = value.to(seq_query.dtype)

        attn_mask: torch.Tensor | None = None
        is_causal = False
        windowed = sliding_window_size is not None and sliding_window_size > -1
        if causal and not windowed and prefix_len == 0 and q_len == end_kv - start_kv:
            # A cold prefill: the square causal case, which SDPA handles without a mask.
            is_causal = True
        elif causal or windowed:
            # As in SGLang, a sliding window implies causality.
            attn_mask = _causal_mask(
                q_len=q_len,
                kv_len=end_kv - start_kv,
                query_offset=prefix_len,
                sliding_window_size=sliding_window_size,
                device=seq_query.device,
            )
        seq_out = scaled_dot_product_attention(
            seq_query.unsqueeze(0),
            key.unsqueeze(0),
            value.unsqueeze(0),
            attn_mask=attn_mask,
            is_causal=is_causal,
            scale=scaling,
            enable_gqa=enable_gqa,
        )
        output[start_q:end_q, :, :] = seq_out.squeeze(0).movedim(query.dim() - 2, 0)
        start_q = end_q
    return output


def _as_index(indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    return indices.to(device=device, dtype=torch.int64)


def transfer_kv_direct(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """`dst_layers[i][dst_indices] = src_layers[i][src_indices]` for each pair of token-major buffers.

    `page_size` is accepted for signature compatibility: the CUDA kernel uses it to copy whole
    pages at once, an index copy needs no such hint.
    """
    del page_size
    for src, dst in zip(src_layers, dst_layers, strict=True):
        rows = src.index_select(0, _as_index(src_indices, src.device))
        dst.index_copy_(0, _as_index(dst_indices, dst.device), rows.to(dst.device))


def _page_numbers(indices: torch.Tensor, page_size: int) -> torch.Tensor:
    """The page of each page-sized run of token indices (runs are whole, aligned pages)."""
    if indices.numel() % page_size:
        raise ValueError(f"{indices.numel()} token indices are not a whole number of {page_size}-token pages")
    return _as_index(indices[::page_size], indices.device) // page_size


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """Host page-first-direct -> device layer-first, one layer.

    `src_ptrs[j]` is a host buffer `[pages, layers, page_size, ...]` and `dst_ptrs[j]` the device
    buffer `[tokens, ...]` of that layer; token run `src_indices[k*page_size:(k+1)*page_size]` is
    one host page, copied to the device slots `dst_indices[k*page_size:(k+1)*page_size]`.
    """
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        pages = _page_numbers(src_indices, page_size).to(src.device)
        rows = src[pages, layer_id]
        dst.index_copy_(0, _as_index(dst_indices, dst.device), rows.reshape(-1, *dst.shape[1:]).to(dst.device))


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Device layer-first -> host page-first-direct, all layers.

    `src_ptrs` holds the device buffers of every layer for each destination in turn (K layers then
    V layers for MHA: `len(src_ptrs) == layers * len(dst_ptrs)`); `dst_ptrs[j]` is a host buffer
    `[pages, layers, page_size, ...]`.
    """
    if not dst_ptrs or len(src_ptrs) % len(dst_ptrs):
        raise ValueError(f"{len(src_ptrs)} source layers do not split evenly over {len(dst_ptrs)} buffers")
    num_layers = len(src_ptrs) // len(dst_ptrs)
    for j, dst in enumerate(dst_ptrs):
        pages = _page_numbers(dst_indices, page_size).to(dst.device)
        for layer in range(num_layers):
            src = src_ptrs[j * num_layers + layer]
            rows = src.index_select(0, _as_index(src_indices, src.device))
            dst[pages, layer] = rows.reshape(pages.numel(), page_size, *rows.shape[1:]).to(dst.device)

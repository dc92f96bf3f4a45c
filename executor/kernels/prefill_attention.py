"""Flash-style attention of packed new tokens over a paged context, in Triton; same contract as
reference.paged_prefill_attention. One kernel serves prompts (empty context before the new
tokens), prefill chunks, prefix-cache hits and recompute: all K/V, the new tokens' too, are read
from the cache.

Grid: (sequence, query head, query tile of BLOCK_M rows). A tile walks the context in BLOCK_N
token steps up to its last query's position (causal), from its first query's window start when
there is a sliding window (blocks before it are never read), gathering each token's physical block from
the block table, with an online softmax in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from executor.kernels.paged_attention import (first_visible, load_kv_tile, load_query_rows, online_softmax_step,
                                              soft_cap_log2)

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, context_lens_ptr,
    out_ptr, scale_log2, window, softcap,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    q_tile = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_len = (tl.load(query_start_loc_ptr + seq + 1) - q_start).to(tl.int32)
    tile_lo = q_tile * BLOCK_M
    if tile_lo >= q_len:  # the grid is sized for the longest sequence
        return
    ctx = tl.load(context_lens_ptr + seq).to(tl.int32)
    kv_head = head // GROUP

    rows = tile_lo + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    q_pos = ctx - q_len + rows  # each query's position in its sequence
    dims = tl.arange(0, D_PAD)
    dim_mask = dims < HEAD_DIM
    tok_rows = q_start + rows
    q = load_query_rows(q_ptr, tok_rows * stride_qt + head * stride_qh, row_mask, dims, dim_mask, UPCAST)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    # Causal: nothing past the tile's last query position is visible to any of its rows.
    kv_end = tl.minimum(ctx, ctx - q_len + tile_lo + BLOCK_M)
    table_row = block_tables_ptr + seq * stride_bt
    # Sliding window: nothing before the first row's window is visible to any row of the tile.
    kv_start = first_visible(ctx - q_len + tile_lo, window)
    for t0 in range(kv_start, kv_end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < kv_end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, toks, tok_mask, dims, dim_mask, kv_head,
                            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, BLOCK_SIZE, UPCAST)

        s = soft_cap_log2(tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2, softcap)
        visible = tok_mask[None, :] & (toks[None, :] <= q_pos[:, None])
        if window > 0:
            visible = visible & (toks[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))  # before the max, so padding never wins it
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a row that saw nothing gives zeros
    tl.store(out_ptr + tok_rows[:, None] * stride_ot + head * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def paged_prefill_attention_tiled(query, key_cache, value_cache, block_tables, query_start_loc,
                                  context_lens, scale: float, block_m: int = 64, block_n: int = 64,
                                  sliding_window: int | None = None, softcap: float | None = None):
    """The prefill kernel with explicit tile sizes (powers of two, >= 16)."""
    query = query if query.stride(-1) == 1 else query.contiguous()
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    block_tables = block_tables.contiguous()
    query_start_loc = query_start_loc.contiguous()
    context_lens = context_lens.contiguous()
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = context_lens.shape[0]
    _, block_size, num_kv_heads, _ = key_cache.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    out = torch.empty_like(query)
    if num_tokens == 0 or num_seqs == 0:
        return out
    # One host sync for the longest query run: it sizes the grid's tile axis.
    max_q_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    grid = (num_seqs, num_heads, triton.cdiv(max_q_len, block_m))
    _prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, query_start_loc, context_lens, out,
        scale * LOG2E, int(sliding_window or 0), float(softcap or 0.0),
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=not query.is_cuda,
    )
    return out


def paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc,
                            context_lens, scale: float, sliding_window: int | None = None,
                            softcap: float | None = None):
    """Same contract as reference.paged_prefill_attention."""
    return paged_prefill_attention_tiled(query, key_cache, value_cache, block_tables, query_start_loc,
                                         context_lens, scale, sliding_window=sliding_window, softcap=softcap)

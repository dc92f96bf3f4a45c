"""Paged-attention decode in Triton (one new token per sequence), same contract as
reference.paged_attention_decode.

One program per (sequence, KV head, partition) serves all `group` query heads that share the KV
head, so each K/V tile is read once for the whole group (what makes GQA decode cheap). The query
heads are the rows of a [GROUP_PAD, D_PAD] tile (padded to >= 16 rows for tl.dot). K/V are walked
in tiles of TILE_N tokens; each token finds its physical block through the block table, so block
sizes below the tile (8) and above it (128) use the same code.

A sliding window (sliding_window=W > 0; 0 = full attention) starts the walk at the first position
the query sees, ctx - W: blocks wholly before it are never read (not even their block-table
entries, so a freed entry may hold NULL_BLOCK), and the partially covered block is masked by
position.

Long contexts can be split into partitions of PARTITION_TOKENS tokens (flash-decoding): each
partition writes its unnormalised output, running max and sum, and a reduce kernel merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)  # what a jit function may read
PARTITION_TOKENS = 512
# Split only when the plain grid leaves the GPU's SMs idle (an H100/H200 has 132 SMs).
SPLIT_BELOW_PROGRAMS = 256


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, toks, tok_mask, dims, dim_mask, kv_head,
                 stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                 BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr):
    """K and V [len(toks), D_PAD] of one KV head at token positions toks of one sequence: each
    token finds its physical block through the block table row (offsets in int64). Masked
    tokens and padded dims read 0. Shared by the decode and prefill kernels."""
    block = tl.load(table_row + toks // BLOCK_SIZE, mask=tok_mask, other=0).to(tl.int64)
    slot_in_block = (toks % BLOCK_SIZE).to(tl.int64)
    kv_mask = tok_mask[:, None] & dim_mask[None, :]
    k_off = block * stride_kb + slot_in_block * stride_kt + kv_head * stride_kh
    k = tl.load(k_cache_ptr + k_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    v_off = block * stride_vb + slot_in_block * stride_vt + kv_head * stride_vh
    v = tl.load(v_cache_ptr + v_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    if UPCAST:  # the interpreter's bf16 tl.dot is wrong: compute in fp32 there
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def load_query_rows(q_ptr, row_offsets, row_mask, dims, dim_mask, UPCAST: tl.constexpr):
    """The query tile [len(row_offsets), D_PAD]: row i starts at q_ptr + row_offsets[i]; masked
    rows and padded dims read 0. Shared by the decode and prefill kernels."""
    q = tl.load(q_ptr + row_offsets[:, None] + dims[None, :], mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    if UPCAST:  # the interpreter's bf16 tl.dot is wrong: compute in fp32 there
        q = q.to(tl.float32)
    return q


@triton.jit
def first_visible(query_pos, window):
    """The first key position a query at query_pos sees: 0, or within a window of `window`
    tokens (its own included) when window > 0. Shared by the decode and prefill kernels."""
    lo = query_pos * 0
    if window > 0:
        lo = tl.maximum(query_pos - window + 1, 0)
    return lo


@triton.jit
def soft_cap_log2(s, softcap):
    """Gemma 2's soft-capping, c * tanh(x / c), of scores s in log2 units (x = s / LOG2E);
    softcap 0 = none. tanh as 2 sigmoid(2y) - 1, which the interpreter has too."""
    if softcap > 0:
        y = s / (LOG2E_C * softcap)
        s = (2.0 * tl.sigmoid(2.0 * y) - 1.0) * (softcap * LOG2E_C)
    return s


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc):
    """One K/V tile of the online softmax: s are the rows' masked scores against the tile (log2
    units, -inf where not visible), v the tile's values; returns the new running max, sum and
    unnormalised output. Shared by the decode and prefill kernels."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoid -inf - -inf = nan
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
    part_acc_ptr, part_max_ptr, part_sum_ptr,  # used only when PARTITION_TOKENS > 0
    scale_log2, window, softcap,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_os, stride_oh,
    num_heads, num_partitions,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    PARTITION_TOKENS: tl.constexpr, UPCAST: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq).to(tl.int32)
    lo = first_visible(ctx - 1, window)
    if PARTITION_TOKENS > 0:
        start = tl.maximum(part * PARTITION_TOKENS, lo)
        end = tl.minimum(part * PARTITION_TOKENS + PARTITION_TOKENS, ctx)
        if start >= end:  # the reduce ignores partitions past the context or before the window
            return
    else:
        start = lo
        end = ctx

    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, D_PAD)
    dim_mask = dims < HEAD_DIM
    q = load_query_rows(q_ptr, seq * stride_qs + heads * stride_qh, row_mask, dims, dim_mask, UPCAST)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    table_row = block_tables_ptr + seq * stride_bt
    for t0 in range(start, end, TILE_N):
        toks = t0 + tl.arange(0, TILE_N)
        tok_mask = toks < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, toks, tok_mask, dims, dim_mask, kv_head,
                            stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, BLOCK_SIZE, UPCAST)

        # Scores in log2 units; masked before the max so padding never wins it.
        s = soft_cap_log2(tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2, softcap)
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc)

    out_mask = row_mask[:, None] & dim_mask[None, :]
    if PARTITION_TOKENS > 0:
        base = (seq * num_heads + heads) * num_partitions + part
        tl.store(part_max_ptr + base, m_i, mask=row_mask)
        tl.store(part_sum_ptr + base, l_i, mask=row_mask)
        tl.store(part_acc_ptr + base[:, None] * HEAD_DIM + dims[None, :], acc, mask=out_mask)
    else:
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # a row that saw no token returns zeros
        out = acc / l_safe[:, None]
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr, part_max_ptr, part_sum_ptr, context_lens_ptr, out_ptr,
    stride_os, stride_oh, num_heads, num_partitions, window,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, NP_PAD: tl.constexpr,
    PARTITION_TOKENS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    ctx = tl.load(context_lens_ptr + seq).to(tl.int32)
    used = (ctx + PARTITION_TOKENS - 1) // PARTITION_TOKENS
    first = first_visible(ctx - 1, window) // PARTITION_TOKENS
    parts = tl.arange(0, NP_PAD)
    part_mask = (parts >= first) & (parts < used)
    dims = tl.arange(0, D_PAD)
    dim_mask = dims < HEAD_DIM

    base = (seq * num_heads + head) * num_partitions + parts
    m = tl.load(part_max_ptr + base, mask=part_mask, other=float("-inf"))
    l = tl.load(part_sum_ptr + base, mask=part_mask, other=0.0)
    m_all = tl.max(m, axis=0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_safe)  # 0 for unused partitions
    total = tl.sum(w * l, axis=0)
    acc = tl.load(part_acc_ptr + base[:, None] * HEAD_DIM + dims[None, :],
                  mask=part_mask[:, None] & dim_mask[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def paged_attention_decode_partitioned(query, key_cache, value_cache, block_tables, context_lens,
                                       scale: float, partition_tokens: int | None, sliding_window: int | None = None,
                                       softcap: float | None = None):
    """The decode kernel with an explicit split: partition_tokens=None runs one pass per
    sequence, an int splits contexts into partitions of that many tokens (a multiple of the
    tile, itself max(32, block_size))."""
    query, key_cache, value_cache = map(_last_dim_contiguous, (query, key_cache, value_cache))
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    group = num_heads // num_kv_heads
    tile_n = max(32, block_size)
    out = torch.empty_like(query)
    if num_seqs == 0:
        return out

    meta = dict(
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size, TILE_N=tile_n, UPCAST=not query.is_cuda,
    )
    strides = (
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
    )
    scale_log2 = scale * LOG2E
    window, cap = int(sliding_window or 0), float(softcap or 0.0)
    if partition_tokens is None:
        _decode_kernel[(num_seqs, num_kv_heads, 1)](
            query, key_cache, value_cache, block_tables, context_lens, out,
            out, out, out, scale_log2, window, cap, *strides, num_heads, 1,
            PARTITION_TOKENS=0, **meta)
        return out

    assert partition_tokens % tile_n == 0, f"partition_tokens must be a multiple of {tile_n}"
    # An upper bound on the context from the table's width: no device sync for the max length.
    num_partitions = triton.cdiv(block_tables.shape[1] * block_size, partition_tokens)
    ws = dict(device=query.device, dtype=torch.float32)
    part_acc = torch.empty((num_seqs, num_heads, num_partitions, head_dim), **ws)
    part_max = torch.empty((num_seqs, num_heads, num_partitions), **ws)
    part_sum = torch.empty((num_seqs, num_heads, num_partitions), **ws)
    _decode_kernel[(num_seqs, num_kv_heads, num_partitions)](
        query, key_cache, value_cache, block_tables, context_lens, out,
        part_acc, part_max, part_sum, scale_log2, window, cap, *strides, num_heads, num_partitions,
        PARTITION_TOKENS=partition_tokens, **meta)
    _decode_reduce_kernel[(num_seqs, num_heads)](
        part_acc, part_max, part_sum, context_lens, out,
        out.stride(0), out.stride(1), num_heads, num_partitions, window,
        HEAD_DIM=head_dim, D_PAD=meta["D_PAD"], NP_PAD=triton.next_power_of_2(num_partitions),
        PARTITION_TOKENS=partition_tokens)
    return out


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                           sliding_window: int | None = None, softcap: float | None = None):
    """Same contract as reference.paged_attention_decode."""
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    partition = max(PARTITION_TOKENS, block_size)
    # A window bounds the tokens read, whatever the table's width.
    span = block_tables.shape[1] * block_size
    long_context = min(span, sliding_window or span) > partition
    few_programs = query.shape[0] * num_kv_heads < SPLIT_BELOW_PROGRAMS
    split = partition if long_context and few_programs else None
    return paged_attention_decode_partitioned(query, key_cache, value_cache, block_tables,
                                              context_lens, scale, split, sliding_window, softcap)

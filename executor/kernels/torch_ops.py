"""Vectorized torch kernels: the CPU execution path.

Same signatures and contracts as executor.kernels.reference (the oracle the tests compare these
against), without its per-sequence Python loop in attention:

  - decode gathers only the used blocks of every sequence in one op (index_select over the
    flattened block tables, no padding to the longest context), masks the positions at or past
    each context's end with -inf, handles GQA by viewing the queries as
    [num_seqs, num_kv_heads, group, head_dim] (K/V are never repeated), and reduces the fp32
    softmax per sequence across its blocks;
  - prefill groups sequences of similar lengths, pads each group's packed queries to
    [n, max_q_len, ...], gathers their contexts the same way and runs one
    scaled_dot_product_attention per group with an explicit boolean mask: query i of a sequence
    with context c and q_len new tokens sits at position c - q_len + i and sees keys 0..that
    position (the cached prefix included);
  - a sliding window (sliding_window=W) starts each sequence's gather at the first block its
    earliest query can see and masks the positions before each query's window: blocks wholly
    outside it are never read, so freed entries (NULL_BLOCK) are safe.

Attention math runs in fp32 and the result is cast back to the query's dtype. A sequence with an
empty context gets zeros, as in the reference. The cache ops are the reference's own (they are
already vectorized).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from executor.kernels.reference import copy_blocks, reshape_and_cache, soft_cap, swap_blocks

__all__ = ["paged_attention_decode", "paged_prefill_attention", "reshape_and_cache", "copy_blocks", "swap_blocks"]


def _blocks(cache, index):
    """cache[index] for a 1-D index of blocks: [len(index), block_size, num_kv_heads, head_dim].
    On a contiguous cache, index_select over whole blocks as rows is a row memcpy; the general
    advanced-indexing kernel behind cache[index] is several times slower."""
    if not cache.is_contiguous():
        return cache[index].contiguous()
    return cache.view(cache.shape[0], -1).index_select(0, index).view(index.shape[0], *cache.shape[1:])


def _gather(cache, block_tables, first_block, num_blocks):
    """Blocks first_block[i] .. first_block[i] + num_blocks[i] - 1 of every sequence i, padded to
    the most blocks: [num_seqs, num_kv_heads, width * block_size, head_dim] fp32 (a strided view
    of one gathered copy). Only those blocks are read: a padded slot repeats the sequence's last
    block (in its window, so finite), which keeps freed entries (NULL_BLOCK) and garbage past a
    sequence's end out of range and out of the result (those positions are masked anyway)."""
    num_seqs = block_tables.shape[0]
    block_size, num_kv_heads, head_dim = cache.shape[1:]
    width = int(num_blocks.max())
    col = torch.arange(width, device=cache.device)[None, :].minimum(num_blocks[:, None] - 1)
    tables = block_tables.to(cache.device).long().gather(1, first_block[:, None] + col).reshape(-1)
    x = _blocks(cache, tables).view(num_seqs, width * block_size, num_kv_heads, head_dim).transpose(1, 2)
    return x.float()  # no copy in fp32


def _first_visible(query_pos, sliding_window):
    """The first key position each query position sees (a tensor)."""
    return (query_pos - sliding_window + 1).clamp_min(0) if sliding_window else torch.zeros_like(query_pos)


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                           sliding_window: int | None = None, softcap: float | None = None):
    """One new token per sequence. query [num_seqs, num_heads, head_dim]; its own K/V is already in
    the cache, so context_lens counts it. Returns [num_seqs, num_heads, head_dim].

    Works on the used blocks only, flattened over the batch (no padding to the longest context,
    which costs several times the useful work when lengths are spread, as in ShareGPT): gather
    each sequence's blocks (from the first its window reaches) with one index_select, scores per
    (block, KV head) with the group's queries as rows, a softmax whose max and sum are reduced
    per sequence across its blocks (scatter/index_add), then the probability-weighted V summed
    back per sequence."""
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1:3]
    group = num_heads // num_kv_heads
    device = query.device
    ctx = context_lens.to(device).long().clamp_min(0)
    lo = _first_visible(ctx - 1, sliding_window).minimum(ctx)  # [S]: first visible position
    first_block = lo // block_size
    num_blocks = (ctx + block_size - 1) // block_size - first_block  # [S]: blocks read
    total = int(num_blocks.sum()) if num_seqs else 0
    if total == 0:
        return torch.zeros_like(query)
    seq_of = torch.repeat_interleave(torch.arange(num_seqs, device=device), num_blocks, output_size=total)
    first = torch.cumsum(num_blocks, 0) - num_blocks
    block_idx = torch.arange(total, device=device) - first[seq_of] + first_block[seq_of]  # index in its sequence
    blocks = block_tables.to(device).long()[seq_of, block_idx]  # entries outside [lo, ctx) never read

    k, v = _blocks(key_cache, blocks).float(), _blocks(value_cache, blocks).float()  # [B, bs, KVH, D]
    # GQA without repeating K/V: head h -> KV head h // group, the group's queries as its rows.
    # One bmm per KV head on strided views of the gathered blocks (a 4-D matmul would first copy
    # K and V into [B, KVH, ...] order); KV-head-major results keep every `out=` contiguous.
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim).index_select(0, seq_of)  # [B, KVH, G, D]
    scores = torch.empty(num_kv_heads, total, group, block_size, device=device)
    for j in range(num_kv_heads):
        torch.bmm(q[:, j], k[:, :, j].transpose(1, 2), out=scores[j])
    scores.mul_(scale)
    scores = soft_cap(scores, softcap)
    pos = block_idx[:, None] * block_size + torch.arange(block_size, device=device)[None, :]
    hidden = (pos >= ctx[seq_of][:, None]) | (pos < lo[seq_of][:, None])
    scores.masked_fill_(hidden[None, :, None, :], float("-inf"))
    # Softmax across each sequence's blocks, in fp32. A block always holds at least one valid
    # position, so its max is finite.
    block_max = scores.amax(-1)  # [KVH, B, G]
    seq_max = torch.full((num_kv_heads, num_seqs, group), float("-inf"), device=device)
    seq_max.scatter_reduce_(1, seq_of[None, :, None].expand_as(block_max), block_max, "amax")
    probs = torch.exp(scores - seq_max.index_select(1, seq_of)[..., None])
    denom = torch.zeros_like(seq_max).index_add_(1, seq_of, probs.sum(-1))
    weighted = torch.empty(num_kv_heads, total, group, head_dim, device=device)
    for j in range(num_kv_heads):
        torch.bmm(probs[j], v[:, :, j], out=weighted[j])
    out = torch.zeros(num_kv_heads, num_seqs, group, head_dim, device=device).index_add_(1, seq_of, weighted)
    # Rows with no context have denom 0 and out 0: they stay zeros (as the reference), not NaN.
    out = out / denom.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    return out.permute(1, 0, 2, 3).reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def _buckets(q_lens: list[int], ctx_lens: list[int], slack: float = 2.0, floor: int = 8192) -> list[list[int]]:
    """Sequences grouped so that padding each group to its longest query and context costs at most
    about `slack` times the useful attention work (plus `floor` for small groups): similar
    lengths together, so a few long prompts do not make every short one pay their size."""
    order = sorted((i for i in range(len(q_lens)) if q_lens[i] > 0), key=lambda i: (ctx_lens[i], q_lens[i]))
    groups: list[list[int]] = []
    cur: list[int] = []
    max_q = max_c = useful = 0
    for i in order:
        mq, mc, u = max(max_q, q_lens[i]), max(max_c, ctx_lens[i]), useful + q_lens[i] * ctx_lens[i]
        if cur and (len(cur) + 1) * mq * mc > slack * u + floor:
            groups.append(cur)
            cur, mq, mc, u = [], q_lens[i], ctx_lens[i], q_lens[i] * ctx_lens[i]
        cur.append(i)
        max_q, max_c, useful = mq, mc, u
    if cur:
        groups.append(cur)
    return groups


def _prefill_group(out, query, key_cache, value_cache, block_tables, starts, q_lens, ctx, ids, scale, sliding_window,
                   softcap):
    """Padded attention for the sequences `ids` (a list): writes their rows of out."""
    device = query.device
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    n = len(ids)
    idx = torch.tensor(ids, dtype=torch.long, device=device)
    g_q, g_ctx, g_starts = q_lens[idx], ctx[idx], starts[idx]
    max_q = int(g_q.max())
    num_rows = int(g_q.sum())
    # Packed rows of the group -> (sequence in the group, row within its new tokens).
    seq_of = torch.repeat_interleave(torch.arange(n, device=device), g_q, output_size=num_rows)
    first_row = torch.cumsum(g_q, 0) - g_q
    row_of = torch.arange(num_rows, device=device) - first_row[seq_of]
    token = g_starts[seq_of] + row_of
    q = query.new_zeros(n, max_q, num_heads, head_dim, dtype=torch.float32)
    q[seq_of, row_of] = query[token].float()
    # GQA without repeating K/V: the group's queries become extra rows of their KV head.
    q = q.view(n, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4).reshape(n, num_kv_heads, group * max_q, head_dim)
    tables = block_tables.index_select(0, idx.to(block_tables.device))
    # Read from the first block the group's earliest query can see (all of it without a window).
    block_size = key_cache.shape[1]
    first_block = _first_visible(g_ctx - g_q, sliding_window) // block_size
    num_blocks = (g_ctx + block_size - 1) // block_size - first_block
    k = _gather(key_cache, tables, first_block, num_blocks)  # [n, KVH, T, D]
    v = _gather(value_cache, tables, first_block, num_blocks)
    # Query i of a sequence sits at position ctx - q_len + i and sees keys up to that position
    # (the cached prefix included; this also keeps it inside its context) and inside its window.
    # Padded query rows see positions >= ctx; their outputs are dropped.
    q_pos = (g_ctx - g_q)[:, None] + torch.arange(max_q, device=device)[None, :]  # [n, max_q]
    k_pos = (first_block * block_size)[:, None] + torch.arange(k.shape[2], device=device)[None, :]  # [n, T]
    allowed = k_pos[:, None, :] <= q_pos[:, :, None]  # [n, max_q, T]
    if sliding_window:
        allowed &= k_pos[:, None, :] > q_pos[:, :, None] - sliding_window
    mask = allowed[:, None].expand(n, group, max_q, k.shape[2]).reshape(n, 1, group * max_q, k.shape[2])
    if softcap:  # SDPA has no soft-capping: the same attention written out
        scores = soft_cap(q @ k.transpose(-1, -2) * scale, softcap).masked_fill(~mask, float("-inf"))
        res = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v  # padded rows may see nothing
    else:
        res = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [n, KVH, G*max_q, D]
    res = res.view(n, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4).reshape(n, max_q, num_heads, head_dim)
    out[token] = res[seq_of, row_of].to(out.dtype)


def paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale: float,
                            sliding_window: int | None = None, softcap: float | None = None):
    """Several new tokens per sequence over a paged context (prompt, prefill chunk, prefix hit,
    recompute). query [num_tokens, num_heads, head_dim] is packed: sequence i owns rows
    query_start_loc[i]:query_start_loc[i+1], which are the last q_len_i tokens of its context of
    context_lens[i] tokens; all of that context's K/V (the new tokens' too) is already cached.
    Causal: a query attends to positions up to its own.

    Sequences of similar lengths are padded together and run through one masked SDPA call per
    group (see _buckets): one call when lengths are alike, a few when they are spread."""
    out = torch.empty_like(query)
    num_seqs = context_lens.shape[0]
    if query.shape[0] == 0 or num_seqs == 0:
        return out
    device = query.device
    starts = query_start_loc.to(device).long()
    q_lens = starts[1:] - starts[:-1]
    ctx = context_lens.to(device).long()
    for ids in _buckets(q_lens.tolist(), ctx.tolist()):
        _prefill_group(out, query, key_cache, value_cache, block_tables, starts, q_lens, ctx, ids, scale, sliding_window,
                       softcap)
    return out

"""Plain torch references for every kernel. They define the kernels' contracts, are what the
tests compare the Triton kernels against, and are the CPU execution path.

Shapes (one layer):
  key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
  block_tables:           [num_seqs, max_blocks_per_seq] int32 (entries past a sequence's end are ignored)
  slot_mapping:           [num_tokens] int64, slot = block_id * block_size + offset, -1 = skip
Query head h reads KV head h // (num_heads // num_kv_heads) (grouped-query attention).

Sliding window (sliding_window=W, None or 0 = full attention): the query at position p sees keys
at positions p - W + 1 .. p (W tokens, its own included; transformers' and vLLM's rule). Blocks
that lie wholly before a sequence's first visible position are never read, so their block-table
entries may be anything, NULL_BLOCK (-1) included: a KV manager frees them and puts the sentinel
in their place.

Soft-capping (softcap=c, None or 0 = none; Gemma 2): scores become c * tanh(scores / c) before
the mask and the softmax.
Attention math runs in fp32 and the result is cast back to the query's dtype.
"""

from __future__ import annotations

import torch

NULL_BLOCK = -1  # a freed block-table entry (outside every query's window); kernels never read it


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_dim] into the caches at slot_mapping."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[keep].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[keep].to(value_cache.dtype)


def gather_context(cache, block_table, context_len: int, start: int = 0):
    """Token states start .. context_len - 1 of one sequence: [context_len - start, num_kv_heads,
    head_dim]. Reads only the blocks holding those positions."""
    block_size = cache.shape[1]
    first, num_blocks = start // block_size, (context_len + block_size - 1) // block_size
    blocks = block_table[first:num_blocks].long()
    tokens = cache[blocks].reshape(-1, *cache.shape[2:])
    return tokens[start - first * block_size:context_len - first * block_size]


def first_visible(query_pos: int, sliding_window: int | None) -> int:
    """The first key position the query at query_pos sees."""
    return max(0, query_pos - sliding_window + 1) if sliding_window else 0


def soft_cap(scores, softcap: float | None):
    """Gemma 2's soft-capping of attention scores (in place of a large-logit clamp)."""
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def _attend(q, k, v, scale, causal_offset: int, key_offset: int = 0, sliding_window: int | None = None,
            softcap: float | None = None):
    """q [q_len, H, D] against k, v [n, KVH, D] holding positions key_offset .. key_offset + n - 1;
    query i sits at position causal_offset + i and sees keys up to its own, and within its window."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    qf = q.float().transpose(0, 1)  # [H, q_len, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, D]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = soft_cap(torch.matmul(qf, kf.transpose(1, 2)) * scale, softcap)  # [H, q_len, ctx]
    q_pos = torch.arange(q.shape[0], device=q.device) + causal_offset
    k_pos = torch.arange(k.shape[0], device=q.device) + key_offset
    hidden = k_pos[None, :] > q_pos[:, None]
    if sliding_window:
        hidden |= k_pos[None, :] <= q_pos[:, None] - sliding_window
    scores = scores.masked_fill(hidden[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vf).transpose(0, 1).to(q.dtype)  # [q_len, H, D]


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                           sliding_window: int | None = None, softcap: float | None = None):
    """One new token per sequence. query [num_seqs, num_heads, head_dim]; its own K/V is already in
    the cache, so context_lens counts it. Returns [num_seqs, num_heads, head_dim]."""
    out = torch.empty_like(query)
    for i, ctx in enumerate(context_lens.tolist()):
        if ctx <= 0:
            out[i] = 0
            continue
        start = first_visible(ctx - 1, sliding_window)
        k = gather_context(key_cache, block_tables[i], ctx, start)
        v = gather_context(value_cache, block_tables[i], ctx, start)
        out[i] = _attend(query[i : i + 1], k, v, scale, ctx - 1, start, sliding_window, softcap)[0]
    return out


def paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale: float,
                            sliding_window: int | None = None, softcap: float | None = None):
    """Several new tokens per sequence over a paged context (prompt, prefill chunk, prefix hit,
    recompute). query [num_tokens, num_heads, head_dim] is packed: sequence i owns rows
    query_start_loc[i]:query_start_loc[i+1], which are the last q_len_i tokens of its context of
    context_lens[i] tokens; all of that context's K/V (the new tokens' too) is already cached.
    Causal: a query attends to positions up to its own (and within its window)."""
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        first_query = ctx - (hi - lo)
        start = first_visible(first_query, sliding_window)
        k = gather_context(key_cache, block_tables[i], ctx, start)
        v = gather_context(value_cache, block_tables[i], ctx, start)
        out[lo:hi] = _attend(query[lo:hi], k, v, scale, first_query, start, sliding_window, softcap)
    return out


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    """Copy-on-write: for each (src, dst) row of block_mapping [n, 2], copy block src to dst in
    every layer's key and value cache."""
    if len(block_mapping) == 0:
        return
    src, dst = block_mapping[:, 0].long(), block_mapping[:, 1].long()
    for cache in (*key_caches, *value_caches):
        cache[dst] = cache[src]


def swap_blocks(src_cache, dst_cache, block_mapping) -> None:
    """Move blocks between a device cache and a host cache: dst[m[i,1]] = src[m[i,0]]."""
    if len(block_mapping) == 0:
        return
    src = block_mapping[:, 0].long()
    dst = block_mapping[:, 1].long()
    dst_cache[dst.to(dst_cache.device)] = src_cache[src.to(src_cache.device)].to(dst_cache.device)

"""Random paged caches for checking kernels against their references (tests, gpu_check)."""

from __future__ import annotations

import math

import torch


def random_paged_cache(ctx_lens, num_kv_heads: int, head_dim: int, block_size: int, dtype, seed: int = 0,
                       extra_cols: int = 1, device="cpu"):
    """(key_cache, value_cache, block_tables, context_lens) with each sequence's blocks scattered
    over a shuffled pool. Table entries past a sequence's last block point at real (wrong)
    blocks, so a kernel that reads past a context's end gives a different result."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(c / block_size) for c in ctx_lens]
    width = max(blocks_per_seq, default=0) + extra_cols
    num_blocks = sum(blocks_per_seq) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=g).to(dtype)
    value_cache = torch.randn(shape, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.randint(0, num_blocks, (len(ctx_lens), width), generator=g, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = perm[used:used + n].to(torch.int32)
        used += n
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    return key_cache.to(device), value_cache.to(device), tables.to(device), ctx.to(device)

"""Triton kernels (under the interpreter, on CPU tensors) against the torch references, and the
references against dense SDPA on independently gathered K/V. Shapes stay tiny: the interpreter
costs a few ms per (program, loop iteration)."""


import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from executor import kernels  # noqa: E402
from executor.kernels import reference, torch_ops, triton_ops  # noqa: E402
from executor.kernels.testing import random_paged_cache  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def make_paged(ctx_lens, num_kv_heads, head_dim, block_size, dtype, seed=0):
    return random_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, seed)


def dense_kv(cache, table, ctx):
    """A sequence's K or V token by token, independent of reference.gather_context."""
    bs = cache.shape[1]
    return torch.stack([cache[int(table[t // bs]), t % bs] for t in range(ctx)])


def sdpa(q, k, v, scale, q_offset):
    """q [q_len, H, D] over k, v [ctx, KVH, D]; query i sits at position q_offset + i."""
    q_len, ctx = q.shape[0], k.shape[0]
    allowed = torch.arange(ctx)[None, :] <= (torch.arange(q_len) + q_offset)[:, None]
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1),
        attn_mask=allowed, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def assert_close(actual, expected, dtype):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


# ---- references against dense SDPA -------------------------------------------------------


def test_reference_decode_and_prefill_match_dense_sdpa():
    ctx_lens, q_lens = [13, 40, 37], [13, 3, 17]
    kc, vc, tables, ctx = make_paged(ctx_lens, 2, 64, 16, torch.float32)
    g = torch.Generator().manual_seed(1)
    scale = 64 ** -0.5

    q = torch.randn(3, 4, 64, generator=g)
    out = reference.paged_attention_decode(q, kc, vc, tables, ctx, scale)
    for i, c in enumerate(ctx_lens):
        k, v = dense_kv(kc, tables[i], c), dense_kv(vc, tables[i], c)
        torch.testing.assert_close(out[i:i + 1], sdpa(q[i:i + 1], k, v, scale, c - 1), atol=1e-5, rtol=1e-5)

    qp = torch.randn(sum(q_lens), 4, 64, generator=g)
    loc = torch.tensor([0, 13, 16, 33], dtype=torch.int32)
    out = reference.paged_prefill_attention(qp, kc, vc, tables, loc, ctx, scale)
    for i, c in enumerate(ctx_lens):
        k, v = dense_kv(kc, tables[i], c), dense_kv(vc, tables[i], c)
        lo, hi = int(loc[i]), int(loc[i + 1])
        torch.testing.assert_close(out[lo:hi], sdpa(qp[lo:hi], k, v, scale, c - (hi - lo)), atol=1e-5, rtol=1e-5)


# ---- decode --------------------------------------------------------------------------------

DECODE_CASES = [  # (block_size, head_dim, dtype, num_heads, num_kv_heads)
    (8, 64, torch.float32, 4, 2),
    (16, 80, torch.float16, 4, 1),
    (32, 64, torch.bfloat16, 4, 4),
    (16, 128, torch.bfloat16, 4, 2),
]


@pytest.mark.parametrize("block_size,head_dim,dtype,num_heads,num_kv_heads", DECODE_CASES)
def test_decode_matches_reference(block_size, head_dim, dtype, num_heads, num_kv_heads):
    kc, vc, tables, ctx = make_paged([13, 40, 1], num_kv_heads, head_dim, block_size, dtype)
    q = torch.randn(3, num_heads, head_dim).to(dtype)
    scale = head_dim ** -0.5
    expected = reference.paged_attention_decode(q, kc, vc, tables, ctx, scale)
    assert_close(triton_ops.paged_attention_decode(q, kc, vc, tables, ctx, scale), expected, dtype)
    # Flash-decoding split: 32-token partitions give 40 tokens two, and one sequence none past 1.
    split = triton_ops.paged_attention_decode_partitioned(q, kc, vc, tables, ctx, scale, 32)
    assert_close(split, expected, dtype)


def test_decode_split_many_partitions_and_empty_context():
    # Several partitions of one block each; a sequence of context 0 gives zeros (like the reference).
    kc, vc, tables, ctx = make_paged([70, 0, 33], 1, 64, 32, torch.float32)
    q = torch.randn(3, 4, 64)
    expected = reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125)
    assert torch.all(expected[1] == 0)
    for partition in (None, 32):
        out = triton_ops.paged_attention_decode_partitioned(q, kc, vc, tables, ctx, 0.125, partition)
        assert_close(out, expected, torch.float32)


# ---- prefill -------------------------------------------------------------------------------

# Sequence 0 is a pure prompt (nothing cached before it), 1 a prefix hit (37 cached tokens,
# 3 new), 2 a prefill chunk (20 cached, 17 new), 3 has no new token in this step.
PREFILL_CTX, PREFILL_Q = [13, 40, 37, 9], [13, 3, 17, 0]


@pytest.mark.parametrize("block_size,head_dim,dtype,num_heads,num_kv_heads,tiles", [
    (16, 64, torch.float32, 4, 2, (64, 64)),
    (8, 80, torch.float16, 4, 1, (16, 16)),  # several query tiles and KV steps per sequence
    (32, 64, torch.bfloat16, 4, 4, (16, 32)),
])
def test_prefill_matches_reference(block_size, head_dim, dtype, num_heads, num_kv_heads, tiles):
    kc, vc, tables, ctx = make_paged(PREFILL_CTX, num_kv_heads, head_dim, block_size, dtype)
    loc = torch.tensor([0] + list(torch.tensor(PREFILL_Q).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(loc[-1]), num_heads, head_dim).to(dtype)
    scale = head_dim ** -0.5
    expected = reference.paged_prefill_attention(q, kc, vc, tables, loc, ctx, scale)
    out = triton_ops.paged_prefill_attention_tiled(q, kc, vc, tables, loc, ctx, scale, *tiles)
    assert_close(out, expected, dtype)


# ---- cache ops -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,head_dim", [(torch.float16, 80), (torch.bfloat16, 64)])
def test_reshape_and_cache_skips_minus_one(dtype, head_dim):
    kc, vc, _, _ = make_paged([40], 2, head_dim, 16, dtype)
    key = torch.randn(5, 2, head_dim).to(dtype)
    value = torch.randn(5, 2, head_dim).to(dtype)
    slots = torch.tensor([3, -1, 17, 45, -1], dtype=torch.int64)
    k_ref, v_ref = kc.clone(), vc.clone()
    reference.reshape_and_cache(key, value, k_ref, v_ref, slots)
    triton_ops.reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, k_ref) and torch.equal(vc, v_ref)


def test_reshape_and_cache_casts_and_reads_strided_input():
    kc, vc, _, _ = make_paged([32], 3, 64, 8, torch.float16)
    qkv = torch.randn(4, 3, 3 * 64)  # key/value as column slices of a fused projection
    key, value = qkv[..., 64:128], qkv[..., 128:]
    slots = torch.tensor([0, 9, -1, 31])
    k_ref, v_ref = kc.clone(), vc.clone()
    reference.reshape_and_cache(key, value, k_ref, v_ref, slots)
    triton_ops.reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, k_ref) and torch.equal(vc, v_ref)


def test_copy_blocks_all_layers():
    layers = [make_paged([64], 2, 80, 16, torch.bfloat16, seed=s)[:2] for s in range(2)]
    mapping = torch.tensor([[0, 5], [2, 6], [3, 4]])
    expected = [[c.clone() for c in layer] for layer in layers]
    reference.copy_blocks([k for k, _ in expected], [v for _, v in expected], mapping)
    triton_ops.copy_blocks([k for k, _ in layers], [v for _, v in layers], mapping)
    for (k, v), (ek, ev) in zip(layers, expected):
        assert torch.equal(k, ek) and torch.equal(v, ev)
    triton_ops.copy_blocks([k for k, _ in layers], [v for _, v in layers], mapping[:0])  # no-op


def test_swap_blocks_same_device():
    src, _, _, _ = make_paged([64], 2, 64, 16, torch.float16)
    dst = torch.zeros_like(src)
    expected = dst.clone()
    mapping = torch.tensor([[1, 0], [3, 2]])
    reference.swap_blocks(src, expected, mapping)
    triton_ops.swap_blocks(src, dst, mapping)
    assert torch.equal(dst, expected)


# ---- dispatch ------------------------------------------------------------------------------


def test_dispatch_follows_pagesim_kernels(monkeypatch):
    monkeypatch.delenv("PAGESIM_KERNELS", raising=False)
    assert kernels.backend("cpu") == "torch" and kernels.backend("cuda:0") == "triton"
    assert kernels._impl(torch.zeros(1)) is torch_ops
    monkeypatch.setenv("PAGESIM_KERNELS", "torch")
    assert kernels.backend("cuda") == "torch"
    monkeypatch.setenv("PAGESIM_KERNELS", "reference")
    assert kernels.backend("cuda") == "reference" and kernels._impl(torch.zeros(1)) is reference
    monkeypatch.setenv("PAGESIM_KERNELS", "triton")
    assert kernels.backend("cpu") == "triton" and kernels._impl(torch.zeros(1)) is triton_ops

    # The public names, forced onto Triton, agree with the reference.
    kc, vc, tables, ctx = make_paged([13, 40, 37], 2, 64, 16, torch.float32)
    q = torch.randn(3, 4, 64)
    assert_close(kernels.paged_attention_decode(q, kc, vc, tables, ctx, 0.125),
                 reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125), torch.float32)

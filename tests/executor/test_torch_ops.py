"""The vectorized CPU kernels (executor.kernels.torch_ops) against the per-sequence references on
random paged layouts: GQA, partial blocks, shuffled physical blocks with garbage past each
sequence's end, block sizes 8/16/32, head dims 64/80, fp32/fp16/bf16, contexts of one token,
prefix hits and prefill chunks. Plus the dispatch of PAGESIM_KERNELS."""


import pytest
import torch

from executor import kernels
from executor.kernels import reference, torch_ops
from executor.kernels.testing import random_paged_cache

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_paged(ctx_lens, num_kv_heads, head_dim, block_size, dtype, seed=0, extra_cols=2):
    return random_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, seed, extra_cols)


def assert_close(actual, expected, dtype):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


CASES = [  # (num_heads, num_kv_heads, head_dim, block_size)
    (4, 4, 64, 16),  # MHA
    (8, 2, 64, 8),  # GQA 4:1
    (9, 3, 64, 32),  # SmolLM2's 3:1
    (6, 2, 80, 16),  # head_dim 80
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", CASES)
def test_decode_matches_reference(heads, kv_heads, head_dim, block_size, dtype):
    g = torch.Generator().manual_seed(heads * 100 + block_size)
    ctx_lens = [1, block_size, block_size + 1, 3 * block_size - 1] + torch.randint(1, 90, (5,), generator=g).tolist()
    kc, vc, tables, ctx = make_paged(ctx_lens, kv_heads, head_dim, block_size, dtype, seed=block_size)
    q = torch.randn(len(ctx_lens), heads, head_dim, generator=g).to(dtype)
    scale = head_dim**-0.5
    out = torch_ops.paged_attention_decode(q, kc, vc, tables, ctx, scale)
    assert_close(out, reference.paged_attention_decode(q, kc, vc, tables, ctx, scale), dtype)


def test_decode_single_token_contexts_and_empty_rows():
    kc, vc, tables, ctx = make_paged([1, 1, 1], 2, 64, 16, torch.float32)
    q = torch.randn(3, 4, 64)
    out = torch_ops.paged_attention_decode(q, kc, vc, tables, ctx, 0.125)
    assert_close(out, reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125), torch.float32)
    # A single-token context returns that token's V for every head of its group.
    v0 = vc[int(tables[0, 0]), 0]  # [KVH, D]
    torch.testing.assert_close(out[0], v0.repeat_interleave(2, dim=0))
    # A row with no context gives zeros (as the reference), not NaN, and leaves the others alone.
    ctx0 = torch.tensor([0, 1, 1], dtype=torch.int32)
    out0 = torch_ops.paged_attention_decode(q, kc, vc, tables, ctx0, 0.125)
    assert torch.equal(out0[0], torch.zeros_like(out0[0]))
    assert_close(out0, reference.paged_attention_decode(q, kc, vc, tables, ctx0, 0.125), torch.float32)
    assert torch_ops.paged_attention_decode(q[:0], kc, vc, tables[:0], ctx[:0], 0.125).shape == (0, 4, 64)


def test_decode_ignores_table_entries_past_the_end():
    """Garbage (even out of range) in a table past a sequence's last block is never read."""
    kc, vc, tables, ctx = make_paged([5, 40], 2, 64, 16, torch.float32)
    q = torch.randn(2, 4, 64)
    expected = reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125)
    tables[0, 1:] = 10_000
    tables[1, 3:] = -7
    assert_close(torch_ops.paged_attention_decode(q, kc, vc, tables, ctx, 0.125), expected, torch.float32)


def prefill_case(ctx_lens, q_lens, heads, kv_heads, head_dim, block_size, dtype, seed=0):
    kc, vc, tables, ctx = make_paged(ctx_lens, kv_heads, head_dim, block_size, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=g).to(dtype)
    loc = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    scale = head_dim**-0.5
    out = torch_ops.paged_prefill_attention(q, kc, vc, tables, loc, ctx, scale)
    expected = reference.paged_prefill_attention(q, kc, vc, tables, loc, ctx, scale)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", CASES)
def test_prefill_matches_reference(heads, kv_heads, head_dim, block_size, dtype):
    # Whole prompts (q_len == ctx), a prefix hit (cached blocks before the new tokens), prefill
    # chunks (a middle and a last chunk), one-token prompts, and decode rows mixed in.
    ctx_lens = [37, 1, 2 * block_size + 5, 50, 70, 9, 3 * block_size]
    q_lens = [37, 1, 5, 16, 20, 1, 3 * block_size]
    prefill_case(ctx_lens, q_lens, heads, kv_heads, head_dim, block_size, dtype, seed=block_size + head_dim)


def test_prefill_random_layouts():
    g = torch.Generator().manual_seed(7)
    for trial in range(6):
        num_seqs = int(torch.randint(1, 7, (1,), generator=g))
        ctx_lens = torch.randint(1, 120, (num_seqs,), generator=g).tolist()
        q_lens = [int(torch.randint(1, c + 1, (1,), generator=g)) for c in ctx_lens]
        block_size = [8, 16, 32][trial % 3]
        prefill_case(ctx_lens, q_lens, 8, 2, 64, block_size, torch.float32, seed=trial)


def test_prefill_chunk_split_equals_whole_prompt():
    """A prompt run as two chunks gives the rows of the whole prompt run at once."""
    kc, vc, tables, ctx = make_paged([45], 2, 64, 8, torch.float32)
    q = torch.randn(45, 4, 64)
    whole = torch_ops.paged_prefill_attention(q, kc, vc, tables, torch.tensor([0, 45], dtype=torch.int32), ctx, 0.125)
    first = torch_ops.paged_prefill_attention(q[:20], kc, vc, tables, torch.tensor([0, 20], dtype=torch.int32),
                                              torch.tensor([20], dtype=torch.int32), 0.125)
    second = torch_ops.paged_prefill_attention(q[20:], kc, vc, tables, torch.tensor([0, 25], dtype=torch.int32), ctx, 0.125)
    torch.testing.assert_close(torch.cat([first, second]), whole, atol=1e-5, rtol=1e-5)
    # The last row of a prefill equals a decode step at that position.
    dec = torch_ops.paged_attention_decode(q[44:45], kc, vc, tables, ctx, 0.125)
    torch.testing.assert_close(dec, whole[44:45], atol=1e-5, rtol=1e-5)


def test_prefill_with_empty_sequences():
    """A sequence with no new rows (query_start_loc repeats) contributes nothing."""
    kc, vc, tables, ctx = make_paged([10, 20, 30], 2, 64, 16, torch.float32)
    q = torch.randn(10 + 4, 4, 64)
    loc = torch.tensor([0, 10, 10, 14], dtype=torch.int32)
    assert_close(torch_ops.paged_prefill_attention(q, kc, vc, tables, loc, ctx, 0.125),
                 reference.paged_prefill_attention(q, kc, vc, tables, loc, ctx, 0.125), torch.float32)


def test_dispatch(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv("PAGESIM_KERNELS", raising=False)
    assert kernels.backend("cpu") == "torch" and kernels._impl(cpu) is torch_ops
    if kernels._have_triton():
        assert kernels.backend("cuda:0") == "triton"
    monkeypatch.setenv("PAGESIM_KERNELS", "reference")
    assert kernels.backend("cpu") == "reference" and kernels.backend("cuda") == "reference"
    assert kernels._impl(cpu) is reference
    monkeypatch.setenv("PAGESIM_KERNELS", "torch")
    assert kernels.backend("cuda") == "torch" and kernels._impl(cpu) is torch_ops
    monkeypatch.setenv("PAGESIM_KERNELS", "nonsense")
    with pytest.raises(ValueError):
        kernels.backend("cpu")
    monkeypatch.delenv("PAGESIM_KERNELS")
    kc, vc, tables, ctx = make_paged([13, 40, 37], 2, 64, 16, torch.float32)
    q = torch.randn(3, 4, 64)
    assert_close(kernels.paged_attention_decode(q, kc, vc, tables, ctx, 0.125),
                 reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125), torch.float32)


def test_prefill_spread_lengths_split_into_groups():
    """Long and short prompts together run as several padded groups; the result is unchanged."""
    ctx_lens = [300, 2, 3, 260, 5, 1, 40, 41, 280]
    q_lens = [300, 2, 1, 200, 5, 1, 40, 3, 280]
    assert len(torch_ops._buckets(q_lens, ctx_lens)) > 1
    for dtype in DTYPES:
        prefill_case(ctx_lens, q_lens, 9, 3, 64, 16, dtype, seed=3)


def test_non_contiguous_cache():
    """A cache that is a strided view (not the CacheEngine's contiguous layout) still works."""
    kc, vc, tables, ctx = make_paged([13, 40, 37], 2, 64, 16, torch.float32)
    kc_nc, vc_nc = kc.transpose(1, 2).contiguous().transpose(1, 2), vc.transpose(1, 2).contiguous().transpose(1, 2)
    assert not kc_nc.is_contiguous()
    q = torch.randn(3, 4, 64)
    assert_close(torch_ops.paged_attention_decode(q, kc_nc, vc_nc, tables, ctx, 0.125),
                 reference.paged_attention_decode(q, kc, vc, tables, ctx, 0.125), torch.float32)
    qp = torch.randn(13 + 5 + 37, 4, 64)
    loc = torch.tensor([0, 13, 18, 55], dtype=torch.int32)
    assert_close(torch_ops.paged_prefill_attention(qp, kc_nc, vc_nc, tables, loc, ctx, 0.125),
                 reference.paged_prefill_attention(qp, kc, vc, tables, loc, ctx, 0.125), torch.float32)

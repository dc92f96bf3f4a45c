"""Sliding-window attention over the paged cache: every backend (the plain reference, the
vectorized torch path, the Triton kernels under the interpreter) against dense attention with an
explicit window mask, and blocks wholly outside the window never read (poisoned with NaN, their
table entries replaced by NULL_BLOCK). Shapes stay tiny: the interpreter costs a few ms per
(program, loop iteration)."""

import pytest
import torch

pytest.importorskip("triton")

from executor import kernels  # noqa: E402
from executor.kernels import reference, torch_ops, triton_ops  # noqa: E402
from executor.kernels.reference import NULL_BLOCK  # noqa: E402
from executor.kernels.testing import poison_outside_window, random_paged_cache  # noqa: E402

BS, HEADS, KV_HEADS, DIM = 4, 4, 2, 16
SCALE = DIM ** -0.5


def dense_kv(cache, table, ctx):
    """A sequence's K or V token by token (independent of every gather under test)."""
    return torch.stack([cache[int(table[t // BS]), t % BS] for t in range(ctx)])


def windowed_attention(q, k, v, q_offset, window, softcap=None):
    """Plain attention with an explicit mask: query i at position q_offset + i sees key j when
    q_offset + i - window < j <= q_offset + i. q [q_len, H, D], k/v [ctx, KVH, D]. softcap c:
    scores become c tanh(scores / c) first."""
    group = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * SCALE
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    pos = torch.arange(q.shape[0])[:, None] + q_offset
    key = torch.arange(k.shape[0])[None, :]
    allowed = (key <= pos) & (key > pos - window)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf)


DECODE = {
    "reference": reference.paged_attention_decode,
    "torch": torch_ops.paged_attention_decode,
    "triton": triton_ops.paged_attention_decode,
    "triton-split32": lambda *a, **kw: triton_ops.paged_attention_decode_partitioned(*a, 32, **kw),
}
PREFILL = {
    "reference": reference.paged_prefill_attention,
    "torch": torch_ops.paged_prefill_attention,
    "triton": lambda *a, **kw: triton_ops.paged_prefill_attention_tiled(*a, 16, 16, **kw),
}


# Windows: a multiple of the block size, one that cuts blocks, and one longer than every context
# but the last (so some sequences see everything). Contexts cross the window and 70 spans three
# 32-token partitions of the split decode, the first wholly before the window.
@pytest.mark.parametrize("window", [8, 5, 20])
@pytest.mark.parametrize("impl", list(DECODE))
def test_decode_window_matches_dense_and_never_reads_outside(impl, window):
    ctx_lens = [3, 13, 22, 70]
    kc, vc, tables, ctx = random_paged_cache(ctx_lens, KV_HEADS, DIM, BS, torch.float32, seed=window)
    q = torch.randn(len(ctx_lens), HEADS, DIM, generator=torch.Generator().manual_seed(1))
    for i, c in enumerate(ctx_lens):
        want = windowed_attention(q[i:i + 1], dense_kv(kc, tables[i], c), dense_kv(vc, tables[i], c), c - 1, window)
        got = DECODE[impl](q[i:i + 1], kc, vc, tables[i:i + 1], ctx[i:i + 1], SCALE, sliding_window=window)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    pk, pv, ptables = poison_outside_window(kc, vc, tables, [c - 1 for c in ctx_lens], window)
    assert torch.isnan(pk).any() and (ptables == NULL_BLOCK).any()  # the poison is there to find
    clean = DECODE[impl](q, kc, vc, tables, ctx, SCALE, sliding_window=window)
    poisoned = DECODE[impl](q, pk, pv, ptables, ctx, SCALE, sliding_window=window)
    torch.testing.assert_close(poisoned, clean, atol=1e-6, rtol=0)


# Sequence 0 is a whole prompt, 1 a chunk after 9 cached tokens, 2 a prefix hit (3 new after
# 19), 3 has no new token this step.
PREFILL_CTX, PREFILL_Q = [14, 21, 22, 6], [14, 12, 3, 0]


@pytest.mark.parametrize("window", [8, 5])
@pytest.mark.parametrize("impl", list(PREFILL))
def test_prefill_window_matches_dense_and_never_reads_outside(impl, window):
    kc, vc, tables, ctx = random_paged_cache(PREFILL_CTX, KV_HEADS, DIM, BS, torch.float32, seed=window)
    loc = torch.tensor([0] + torch.tensor(PREFILL_Q).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(loc[-1]), HEADS, DIM, generator=torch.Generator().manual_seed(2))
    out = PREFILL[impl](q, kc, vc, tables, loc, ctx, SCALE, sliding_window=window)
    for i, c in enumerate(PREFILL_CTX):
        lo, hi = int(loc[i]), int(loc[i + 1])
        if hi > lo:
            want = windowed_attention(q[lo:hi], dense_kv(kc, tables[i], c), dense_kv(vc, tables[i], c), c - (hi - lo),
                                      window)
            torch.testing.assert_close(out[lo:hi], want, atol=1e-5, rtol=1e-5)
    first_query = [c - n for c, n in zip(PREFILL_CTX, PREFILL_Q)]
    pk, pv, ptables = poison_outside_window(kc, vc, tables, first_query, window)
    assert torch.isnan(pk).any() and (ptables == NULL_BLOCK).any()
    poisoned = PREFILL[impl](q, pk, pv, ptables, loc, ctx, SCALE, sliding_window=window)
    torch.testing.assert_close(poisoned, out, atol=1e-6, rtol=0)


def test_window_wider_than_context_is_full_attention():
    kc, vc, tables, ctx = random_paged_cache([9, 17], KV_HEADS, DIM, BS, torch.float32)
    q = torch.randn(2, HEADS, DIM)
    full = reference.paged_attention_decode(q, kc, vc, tables, ctx, SCALE)
    for fn in (reference.paged_attention_decode, torch_ops.paged_attention_decode, triton_ops.paged_attention_decode):
        torch.testing.assert_close(fn(q, kc, vc, tables, ctx, SCALE, sliding_window=17), full, atol=1e-5, rtol=1e-5)
    # and a window of 1 is the token's own value
    own = torch.stack([vc[int(tables[i, (c - 1) // BS]), (c - 1) % BS] for i, c in enumerate([9, 17])])
    got = torch_ops.paged_attention_decode(q, kc, vc, tables, ctx, SCALE, sliding_window=1)
    torch.testing.assert_close(got, own.repeat_interleave(HEADS // KV_HEADS, 1), atol=1e-6, rtol=0)


def test_public_names_pass_the_window(monkeypatch):
    kc, vc, tables, ctx = random_paged_cache([13, 22], KV_HEADS, DIM, BS, torch.float32)
    q = torch.randn(2, HEADS, DIM)
    want = reference.paged_attention_decode(q, kc, vc, tables, ctx, SCALE, sliding_window=6)
    assert not torch.allclose(want, reference.paged_attention_decode(q, kc, vc, tables, ctx, SCALE), atol=1e-3)
    for backend in ("torch", "triton"):
        monkeypatch.setenv("PAGESIM_KERNELS", backend)
        torch.testing.assert_close(kernels.paged_attention_decode(q, kc, vc, tables, ctx, SCALE, sliding_window=6),
                                   want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", list(PREFILL))
def test_softcap_matches_dense(impl):
    """Gemma 2's soft-capped scores, with and without a window; a small cap (scores here reach
    about 10) so it changes the result."""
    kc, vc, tables, ctx = random_paged_cache(PREFILL_CTX, KV_HEADS, DIM, BS, torch.float32, seed=3)
    loc = torch.tensor([0] + torch.tensor(PREFILL_Q).cumsum(0).tolist(), dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    q = 3 * torch.randn(int(loc[-1]), HEADS, DIM, generator=g)
    qd = 3 * torch.randn(len(PREFILL_CTX), HEADS, DIM, generator=g)
    for window in (None, 6):
        span = window or 10**6
        out = PREFILL[impl](q, kc, vc, tables, loc, ctx, SCALE, sliding_window=window, softcap=2.0)
        decodes = [DECODE[name](qd, kc, vc, tables, ctx, SCALE, sliding_window=window, softcap=2.0)
                   for name in DECODE if name.startswith(impl)]
        for i, c in enumerate(PREFILL_CTX):
            k, v = dense_kv(kc, tables[i], c), dense_kv(vc, tables[i], c)
            lo, hi = int(loc[i]), int(loc[i + 1])
            if hi > lo:
                want = windowed_attention(q[lo:hi], k, v, c - (hi - lo), span, softcap=2.0)
                torch.testing.assert_close(out[lo:hi], want, atol=1e-5, rtol=1e-5)
                uncapped = windowed_attention(q[lo:hi], k, v, c - (hi - lo), span)
                assert (uncapped - want).abs().max() > 1e-2
            for dec in decodes:
                want = windowed_attention(qd[i:i + 1], k, v, c - 1, span, softcap=2.0)
                torch.testing.assert_close(dec[i:i + 1], want, atol=1e-5, rtol=1e-5)

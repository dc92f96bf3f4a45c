"""Checking kernels against their references: random paged caches, the tolerances, and the
checks themselves (tests/executor, pagesim/experiments/gpu_check.py)."""

from __future__ import annotations

import itertools
import math
import traceback
from typing import Callable

import torch

from executor.timing import synchronize


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


def poison_outside_window(key_cache, value_cache, block_tables, first_query, window: int):
    """Copies of the caches and tables where every block wholly before a sequence's first visible
    position (first_query[i] - window + 1) is NaN and every other such table entry is NULL_BLOCK
    (a freed block): a kernel that reads outside the window gives NaN or fails."""
    from executor.kernels.reference import NULL_BLOCK

    key_cache, value_cache, block_tables = key_cache.clone(), value_cache.clone(), block_tables.clone()
    block_size = key_cache.shape[1]
    for i, q0 in enumerate(first_query):
        for b in range(max(0, q0 - window + 1) // block_size):
            key_cache[int(block_tables[i, b])] = float("nan")
            value_cache[int(block_tables[i, b])] = float("nan")
            if b % 2:
                block_tables[i, b] = NULL_BLOCK
    return key_cache, value_cache, block_tables


# Kernel outputs against the references: |out - ref| <= atol + rtol * |ref|, atol = rtol = this
# per dtype; the cache ops (reshape_and_cache, copy_blocks) must be bit-exact.
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}


def max_abs_error(actual, expected, atol: float, rtol: float) -> tuple[float, bool]:
    """(largest |actual - expected|, every element within atol + rtol * |expected|)."""
    a, e = actual.float(), expected.float()
    if a.numel() == 0:
        return 0.0, True
    diff = (a - e).abs()
    max_abs = float(diff.max())
    ok = bool(((diff <= atol + rtol * e.abs()) | (a == e)).all()) and math.isfinite(max_abs)
    return max_abs, ok


def _decode_impls(impl_name, mod, split_tokens):
    """(label, fn) decode variants to check for one implementation."""
    out = [("auto", mod.paged_attention_decode)]
    if impl_name.startswith("triton"):
        out.append(("one-pass", lambda *a, **kw: mod.paged_attention_decode_partitioned(*a, None, **kw)))
        out.append((f"split-{split_tokens}",
                    lambda *a, **kw: mod.paged_attention_decode_partitioned(*a, split_tokens, **kw)))
    return out


def check_kernels(impl_name: str, mod, K: dict, device, rows: list[dict], time_left: Callable[[], float] = lambda: math.inf,
                  reraise: tuple[type[BaseException], ...] = ()) -> None:
    """Check one implementation (a module with the kernels' functions) against the references on
    random paged caches, appending one row per check to `rows`: decode (every variant), prefill
    (each split kind of K["prefill"]), both again with a sliding window of block size + 3 tokens
    over caches whose out-of-window blocks are NaN / NULL_BLOCK, reshape_and_cache and copy_blocks
    (bit-exact), for each (dtype, (heads, kv heads), block size) of K["combos"]. A kernel that raises becomes a failing
    row with the error; exceptions in `reraise` (an outer timeout) go through."""
    from executor.kernels import reference

    D = K["head_dim"]
    scale = D ** -0.5
    seed = 0
    for dtype_name, (H, KVH), bs in K["combos"]:
        dtype = getattr(torch, dtype_name)
        tol = TOLERANCE[dtype_name]
        heads = f"{H}/{KVH}"
        if time_left() < 5:
            raise TimeoutError("out of time for the kernel checks")
        seed += 1
        # ---- decode
        ctx = K["decode_ctx"]
        kc, vc, tables, ctx_t = random_paged_cache(ctx, KVH, D, bs, dtype, seed, device=device)
        q = torch.randn(len(ctx), H, D, device=device, dtype=torch.float32).to(dtype)
        ref = reference.paged_attention_decode(q, kc, vc, tables, ctx_t, scale)
        split = K["split_tokens"] or max(32, bs)
        split = max(split, max(32, bs))
        window = bs + 3  # cuts blocks: one partially covered, the ones before it never read
        ref_window = reference.paged_attention_decode(q, kc, vc, tables, ctx_t, scale, sliding_window=window)
        pk, pv, ptables = poison_outside_window(kc, vc, tables, [c - 1 for c in ctx], window)
        for label, fn in _decode_impls(impl_name, mod, split):
            row = dict(kernel="decode", impl=impl_name, variant=label, dtype=dtype_name, heads=heads,
                       block=bs, head_dim=D, case=f"ctx {min(ctx)}..{max(ctx)} x{len(ctx)} (partial blocks)",
                       atol=tol, rtol=tol)
            with CheckRow(rows, row, reraise):
                out = fn(q, kc, vc, tables, ctx_t, scale)
                synchronize(device)
                row["max_abs_err"], row["passed"] = max_abs_error(out, ref, tol, tol)
            row = dict(row, variant=f"{label} window {window}", case=row["case"] + ", outside the window NaN/-1")
            with CheckRow(rows, row, reraise):
                out = fn(q, pk, pv, ptables, ctx_t, scale, sliding_window=window)
                synchronize(device)
                row["max_abs_err"], row["passed"] = max_abs_error(out, ref_window, tol, tol)
        del kc, vc, pk, pv
        # ---- prefill, one batch per split kind
        for split_name, seqs in K["prefill"].items():
            q_lens = [q_ for q_, _ in seqs]
            ctxs = [c for _, c in seqs]
            kc, vc, tables, ctx_t = random_paged_cache(ctxs, KVH, D, bs, dtype, seed + 100, device=device)
            loc = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32, device=device)
            qp = torch.randn(sum(q_lens), H, D, device=device, dtype=torch.float32).to(dtype)
            ref = reference.paged_prefill_attention(qp, kc, vc, tables, loc, ctx_t, scale)
            row = dict(kernel="prefill", impl=impl_name, variant=split_name, dtype=dtype_name, heads=heads,
                       block=bs, head_dim=D, case=" ".join(f"{a}/{b}" for a, b in seqs) + " (q/ctx)",
                       atol=tol, rtol=tol)
            with CheckRow(rows, row, reraise):
                out = mod.paged_prefill_attention(qp, kc, vc, tables, loc, ctx_t, scale)
                synchronize(device)
                row["max_abs_err"], row["passed"] = max_abs_error(out, ref, tol, tol)
            window = bs + 3
            ref = reference.paged_prefill_attention(qp, kc, vc, tables, loc, ctx_t, scale, sliding_window=window)
            pk, pv, ptables = poison_outside_window(kc, vc, tables, [c - q_ for q_, c in seqs], window)
            row = dict(row, variant=f"{split_name} window {window}", case=row["case"] + ", outside the window NaN/-1")
            with CheckRow(rows, row, reraise):
                out = mod.paged_prefill_attention(qp, pk, pv, ptables, loc, ctx_t, scale, sliding_window=window)
                synchronize(device)
                row["max_abs_err"], row["passed"] = max_abs_error(out, ref, tol, tol)
            del kc, vc, pk, pv
        # ---- reshape_and_cache: random distinct slots, some -1
        n_tok = K["rc_tokens"]
        num_blocks = n_tok // bs + 8
        g = torch.Generator().manual_seed(seed)
        slots = torch.randperm(num_blocks * bs, generator=g)[:n_tok]
        slots[torch.rand(n_tok, generator=g) < 0.05] = -1
        slots = slots.to(device)
        k = torch.randn(n_tok, KVH, D, device=device, dtype=torch.float32).to(dtype)
        v = torch.randn(n_tok, KVH, D, device=device, dtype=torch.float32).to(dtype)
        base_k = torch.randn(num_blocks, bs, KVH, D, device=device, dtype=torch.float32).to(dtype)
        base_v = torch.randn_like(base_k)
        rk, rv, ck, cv = base_k.clone(), base_v.clone(), base_k.clone(), base_v.clone()
        reference.reshape_and_cache(k, v, rk, rv, slots)
        row = dict(kernel="reshape_and_cache", impl=impl_name, variant="-", dtype=dtype_name, heads=heads,
                   block=bs, head_dim=D, case=f"{n_tok} tokens, 5% slot -1", atol=0.0, rtol=0.0)
        with CheckRow(rows, row, reraise):
            mod.reshape_and_cache(k, v, ck, cv, slots)
            synchronize(device)
            err = max(max_abs_error(ck, rk, 0, 0)[0], max_abs_error(cv, rv, 0, 0)[0])
            row["max_abs_err"], row["passed"] = err, err == 0.0
        # ---- copy_blocks: disjoint src/dst over several layers
        L, P = K["cb_layers"], K["cb_pairs"]
        nb = 2 * P + 4
        perm = torch.randperm(nb, generator=g)
        mapping = torch.stack([perm[:P], perm[P:2 * P]], 1).to(device)
        caches = [torch.randn(nb, bs, KVH, D, device=device, dtype=torch.float32).to(dtype) for _ in range(2 * L)]
        ref_c = [c.clone() for c in caches]
        reference.copy_blocks(ref_c[:L], ref_c[L:], mapping)
        row = dict(kernel="copy_blocks", impl=impl_name, variant="-", dtype=dtype_name, heads=heads,
                   block=bs, head_dim=D, case=f"{L} layers x {P} pairs", atol=0.0, rtol=0.0)
        with CheckRow(rows, row, reraise):
            mod.copy_blocks(caches[:L], caches[L:], mapping)
            synchronize(device)
            err = max(max_abs_error(a, b, 0, 0)[0] for a, b in zip(caches, ref_c))
            row["max_abs_err"], row["passed"] = err, err == 0.0
        del caches, ref_c, base_k, base_v, rk, rv, ck, cv


class CheckRow:
    """Appends row on exit; an exception inside (a kernel that fails to compile or launch) becomes
    a failing row carrying the error, and the checks go on (except for the `reraise` kinds)."""

    def __init__(self, rows: list[dict], row: dict, reraise: tuple[type[BaseException], ...] = ()):
        self.rows, self.row, self.reraise = rows, row, reraise

    def __enter__(self):
        return self.row

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, self.reraise):
            return False
        if exc_type is not None:
            self.row.update(max_abs_err=float("nan"), passed=False,
                            error=f"{exc_type.__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:300])
            self.row["traceback"] = "".join(traceback.format_exception(exc_type, exc, tb, limit=6))
        self.rows.append(self.row)
        return True

"""The GPU check's kernel sections (pagesim/experiments/gpu_check.py): 1. correctness against
executor.kernels.reference, 2. bandwidth, 6. the paper's Figs. 18a and 19a."""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
import traceback

from pagesim.experiments.gpu_check_base import Ctx, OuterTimeout


# ------------------------------------------------------------------------------------- 1. correctness

def section_correctness(ctx: Ctx, sec: dict) -> None:
    import importlib.util

    from executor.kernels import torch_ops
    from executor.kernels.testing import TOLERANCE, check_kernels

    rows: list[dict] = []
    device = ctx.device
    have_triton = importlib.util.find_spec("triton") is not None
    jobs = []
    if device.type == "cuda":
        if not have_triton:
            raise RuntimeError("triton is not installed: the CUDA kernels cannot be checked")
        from executor.kernels import triton_ops

        sec["notes"].append("Compiled Triton kernels (executor.kernels.triton_ops) on CUDA tensors at real shapes, "
                            "against executor.kernels.reference (fp32 math) on the same device.")
        jobs.append(("triton (compiled)", triton_ops, ctx.S["kernels"]))
    else:
        sec["notes"].append("CPU: the torch kernels (executor.kernels.torch_ops, what executor.kernels dispatches "
                            "to on CPU) against executor.kernels.reference. Triton kernels are NOT compiled on CPU.")
        jobs.append(("torch_ops (CPU path)", torch_ops, ctx.S["kernels"]))
        if os.environ.get("TRITON_INTERPRET") == "1" and have_triton:
            from executor.kernels import triton_ops

            sec["notes"].append("Triton kernels checked under the interpreter (TRITON_INTERPRET=1) at tiny shapes "
                                "(head dim 32, 4 query heads): a logic check, not a compiled-kernel check.")
            jobs.append(("triton (interpreter)", triton_ops, ctx.S["interp"]))
        else:
            why = "triton is not installed" if not have_triton else "TRITON_INTERPRET=1 is not set"
            sec["notes"].append(f"Triton kernels: SKIPPED on CPU ({why}); set TRITON_INTERPRET=1 before running "
                                "to check them under the interpreter at tiny shapes.")
    sec["notes"].append("Tolerances: |out - ref| <= atol + rtol*|ref|, atol = rtol = "
                        + ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items() if k != "float32")
                        + "; reshape_and_cache and copy_blocks must be bit-exact (0). Prefill cases are "
                        "(new tokens / context) per sequence: prompt = no cached context, chunk = continuation "
                        "of a partly computed prompt, prefix-hit = cached prefix a whole number of blocks.")
    errors = []
    for name, mod, K in jobs:
        t = time.perf_counter()
        try:
            check_kernels(name, mod, K, device, rows, ctx.deadline.remaining, reraise=(OuterTimeout,))
        except OuterTimeout:
            raise
        except Exception:
            errors.append(f"{name}:\n{traceback.format_exc()}")
        sec["data"][f"seconds[{name}]"] = round(time.perf_counter() - t, 2)
    cols = ["kernel", "impl", "variant", "dtype", "heads", "block", "head_dim", "case", "max_abs_err", "atol",
            "passed"] + (["error"] if any("error" in r for r in rows) else [])
    failed_launch = [r for r in rows if "error" in r]
    for err in sorted({r["error"] for r in failed_launch}):
        first = next(r for r in failed_launch if r["error"] == err)
        sec["notes"].append(f"kernel error ({first['kernel']}, {first['dtype']}, {first['heads']}, block "
                            f"{first['block']}): {err}\n```\n{first['traceback'].rstrip()}\n```")
    if device.type == "cuda" and failed_launch:
        # A kernel that does not even run would sink sections 2-4 too: run them on the torch kernels
        # (on the GPU) instead, and say so everywhere.
        os.environ["PAGESIM_KERNELS"] = "torch"
        why = "FALLBACK: a Triton kernel raised in section 1, sections 2-4 use PAGESIM_KERNELS=torch"
        ctx.report.meta["kernel_backend"] = f"torch ({why})"
        sec["notes"].append(why)
    sec["tables"].append(dict(title=None, columns=cols, rows=rows))
    sec["data"]["rows"] = rows
    n_fail = sum(not r["passed"] for r in rows)
    sec["data"]["num_rows"], sec["data"]["num_failed"] = len(rows), n_fail
    sec["notes"].append(f"{len(rows) - n_fail}/{len(rows)} rows pass.")
    if errors:
        raise RuntimeError("\n".join(errors))
    if n_fail:
        sec["status"] = "FAILED rows"


# ------------------------------------------------------------------------------------- 2. bandwidth

def section_bandwidth(ctx: Ctx, sec: dict) -> None:
    import torch
    import torch.nn.functional as F

    from executor import kernels
    from executor.timing import time_calls

    device, B = ctx.device, ctx.S["bw"]
    dtype = torch.bfloat16
    item = 2
    W, R = B["warmup"], B["reps"]
    timer = "CUDA events" if device.type == "cuda" else "time.perf_counter"
    sec["notes"].append(f"bf16. Timing: {timer}, {W} warmup calls, median of {R} (the copy: best of {R}). "
                        "GB/s = 1e9 bytes/s. Copy bytes count read + write; the decode kernel's bytes are the "
                        "K/V it must read (context tokens x KV heads x head dim x 2 bytes x 2) + q + out + "
                        "block tables; frac_of_copy compares that (mostly read) rate with the copy's read+write "
                        "rate. SDPA runs on K/V gathered into contiguous [batch, kv heads, context, dim] "
                        "tensors (enable_gqa for 32/8); sdpa_over_kernel > 1 means the paged kernel is faster, "
                        "sdpa_plus_gather_over_kernel also charges SDPA the gather.")
    if device.type == "cpu":
        sec["notes"].append("CPU: small shapes, one layer; 'kernel' is executor.kernels.paged_attention_decode, "
                            "i.e. the torch path (torch_ops), not Triton.")
    rows_copy = []
    # ---- copy ceiling
    n = B["copy_bytes"] // item
    x = torch.empty(n, dtype=dtype, device=device).normal_()
    times = time_calls(lambda: x.clone(), device, R, W)
    best = min(times)
    copy_gbps = 2 * n * item / best / 1e9
    rows_copy.append(dict(op="tensor.clone (ceiling)", bytes_moved=2 * n * item, time_ms=best * 1e3, GBps=copy_gbps))
    del x
    sec["data"]["copy_GBps"] = copy_gbps

    # ---- decode vs SDPA
    D, bs = B["head_dim"], B["block"]
    scale = D ** -0.5
    rows_dec = []
    for (H, KVH) in B["heads"]:
        for (batch, ctx_len) in B["decode"]:
            if ctx.deadline.remaining() < 20:
                sec["notes"].append(f"skipped decode {batch}x{ctx_len} {H}/{KVH}: out of time")
                continue
            nb = math.ceil(ctx_len / bs)
            num_blocks = batch * nb
            g = torch.Generator().manual_seed(batch * 7 + ctx_len)
            tables = torch.randperm(num_blocks, generator=g).view(batch, nb).to(torch.int32).to(device)
            kc = torch.empty(num_blocks, bs, KVH, D, dtype=dtype, device=device).normal_()
            vc = torch.empty_like(kc).normal_()
            lens = torch.full((batch,), ctx_len, dtype=torch.int32, device=device)
            q = torch.empty(batch, H, D, dtype=dtype, device=device).normal_()
            fn = lambda: kernels.paged_attention_decode(q, kc, vc, tables, lens, scale)  # noqa: E731
            t_kernel = statistics.median(time_calls(fn, device, R, W))
            out = fn()
            kv_bytes = 2 * batch * ctx_len * KVH * D * item
            k_bytes = kv_bytes + 2 * batch * H * D * item + tables.numel() * 4
            row = dict(heads=f"{H}/{KVH}", batch=batch, context=ctx_len, kernel_ms=t_kernel * 1e3,
                       kernel_GBps=k_bytes / t_kernel / 1e9, frac_of_copy=k_bytes / t_kernel / 1e9 / copy_gbps)

            def gather():
                k = kc[tables.long()].view(batch, nb * bs, KVH, D)[:, :ctx_len].transpose(1, 2).contiguous()
                v = vc[tables.long()].view(batch, nb * bs, KVH, D)[:, :ctx_len].transpose(1, 2).contiguous()
                return k, v

            t_gather = statistics.median(time_calls(gather, device, R, W))
            k, v = gather()
            q4 = q.view(batch, H, 1, D)
            gqa = KVH != H
            sdpa_note = ""
            try:
                sdpa = lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=gqa)  # noqa: E731
                ref = sdpa()
            except Exception as e:  # an SDPA without enable_gqa: repeat K/V (counted in the gather)
                sdpa_note = f"enable_gqa failed ({type(e).__name__}); K/V repeated"
                k = k.repeat_interleave(H // KVH, dim=1)
                v = v.repeat_interleave(H // KVH, dim=1)
                sdpa = lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale)  # noqa: E731
                ref = sdpa()
            t_sdpa = statistics.median(time_calls(sdpa, device, R, W))
            err = float((ref.view(batch, H, D).float() - out.float()).abs().max())
            row.update(sdpa_ms=t_sdpa * 1e3, sdpa_GBps=kv_bytes / t_sdpa / 1e9, gather_ms=t_gather * 1e3,
                       sdpa_over_kernel=t_sdpa / t_kernel, sdpa_plus_gather_over_kernel=(t_sdpa + t_gather) / t_kernel,
                       max_abs_diff_vs_sdpa=err)
            if sdpa_note:
                row["note"] = sdpa_note
            rows_dec.append(row)
            del kc, vc, k, v, q, out, ref
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    # ---- cache ops
    rows_ops = []
    H, KVH = B["heads"][0]
    n_tok = B["rc_tokens"]
    num_blocks = n_tok // bs + 16
    g = torch.Generator().manual_seed(3)
    slots = torch.randperm(num_blocks * bs, generator=g)[:n_tok].to(device)
    kc = torch.zeros(num_blocks, bs, KVH, D, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    k = torch.empty(n_tok, KVH, D, dtype=dtype, device=device).normal_()
    v = torch.empty_like(k).normal_()
    t = statistics.median(time_calls(lambda: kernels.reshape_and_cache(k, v, kc, vc, slots), device, R, W))
    moved = 2 * 2 * n_tok * KVH * D * item  # read k, v; write them
    rows_ops.append(dict(op="reshape_and_cache", shape=f"{n_tok} tokens x {KVH} heads x {D}", bytes_moved=moved,
                         time_ms=t * 1e3, GBps=moved / t / 1e9, frac_of_copy=moved / t / 1e9 / copy_gbps))
    del kc, vc, k, v
    L, P = B["cb_layers"], B["cb_pairs"]
    nbk = 2 * P + 4
    perm = torch.randperm(nbk, generator=g)
    mapping = torch.stack([perm[:P], perm[P:2 * P]], 1).to(device)
    kcs = [torch.zeros(nbk, bs, KVH, D, dtype=dtype, device=device) for _ in range(L)]
    vcs = [torch.zeros(nbk, bs, KVH, D, dtype=dtype, device=device) for _ in range(L)]
    t = statistics.median(time_calls(lambda: kernels.copy_blocks(kcs, vcs, mapping), device, R, W))
    moved = 2 * 2 * L * P * bs * KVH * D * item  # K and V blocks, read + write
    rows_ops.append(dict(op="copy_blocks", shape=f"{L} layers x {P} pairs x block {bs}", bytes_moved=moved,
                         time_ms=t * 1e3, GBps=moved / t / 1e9, frac_of_copy=moved / t / 1e9 / copy_gbps))
    del kcs, vcs

    sec["tables"].append(dict(title="Copy ceiling", columns=["op", "bytes_moved", "time_ms", "GBps"], rows=rows_copy))
    sec["tables"].append(dict(
        title=f"Paged decode (executor.kernels, block {bs}, head dim {D}) vs torch SDPA on contiguously gathered K/V",
        columns=["heads", "batch", "context", "kernel_ms", "kernel_GBps", "frac_of_copy", "sdpa_ms", "sdpa_GBps",
                 "gather_ms", "sdpa_over_kernel", "sdpa_plus_gather_over_kernel", "max_abs_diff_vs_sdpa"],
        rows=rows_dec))
    sec["tables"].append(dict(title="Cache ops", columns=["op", "shape", "bytes_moved", "time_ms", "GBps", "frac_of_copy"],
                              rows=rows_ops))
    sec["data"].update(copy=rows_copy, decode=rows_dec, cache_ops=rows_ops)


# ------------------------------------------------------------------------------------- 6. paper figures


def section_paper_figs(ctx: Ctx, sec: dict) -> None:
    """Figs. 18a and 19a measured on this device by the figure scripts' own functions."""
    from pagesim.experiments.fig18_block_size import KERNEL_SHAPES, SMOKE_KERNEL_SHAPES, measure_kernel_latency
    from pagesim.experiments.fig19_swap_recompute import SMOKE_BLOCK_SIZES, SMOKE_MICRO, measure_swap_recompute

    tiny = ctx.mode == "cpu-tiny"
    kernel = measure_kernel_latency(str(ctx.device), SMOKE_KERNEL_SHAPES if tiny else KERNEL_SHAPES, reps=3 if tiny else None)
    swap = (measure_swap_recompute(str(ctx.device), SMOKE_BLOCK_SIZES, SMOKE_MICRO) if tiny
            else measure_swap_recompute(str(ctx.device)))
    sec["notes"].append("Fig. 18a: executor.kernels.paged_attention_decode (block 16, scattered blocks) vs torch SDPA "
                        "on contiguous K/V (paper: paged 20-26% slower than FasterTransformer's kernel). Fig. 19a: "
                        "CacheEngine swap out + in of the tokens' blocks vs a prefill forward over them. Functions "
                        "from pagesim/experiments/fig18_block_size.py and fig19_swap_recompute.py.")
    cols18 = ["batch_size", "context_len", "num_heads", "dtype", "backend", "paged_ms", "contiguous_ms", "overhead"]
    cols19 = ["block_size", "num_blocks", "tokens", "kv_bytes", "swap_out_ms", "swap_in_ms", "swap_ms", "recompute_ms"]
    sec["tables"].append(dict(title="Fig. 18a kernel latency", columns=cols18, rows=[{k: r[k] for k in cols18} for r in kernel]))
    sec["tables"].append(dict(title="Fig. 19a swap vs recompute", columns=cols19, rows=[{k: r[k] for k in cols19} for r in swap]))
    sec["data"].update(fig18a=kernel, fig19a=swap)

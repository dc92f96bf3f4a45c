"""Kernel benchmarks.

  python -m benchmarks.bench_kernels                  on a GPU: Triton kernels vs the torch reference
                                                      (checked against it first); without one, times
                                                      the reference on CPU at small shapes
  python -m benchmarks.bench_kernels --compile-check  compiles every kernel for sm_90 (no GPU needed;
                                                      catches errors the interpreter does not check)
"""

from __future__ import annotations

import argparse
import math
import os
import sys


import torch  # noqa: E402


def make_batch(num_seqs, ctx, num_heads, num_kv_heads, head_dim, block_size, dtype, device):
    blocks_per_seq = math.ceil(ctx / block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    kc = torch.randn(shape, dtype=dtype, device=device)
    vc = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, device=device).to(torch.int32).view(num_seqs, blocks_per_seq)
    ctx_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=device)
    return kc, vc, tables, ctx_lens


def timeit(fn, device) -> float:
    """Median seconds per call (the tree's one timer, executor/timing.py)."""
    from executor.timing import median_ms

    return median_ms(fn, device, reps=100, warmup=25) / 1e3 if device == "cuda" else median_ms(fn, device, reps=5) / 1e3


def bench(device):
    from executor.kernels import reference

    impls = {"reference": reference}
    if device == "cuda":
        from executor.kernels import triton_ops

        impls["triton"] = triton_ops
        dtype, heads, kv_heads, dim, bs = torch.float16, 32, 8, 128, 16
        decode_cases = [(1, 32768), (8, 4096), (64, 2048), (256, 1024)]
        prefill_cases = [(1, 4096, 4096), (4, 2048, 512), (16, 1024, 16)]  # (seqs, ctx, new)
    else:
        dtype, heads, kv_heads, dim, bs = torch.float32, 8, 2, 64, 16
        decode_cases = [(4, 256), (16, 512)]
        prefill_cases = [(2, 256, 256), (4, 512, 16)]
    scale = dim ** -0.5
    print(f"device={device} dtype={dtype} heads={heads}/{kv_heads} head_dim={dim} block={bs}")

    for num_seqs, ctx in decode_cases:
        kc, vc, tables, lens = make_batch(num_seqs, ctx, heads, kv_heads, dim, bs, dtype, device)
        q = torch.randn(num_seqs, heads, dim, dtype=dtype, device=device)
        kv_bytes = 2 * kc.numel() * kc.element_size()
        expected = reference.paged_attention_decode(q, kc, vc, tables, lens, scale)
        for name, ops in impls.items():
            out = ops.paged_attention_decode(q, kc, vc, tables, lens, scale)
            err = (out.float() - expected.float()).abs().max().item()
            t = timeit(lambda: ops.paged_attention_decode(q, kc, vc, tables, lens, scale), device)
            print(f"decode  seqs={num_seqs:4d} ctx={ctx:6d} {name:9s} {t * 1e6:9.1f} us "
                  f"{kv_bytes / t / 1e9:7.1f} GB/s  max_err={err:.1e}")

    for num_seqs, ctx, new in prefill_cases:
        kc, vc, tables, lens = make_batch(num_seqs, ctx, heads, kv_heads, dim, bs, dtype, device)
        q = torch.randn(num_seqs * new, heads, dim, dtype=dtype, device=device)
        loc = torch.arange(0, num_seqs * new + 1, new, dtype=torch.int32, device=device)
        flops = 4 * num_seqs * heads * dim * new * (ctx - new / 2)  # causal QK^T and PV
        expected = reference.paged_prefill_attention(q, kc, vc, tables, loc, lens, scale)
        for name, ops in impls.items():
            out = ops.paged_prefill_attention(q, kc, vc, tables, loc, lens, scale)
            err = (out.float() - expected.float()).abs().max().item()
            t = timeit(lambda: ops.paged_prefill_attention(q, kc, vc, tables, loc, lens, scale), device)
            print(f"prefill seqs={num_seqs:4d} ctx={ctx:6d} new={new:5d} {name:9s} {t * 1e6:9.1f} us "
                  f"{flops / t / 1e12:6.1f} TFLOP/s  max_err={err:.1e}")


def compile_check():
    """Compile each kernel for an sm_90 target through to cubin, for fp16, bf16 and fp32."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("--compile-check needs TRITON_INTERPRET unset")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from executor.kernels import cache_ops, paged_attention, prefill_attention

    int_ptrs = {"block_tables_ptr", "context_lens_ptr", "query_start_loc_ptr"}

    def compile_one(kernel, dtype, consts, ptr_types=None):
        sig = {}
        for name in kernel.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name.endswith("_ptr"):
                default = "*i32" if name in int_ptrs else "*fp32" if name.startswith("part_") else f"*{dtype}"
                sig[name] = (ptr_types or {}).get(name, default)
            else:
                sig[name] = "fp32" if name.startswith("scale") else "i32"
        constexprs = {(kernel.arg_names.index(k),): v for k, v in consts.items()}
        triton.compile(ASTSource(kernel, sig, constexprs), target=GPUTarget("cuda", 90, 32))
        print(f"ok  {kernel.__name__:28s} {dtype:5s} {consts}")

    for dtype in ("fp16", "bf16", "fp32"):
        for part in (0, 512):
            compile_one(paged_attention._decode_kernel, dtype, dict(
                GROUP=4, GROUP_PAD=16, HEAD_DIM=80, D_PAD=128, BLOCK_SIZE=16, TILE_N=32,
                PARTITION_TOKENS=part, UPCAST=False))
        compile_one(prefill_attention._prefill_kernel, dtype, dict(
            GROUP=2, HEAD_DIM=80, D_PAD=128, BLOCK_SIZE=8, BLOCK_M=64, BLOCK_N=64, UPCAST=False))
    compile_one(paged_attention._decode_reduce_kernel, "bf16", dict(
        HEAD_DIM=128, D_PAD=128, NP_PAD=64, PARTITION_TOKENS=512),
        ptr_types={"part_acc_ptr": "*fp32", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32"})
    compile_one(cache_ops._reshape_and_cache_kernel, "fp16", dict(
        NUM_KV_HEADS=8, H_PAD=8, HEAD_DIM=80, D_PAD=128, BLOCK_SIZE=16),
        ptr_types={"key_ptr": "*fp32", "value_ptr": "*fp32", "slot_mapping_ptr": "*i64"})
    compile_one(cache_ops._copy_blocks_kernel, "bf16", dict(CHUNK=1024),
                ptr_types={"mapping_ptr": "*i64"})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-check", action="store_true")
    args = parser.parse_args()
    if args.compile_check:
        compile_check()
    elif torch.cuda.is_available():
        bench("cuda")
    else:
        print("No CUDA device: the Triton kernels need a GPU to be timed. Timing the torch reference on CPU.")
        bench("cpu")


if __name__ == "__main__":
    main()

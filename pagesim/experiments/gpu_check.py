#!/usr/bin/env python
"""One-shot check of the executor on a device: kernel correctness, bandwidth, end-to-end
throughput against transformers, and a step-time profile for the simulator's cost model.

    python -m pagesim.experiments.gpu_check [--device cuda|cpu] [--tiny] --out reports/gpu_check_<device>.md

Writes the markdown report and a .json beside it (same stem) with the raw numbers. Sections:

  1. correctness  kernels against executor.kernels.reference: on CUDA the compiled Triton kernels
                  at real shapes; on CPU the torch kernels (the CPU path) at real-ish shapes and,
                  when TRITON_INTERPRET=1 is set, the Triton kernels under the interpreter at tiny
                  shapes.
  2. bandwidth    device-copy ceiling, paged decode vs. SDPA on gathered K/V, cache ops.
  3. end_to_end   LLMEngine on ShareGPT requests vs. transformers generate() on the same weights.
  4. profile      engine step times on a small grid of iteration shapes.
  5. calibration  pagesim/experiments/fidelity_cpu.py's protocol with a smaller K: executor/profiler.py's grid
                  -> the simulator's `profiled` cost model -> pagesim.compare.compare_repeated on ShareGPT
                  for paged + recompute, paged + swap, Orca (Oracle), chunked prefill and n=4, in
                  interleaved re-profiled rounds: step-level error and the executor's 95 % bands.

Each section is caught on its own: a failure is recorded (with its traceback) and the next one
runs. The report is rewritten after every section, so a run killed from outside still leaves what
it had. A global time budget (--budget-s) shrinks the open-ended parts (the engine run, the HF
batches) to fit. On CPU torch runs with one thread (torch.set_num_threads(1)): torch's OpenMP
threads spin on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import shlex
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SECTIONS = [
    ("correctness", "1. Kernel correctness"),
    ("bandwidth", "2. Bandwidth"),
    ("end_to_end", "3. End-to-end throughput"),
    ("profile", "4. Profile (step times for the cost model)"),
    ("calibration", "5. Calibration (profiled cost model, simulated vs. executor)"),
    ("paper_figs", "6. Paper Figs. 18a and 19a (kernel latency; swap vs recompute)"),
]


class OuterTimeout(Exception):
    """SIGTERM from an outer `timeout`: the current section records it and the rest are skipped."""


# ------------------------------------------------------------------------------------- shapes

def shapes(mode: str) -> dict:
    """Everything size-dependent, per mode: 'cuda', 'cpu' or 'cpu-tiny'."""
    full = [(dt, hk, bs) for dt in ("bfloat16", "float16") for hk in ((32, 8), (32, 32)) for bs in (16, 32)]
    # The interpreter costs a few ms per (program, loop iteration), more on a loaded machine: two
    # combinations (GQA + MHA, both dtypes, both block sizes) at tiny shapes.
    tiny_kernels = dict(
        head_dim=32, combos=[("bfloat16", (4, 2), 16), ("float16", (4, 4), 32)],
        decode_ctx=[1, 16, 17, 40], split_tokens=32,
        prefill={"prompt": [(20, 20), (1, 1)], "chunk": [(5, 37)], "prefix-hit": [(9, 41)]},
        rc_tokens=16, cb_layers=2, cb_pairs=4,
    )
    if mode == "cuda":
        return dict(
            kernels=dict(
                head_dim=128, combos=full,
                decode_ctx=[1, 15, 16, 17, 31, 33, 100, 511, 512, 513, 1500, 4000], split_tokens=512,
                prefill={"prompt": [(1024, 1024), (300, 300), (1, 1), (17, 17)],
                         "chunk": [(256, 768), (77, 122), (512, 2048), (1, 700)],
                         "prefix-hit": [(113, 369), (64, 576), (200, 216)]},
                rc_tokens=4096, cb_layers=4, cb_pairs=128,
            ),
            interp=None,
            bw=dict(copy_bytes=2 << 30, decode=[(b, c) for b in (64, 256) for c in (1024, 4096)],
                    heads=[(32, 32), (32, 8)], head_dim=128, block=16, rc_tokens=8192,
                    cb_layers=32, cb_pairs=256, warmup=3, reps=10),
            model="llama-2-7b", num_requests=500, length_scale=1, hf_batch=32, max_num_seqs=256,
            profile=dict(prefill=[128, 512, 2048], decode_batch=[1, 16, 64], decode_ctx=512, reps=5),
            calibration=dict(grid="gpu", clock="wall", sim_model="llama-2-7b", length_scale=1, num_requests=100,
                             num_gpu_blocks=1024, num_cpu_blocks=2048, max_num_seqs=256, max_num_batched_tokens=2560,
                             max_model_len=2048, repeat=3),
            budget_s=590, engine_cap_s=200, hf_cap_s=100,
        )
    if mode == "cpu":
        return dict(
            kernels=dict(
                head_dim=128, combos=full,
                decode_ctx=[1, 15, 16, 17, 33, 100, 513], split_tokens=None,
                prefill={"prompt": [(200, 200), (1, 1), (17, 17)], "chunk": [(64, 192), (5, 37)],
                         "prefix-hit": [(33, 97), (16, 48)]},
                rc_tokens=512, cb_layers=2, cb_pairs=16,
            ),
            interp=tiny_kernels,
            bw=dict(copy_bytes=64 << 20, decode=[(8, 256)], heads=[(32, 32), (32, 8)], head_dim=128, block=16,
                    rc_tokens=512, cb_layers=2, cb_pairs=32, warmup=1, reps=5),
            model="llama-small", num_requests=16, length_scale=8, hf_batch=8, max_num_seqs=16,
            profile=dict(prefill=[128, 512, 2048], decode_batch=[1, 16, 64], decode_ctx=512, reps=2),
            calibration=dict(grid="tiny", clock="cpu", sim_model="smollm2-135m", length_scale=16, num_requests=24,
                             num_gpu_blocks=24, num_cpu_blocks=64, max_num_seqs=16, max_num_batched_tokens=512,
                             max_model_len=512, repeat=2),
            budget_s=360, engine_cap_s=60, hf_cap_s=60,
        )
    # cpu-tiny
    return dict(
        kernels=dict(tiny_kernels, head_dim=64, combos=[("bfloat16", (8, 2), 16), ("float16", (8, 8), 32)],
                     split_tokens=None, decode_ctx=[1, 15, 16, 17, 33, 70], rc_tokens=64),
        interp=tiny_kernels,
        bw=dict(copy_bytes=16 << 20, decode=[(4, 128)], heads=[(32, 32), (32, 8)], head_dim=128, block=16,
                rc_tokens=256, cb_layers=2, cb_pairs=16, warmup=1, reps=3),
        model="llama-tiny", num_requests=8, length_scale=16, hf_batch=4, max_num_seqs=8,
        profile=dict(prefill=[128, 512, 2048], decode_batch=[1, 16, 64], decode_ctx=128, reps=2),
        calibration=dict(grid="tiny", clock="cpu", sim_model="smollm2-135m", length_scale=32, num_requests=8,
                         num_gpu_blocks=12, num_cpu_blocks=32, max_num_seqs=8, max_num_batched_tokens=256,
                         max_model_len=256, repeat=2),
        budget_s=150, engine_cap_s=20, hf_cap_s=20,
    )


def llama_config(name: str):
    from transformers import LlamaConfig

    common = dict(rope_theta=10000.0, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  rms_norm_eps=1e-5, max_position_embeddings=4096)
    if name == "llama-2-7b":
        return LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=32, **common)
    if name == "llama-small":
        return LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=4, **common)
    if name == "llama-tiny":
        return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, **common)
    raise ValueError(name)


# ------------------------------------------------------------------------------------- helpers

class Deadline:
    def __init__(self, seconds: float):
        self.start = time.perf_counter()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        return self.seconds - self.elapsed()


def finite_json(obj):
    """Replace non-finite floats (json cannot hold them portably) by strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def fmt(v) -> str:
    if isinstance(v, bool):
        return "PASS" if v else "FAIL"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if not math.isfinite(v):
            return str(v)
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.01:
            return f"{v:.3f}"
        return f"{v:.2e}"
    return str(v)


def md_table(columns, rows) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |")
    return lines


# ------------------------------------------------------------------------------------- report

class Report:
    def __init__(self, out_md: Path, meta: dict):
        self.md_path = out_md
        self.json_path = out_md.with_suffix(".json")
        self.meta = meta
        self.sections = {key: {"title": title, "status": "not run", "notes": [], "tables": [], "data": {}}
                         for key, title in SECTIONS}

    def write(self) -> None:
        self.meta["wall_s"] = round(time.perf_counter() - self.meta["_t0"], 2)
        self.md_path.parent.mkdir(parents=True, exist_ok=True)
        meta = {k: v for k, v in self.meta.items() if not k.startswith("_")}
        self.json_path.write_text(json.dumps(finite_json({"meta": meta, "sections": self.sections}), indent=1))
        m = meta
        lines = [
            f"# Executor device check: {m['device_name']}",
            "",
            f"- device: `{m['device']}` — {m['device_name']}",
            f"- torch {m['torch']} (CUDA {m['torch_cuda']}), triton {m['triton']} "
            f"({m['triton_mode']}), transformers {m['transformers']}, python {m['python']}",
            f"- kernel backend executor.kernels picks for this device: `{m['kernel_backend']}`",
            f"- threads: {m['threads']}",
            f"- command: `{m['command']}`",
            f"- started {m['started']}, wall time {m['wall_s']} s (budget {m['budget_s']} s)",
            f"- raw numbers: `{self.json_path.name}`",
            "",
        ]
        for key, _ in SECTIONS:
            s = self.sections[key]
            lines += [f"## {s['title']}", "", f"status: **{s['status']}**", ""]
            for note in s["notes"]:
                lines.append(f"- {note}")
            if s["notes"]:
                lines.append("")
            for t in s["tables"]:
                if t.get("title"):
                    lines += [f"**{t['title']}**", ""]
                lines += md_table(t["columns"], t["rows"]) + [""]
            if s.get("error"):
                lines += ["```", s["error"].rstrip(), "```", ""]
        self.md_path.write_text("\n".join(lines))


class Ctx:
    """What the sections share."""

    def __init__(self, args, device, mode, deadline, report):
        self.args, self.device, self.mode, self.deadline, self.report = args, device, mode, deadline, report
        self.S = shapes(mode)
        self.killed = False
        self.lm = None  # our model (section 3 builds it, section 4 reuses it)
        self.hf = None
        self.requests = None


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


# ------------------------------------------------------------------------------------- 3. end to end

def build_models(ctx: Ctx, sec: dict) -> None:
    """HF LlamaForCausalLM built directly on the device in the run's dtype (no fp32 copy), seeded by
    loader.random_init, and ours from it (loader.from_hf_model). Falls back to ours alone
    (loader.from_config) when HF cannot be built."""
    import torch

    from executor.models.loader import default_dtype, from_config, from_hf_model, random_init

    device = ctx.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = llama_config(ctx.S["model"])
    info = dict(model=ctx.S["model"], dtype=str(dtype).replace("torch.", ""))
    t = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        from transformers import LlamaForCausalLM

        with torch.device(device), default_dtype(dtype):
            hf = LlamaForCausalLM(config)
        hf.eval().requires_grad_(False)
        random_init(hf, config, seed=0)
        info["hf_build_s"] = round(time.perf_counter() - t, 2)
        info["hf_param_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in hf.parameters()})
        t2 = time.perf_counter()
        lm = from_hf_model(hf, dtype=dtype, device=device)
        info["ours_from_hf_s"] = round(time.perf_counter() - t2, 2)
        ctx.hf = hf
    except OuterTimeout:
        raise
    except Exception:
        sec["notes"].append("building the HF model failed; ours is built alone (from_config), no HF comparison:\n"
                            + traceback.format_exc(limit=3))
        ctx.hf = None
        lm = from_config(config, seed=0, dtype=dtype, device=device)
    info["num_params"] = sum(p.numel() for p in lm.model.parameters())
    info["our_param_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in lm.model.parameters()})
    info["build_s"] = round(time.perf_counter() - t, 2)
    if device.type == "cuda":
        info["peak_mem_after_build_GiB"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        info["weights_GiB_each"] = round(info["num_params"] * 2 / 2**30, 2)
    ctx.lm = lm
    sec["data"]["model"] = info
    sec["notes"].append(
        f"model {info['model']}: {info['num_params'] / 1e6:,.1f} M params, {info['dtype']}, random weights, built in "
        f"{info['build_s']} s" + (f"; peak GPU memory after building HF + ours {info['peak_mem_after_build_GiB']} GiB "
                                  f"(2 x {info['weights_GiB_each']} GiB of weights: no fp32 copy)"
                                  if device.type == "cuda" else ""))


def load_requests(ctx: Ctx) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) for the first N ShareGPT records, lengths divided by the mode's
    scale; prompts are seeded random ids (the trace has lengths only)."""
    data = json.loads((ROOT / "traces" / "sharegpt.json").read_text())
    recs = data["requests"][: ctx.S["num_requests"]]
    scale = ctx.S["length_scale"]
    vocab = ctx.lm.vocab_size
    out = []
    for i, r in enumerate(recs):
        p = max(1, r["prompt_len"] // scale)
        o = max(1, r["output_len"] // scale)
        rng = random.Random(i)
        out.append(([rng.randrange(4, vocab) for _ in range(p)], o))
    return out


def run_engine(ctx: Ctx, sec: dict) -> dict:
    import torch

    from executor.cache_engine import CacheEngine, num_gpu_blocks
    from executor.engine import EngineConfig, LLMEngine
    from pagesim.core import SamplingParams

    lm, device, reqs = ctx.lm, ctx.device, ctx.requests
    bs = 16
    block_bytes = CacheEngine.bytes_per_block(lm.num_layers, lm.num_kv_heads, lm.head_dim, bs, lm.dtype)
    if device.type == "cuda":
        # The HF copy stays resident during the run; 8 GiB kept back for activations.
        n_blocks = num_gpu_blocks(block_bytes, device, fraction=0.9, reserve_bytes=8 << 30)
        how = "num_gpu_blocks(fraction=0.9, reserve 8 GiB) from free GPU memory"
    else:
        need = sum(math.ceil((len(p) + o) / bs) for p, o in reqs) + 64
        n_blocks = num_gpu_blocks(block_bytes, device, fraction=0.9, budget_bytes=int(need * block_bytes / 0.9) + 1)
        how = "num_gpu_blocks(budget_bytes = what the requests need) (CPU: no device memory to measure)"
    cfg = EngineConfig(block_size=bs, num_gpu_blocks=n_blocks, num_cpu_blocks=64, max_num_seqs=ctx.S["max_num_seqs"])
    engine = LLMEngine(lm, cfg)
    engine.generate([[5] * 20, [6] * 33], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warmup
    budget = min(ctx.S["engine_cap_s"], max(5.0, ctx.deadline.remaining() - (0.35 * ctx.deadline.remaining())))
    groups = [engine.add_request(p, SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True)) for p, o in reqs]
    step_log = []
    t0 = time.perf_counter()
    now = 0.0
    cut = False
    while engine.has_unfinished():
        st = engine.step(now)
        now += 1.0
        step_log.append([st.out.num_prefill_tokens, st.out.num_decode_seqs, round(st.seconds, 6)])
        if time.perf_counter() - t0 > budget:
            cut = True
            break
    wall = time.perf_counter() - t0
    out_tokens = sum(s.num_output_tokens for g in groups for s in list(g.seqs) + list(g.finished_seqs))
    finished = sum(g.is_finished for g in groups)
    prompt_tokens = sum(len(p) for p, _ in reqs)
    res = dict(num_requests=len(reqs), finished=finished, complete=not cut, budget_s=round(budget, 1),
               num_gpu_blocks=n_blocks, kv_token_slots=n_blocks * bs, pool_sizing=how,
               max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=engine.scheduler.config.max_num_batched_tokens
               if hasattr(engine.scheduler, "config") else None,
               steps=len(step_log), preemptions=engine.scheduler.num_preemptions, wall_s=wall,
               output_tokens=out_tokens, prompt_tokens=prompt_tokens, output_tok_per_s=out_tokens / wall,
               mean_step_ms=1e3 * sum(s[2] for s in step_log) / max(1, len(step_log)))
    ctx.engine_outputs = {i: (g.finished_seqs[0].output_token_ids if g.finished_seqs else []) for i, g in enumerate(groups)}
    sec["data"]["engine_step_log"] = step_log  # [prefill tokens, decode seqs, seconds] per step
    del engine
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def run_hf(ctx: Ctx, sec: dict) -> dict:
    import torch

    from executor.timing import synchronize

    hf, device, reqs = ctx.hf, ctx.device, ctx.requests
    bsz = ctx.S["hf_batch"]
    budget = min(ctx.S["hf_cap_s"], max(3.0, ctx.deadline.remaining() - 12))
    # warmup (cuBLAS, kernels)
    hf.generate(torch.tensor([[5] * 8], device=device), attention_mask=torch.ones(1, 8, dtype=torch.long, device=device),
                max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)
    synchronize(device)
    batches = [list(range(i, min(len(reqs), i + bsz))) for i in range(0, len(reqs), bsz)]
    done, outputs = [], {}
    spent = 0.0
    for idx in batches:
        m = max(reqs[i][1] for i in idx)
        if done:
            per_step = spent / sum(b["generated_steps"] for b in done)
            if spent + per_step * m > budget:
                break
        L = max(len(reqs[i][0]) for i in idx)
        ids = torch.zeros(len(idx), L, dtype=torch.long)
        mask = torch.zeros(len(idx), L, dtype=torch.long)
        for j, i in enumerate(idx):  # left padding
            p = reqs[i][0]
            ids[j, L - len(p):] = torch.tensor(p)
            mask[j, L - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        synchronize(device)
        t = time.perf_counter()
        # max_time: HF's own stopping criterion, so even a first batch slower than expected ends
        # inside the budget; a cut batch counts only the tokens it produced.
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=m, min_new_tokens=m, do_sample=False, pad_token_id=0,
                          max_time=max(1.0, budget - spent))
        synchronize(device)
        dt = time.perf_counter() - t
        spent += dt
        new = out[:, L:].cpu()
        steps = int(new.shape[1])
        for j, i in enumerate(idx):
            outputs[i] = new[j, :reqs[i][1]].tolist()
        done.append(dict(size=len(idx), max_new_tokens=m, generated_steps=steps, cut=steps < m,
                         useful_tokens=sum(min(reqs[i][1], steps) for i in idx), padded_tokens=len(idx) * steps,
                         seconds=dt))
        if steps < m:
            break
    useful = sum(b["useful_tokens"] for b in done)
    steps_done = sum(b["generated_steps"] for b in done)
    per_step = spent / steps_done
    all_steps = sum(max(reqs[i][1] for i in idx) for idx in batches)
    total_useful = sum(o for _, o in reqs)
    est_time = per_step * all_steps
    res = dict(batch_size=bsz, batches_run=len(done), batches_total=len(batches),
               last_batch_cut=bool(done and done[-1]["cut"]),
               requests_run=sum(b["size"] for b in done), budget_s=round(budget, 1), wall_s=spent,
               useful_tokens=useful, useful_tok_per_s=useful / spent,
               padded_tok_per_s=sum(b["padded_tokens"] for b in done) / spent, per_step_ms=per_step * 1e3,
               est_full_s=est_time, est_full_useful_tok_per_s=total_useful / est_time,
               useful_fraction_all_batches=total_useful / sum(len(idx) * max(reqs[i][1] for i in idx) for idx in batches),
               batches=done)
    # Greedy agreement with the engine (information only: bf16 and padding change the numerics).
    eng = getattr(ctx, "engine_outputs", {})
    pref, full = [], 0
    for i, toks in outputs.items():
        e = eng.get(i)
        if not e:
            continue
        n = 0
        while n < min(len(e), len(toks)) and e[n] == toks[n]:
            n += 1
        pref.append(n / max(1, len(toks)))
        full += n == len(toks) == len(e)
    if pref:
        res["greedy_agree_full"] = f"{full}/{len(pref)}"
        res["greedy_agree_mean_prefix_frac"] = sum(pref) / len(pref)
    return res


def section_end_to_end(ctx: Ctx, sec: dict) -> None:
    if ctx.lm is None:
        raise RuntimeError("no model: building it failed (see notes)")
    S = ctx.S
    ctx.requests = load_requests(ctx)
    reqs = ctx.requests
    sec["notes"].append(
        f"{len(reqs)} ShareGPT requests (traces/sharegpt.json, first {len(reqs)}; lengths"
        + (f" divided by {S['length_scale']}" if S["length_scale"] > 1 else " as in the trace")
        + f"; seeded random prompt ids), all submitted at once, greedy, ignore_eos, max_tokens = the trace's "
        f"output length. Prompt tokens {sum(len(p) for p, _ in reqs)}, output tokens {sum(o for _, o in reqs)}.")
    errors = []
    rows = []
    eng = hf = None
    try:
        eng = run_engine(ctx, sec)
        sec["data"]["engine"] = eng
        rows.append(dict(system="pagesim executor (LLMEngine, paged KV)", requests=f"{eng['finished']}/{eng['num_requests']}",
                         wall_s=eng["wall_s"], useful_tok_per_s=eng["output_tok_per_s"],
                         detail=f"{eng['steps']} steps, mean {eng['mean_step_ms']:.1f} ms/step, "
                                f"{eng['preemptions']} preemptions, {eng['kv_token_slots']} KV slots, "
                                f"max_num_seqs {eng['max_num_seqs']}" + ("" if eng["complete"] else
                                                                          f"; CUT at the {eng['budget_s']} s budget")))
        sec["notes"].append(f"engine KV pool: {eng['num_gpu_blocks']} blocks of 16 tokens, sized by {eng['pool_sizing']}.")
    except OuterTimeout:
        raise
    except Exception:
        errors.append("engine:\n" + traceback.format_exc())
    if ctx.hf is None:
        sec["notes"].append("transformers generate: not run (no HF model).")
    else:
        try:
            hf = run_hf(ctx, sec)
            sec["data"]["hf"] = hf
            rows.append(dict(system=f"transformers generate (static batches of {hf['batch_size']}, left padding)",
                             requests=f"{hf['requests_run']}/{len(reqs)}", wall_s=hf["wall_s"],
                             useful_tok_per_s=hf["useful_tok_per_s"],
                             detail=f"{hf['batches_run']}/{hf['batches_total']} batches (trace order"
                                    f"{'; the last one cut by max_time' if hf['last_batch_cut'] else ''}), "
                                    f"{hf['per_step_ms']:.1f} ms/step, padded tok/s {hf['padded_tok_per_s']:.1f}"))
            rows.append(dict(system="transformers generate, extrapolated to all batches", requests=f"{len(reqs)}",
                             wall_s=hf["est_full_s"], useful_tok_per_s=hf["est_full_useful_tok_per_s"],
                             detail=f"measured ms/step x sum of every batch's longest output; useful/padded tokens "
                                    f"over all batches {hf['useful_fraction_all_batches']:.2f}"))
            if hf["batches_run"] < hf["batches_total"] or hf["last_batch_cut"]:
                sec["notes"].append(
                    f"HF ran {hf['batches_run']} of {hf['batches_total']} batches (first ones in trace order) within "
                    f"{hf['budget_s']} s; its tokens/s counts only useful tokens (each request's own output length, "
                    "not the padding up to the batch's longest). The extrapolation assumes the measured time per "
                    "decode step holds for the other batches (longer batches would be slower per step: optimistic for HF).")
            if "greedy_agree_full" in hf:
                sec["notes"].append(f"greedy tokens engine vs HF (info only): {hf['greedy_agree_full']} requests identical, "
                                    f"mean matching prefix {hf['greedy_agree_mean_prefix_frac']:.2f} of the output.")
        except OuterTimeout:
            raise
        except Exception:
            errors.append("transformers:\n" + traceback.format_exc())
    if eng and hf:
        sec["data"]["speedup_vs_hf_measured"] = eng["output_tok_per_s"] / hf["useful_tok_per_s"]
        sec["data"]["speedup_vs_hf_extrapolated"] = eng["output_tok_per_s"] / hf["est_full_useful_tok_per_s"]
        sec["notes"].append(f"engine / HF useful tokens/s: {sec['data']['speedup_vs_hf_measured']:.2f}x measured "
                            f"subset, {sec['data']['speedup_vs_hf_extrapolated']:.2f}x extrapolated.")
    sec["tables"].append(dict(title=None, columns=["system", "requests", "wall_s", "useful_tok_per_s", "detail"], rows=rows))
    if errors:
        raise RuntimeError("\n".join(errors))


# ------------------------------------------------------------------------------------- 4. profile

def section_profile(ctx: Ctx, sec: dict) -> None:
    """Step times of the section 3 model at a few shapes, measured by executor.profiler (the same
    code that profiles for the simulator's `profiled` cost model), on the wall clock."""
    import torch

    from executor.profiler import ProfileGrid, profile_engine

    if ctx.lm is None:
        raise RuntimeError("no model: building it failed (see section 3)")
    device, P = ctx.device, ctx.S["profile"]
    grid = ProfileGrid(prefill=[(1, n) for n in P["prefill"]], decode=[(b, P["decode_ctx"]) for b in P["decode_batch"]],
                       mixed=[], swap_blocks=[], copy_blocks=[], reps=P["reps"], max_reps=P["reps"])
    data = profile_engine(ctx.lm, grid, clock="wall", model_spec=ctx.S["model"])
    raw = []
    for step in data["steps"]:
        shape, times = step["shape"], step["samples"]
        decode_seqs = shape["num_decode_seqs"]
        raw.append(dict(kind=step["kind"], num_seqs=shape["num_prefill_seqs"] or decode_seqs,
                        prefill_tokens=shape["num_prefill_tokens"], decode_seqs=decode_seqs,
                        context=shape["decode_context_tokens"] // decode_seqs if decode_seqs else shape["num_prefill_tokens"],
                        median_ms=step["seconds"] * 1e3, min_ms=min(times) * 1e3, reps=len(times), step_s=times))
    rows = [{k: v for k, v in r.items() if k != "step_s"} for r in raw]
    sec["notes"].append(f"LLMEngine.step() wall time (schedule + forward + sampling; synchronised on CUDA) on the "
                        f"section 3 model ({ctx.S['model']}), block 16, measured by executor.profiler (untimed warm-up "
                        f"steps first; {P['reps']} steps per shape, median): one sequence per prefill shape; decode "
                        f"batches after prompts of {P['decode_ctx'] - 1} tokens (context = the middle timed step's, "
                        "per sequence).")
    sec["tables"].append(dict(title=None, columns=["kind", "num_seqs", "prefill_tokens", "decode_seqs", "context",
                                                   "median_ms", "min_ms", "reps"], rows=rows))
    sec["data"]["shapes"] = raw
    sec["data"]["profile_wall_s"] = data["profile_wall_s"]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- 5. calibration

def section_calibration(ctx: Ctx, sec: dict) -> None:
    """The fidelity protocol of pagesim/experiments/fidelity_cpu.py on this device, with a smaller K: profile
    the section 3 model (executor.profiler), the five runs (paged + recompute, paged + swap, Orca
    (Oracle), chunked prefill, n=4) near the simulated capacity, K interleaved rounds (re-profiled),
    the simulator on the pooled profile; step-level error and the executor's 95 % bands. K shrinks
    (to 2 at least) to fit the time left, from the simulated run times."""
    from dataclasses import replace

    from executor.profiler import ProfileGrid
    from pagesim.experiments.fidelity_cpu import Protocol, estimate_s, run_specs
    from pagesim.compare import CompareSettings, compare_repeated, profile_round, scaled_trace, write_repeated_results
    from pagesim.sim.cost.profiled import ProfiledCostModel
    from pagesim.workload.trace import load_trace

    if ctx.lm is None:
        raise RuntimeError("no model: building it failed (see section 3)")
    C = ctx.S["calibration"]
    grid = {"gpu": ProfileGrid.gpu, "tiny": ProfileGrid.tiny, "default": ProfileGrid}[C["grid"]]()
    out = ctx.report.md_path
    data_dir = out.with_name(out.stem + "_fidelity")
    started = time.perf_counter()
    first = profile_round(ctx.lm, data_dir / "profiles" / "round1.json", C["clock"], 16, grid,
                          command=ctx.report.meta["command"])
    profile_s = time.perf_counter() - started
    fit = ProfiledCostModel.from_profile(first).describe()
    sec["data"]["profile"] = str(first)
    sec["data"]["fit"] = {k: fit[k] for k in ("coefficients", "train_error", "held_out_error", "swap_error", "copy_error")}
    held = fit["held_out_error"]
    sec["notes"].append(f"profile: {C['clock']} clock, {profile_s:.0f} s, written to {data_dir.name}/profiles/; fit "
                        f"error on held-out shapes: mean {held['mean_abs'] * 100:.1f} %, max {held['max_abs'] * 100:.1f} %.")
    trace = scaled_trace(load_trace(ROOT / "traces" / "sharegpt.json"), C["length_scale"])
    proto = Protocol(ctx.S["model"], "traces/sharegpt.json", C["length_scale"], C["num_requests"], C["repeat"], True,
                     C["grid"], CompareSettings(num_requests=C["num_requests"], num_gpu_blocks=C["num_gpu_blocks"],
                                                num_cpu_blocks=C["num_cpu_blocks"], max_num_seqs=C["max_num_seqs"],
                                                max_num_batched_tokens=C["max_num_batched_tokens"],
                                                max_model_len=C["max_model_len"], clock=C["clock"],
                                                sim_model=C["sim_model"]))
    specs, caps = run_specs(trace, proto, str(first))
    repeat = C["repeat"]
    while repeat > 2 and estimate_s(trace, specs, replace(proto, repeat=repeat), str(first), profile_s) > \
            ctx.deadline.remaining():
        repeat -= 1
    estimate = estimate_s(trace, specs, replace(proto, repeat=repeat), str(first), profile_s)
    sec["data"].update(repeat=repeat, estimate_s=round(estimate, 1), capacities=caps)
    sec["notes"].append(f"{C['num_requests']} ShareGPT requests (lengths / {C['length_scale']}; the n=4 run "
                        f"{specs[-1].settings.num_requests}), Poisson at 0.9 x the simulated capacity: "
                        + ", ".join(f"{sp.label} {sp.settings.rate} req/s" for sp in specs)
                        + f"; pool {C['num_gpu_blocks']} blocks, host {C['num_cpu_blocks']}; K = {repeat} rounds "
                        f"(asked {C['repeat']}), estimated {estimate:.0f} s.")
    if estimate > ctx.deadline.remaining():
        sec["notes"].append(f"skipped: K = 2 needs about {estimate:.0f} s, {ctx.deadline.remaining():.0f} s left")
        return
    results, used = compare_repeated(ctx.lm, trace, specs, None, repeat, data_dir, reprofile=True, profile_grid=grid,
                                     round1_profile=str(first), log=lambda msg: print(f"[gpu_check] {msg}", flush=True))
    write_repeated_results(results, data_dir, {"command": ctx.report.meta["command"], "capacities": caps,
                                               "simulator_profile": used, "repeat": repeat})
    sec["notes"].append(f"data: {data_dir.name}/ (compare.json, compare.md, every run's step_shapes.csv); the simulator "
                        "used the rounds' pooled profile.")
    step_rows, band_rows = [], []
    for r in results:
        for kind, e in r.step_fidelity.items():
            step_rows.append(dict(system=r.label, step_kind=kind, steps=e["count"],
                                  median_abs=e["median_abs"], p90_abs=e["p90_abs"], bias=e["bias"]))
        for b in r.bands:
            band_rows.append(dict(system=r.label, metric=b["label"], executor_mean=b["mean"], low=b["low"],
                                  high=b["high"], simulator=b["simulator"],
                                  target="-" if b["target_met"] is None else ("met" if b["target_met"] else "missed")))
        sec["data"][r.label] = {"bands": r.bands, "step_fidelity": r.step_fidelity,
                                "speed_vs_profile": [run["speed_vs_profile"] for run in r.runs]}
    sec["tables"].append(dict(title="step-level error (all runs pooled)", columns=list(step_rows[0]), rows=step_rows))
    sec["tables"].append(dict(title="executor mean and 95 % band vs simulator", columns=list(band_rows[0]),
                              rows=band_rows))


# ------------------------------------------------------------------------------------- paper figures

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


# ------------------------------------------------------------------------------------- main

def _versions():
    import importlib.metadata as md

    out = {}
    for name in ("torch", "triton", "transformers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and model (CPU smoke run)")
    ap.add_argument("--out", default=None, help="markdown path (default reports/gpu_check_<device>.md); json beside it")
    ap.add_argument("--budget-s", type=float, default=None, help="overall time budget (default per mode)")
    ap.add_argument("--sections", default=",".join(k for k, _ in SECTIONS), help="comma-separated subset")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    t0 = time.perf_counter()
    import torch

    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name == "cuda" and not torch.cuda.is_available():
        print("--device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.device(device_name)
    mode = "cuda" if device.type == "cuda" else ("cpu-tiny" if args.tiny else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
        threads = "torch.set_num_threads(1) (CPU run: OpenMP threads spin on a shared machine)"
    else:
        threads = f"torch CPU threads {torch.get_num_threads()}"
    S = shapes(mode)
    budget = args.budget_s or S["budget_s"]
    out = Path(args.out or f"reports/gpu_check_{device.type}.md")
    from executor import kernels

    v = _versions()
    env = " ".join(f"{k}={os.environ[k]}" for k in ("TRITON_INTERPRET", "OMP_NUM_THREADS", "PAGESIM_KERNELS")
                   if k in os.environ)
    meta = dict(
        _t0=t0, device=device_name,
        device_name=(torch.cuda.get_device_name(device) if device.type == "cuda"
                     else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"),
        torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
        triton=v["triton"], transformers=v["transformers"], python=platform.python_version(),
        triton_mode=("compiled" if device.type == "cuda" else
                     "interpreter, TRITON_INTERPRET=1" if os.environ.get("TRITON_INTERPRET") == "1" else "not run"),
        kernel_backend=kernels.backend(device), threads=threads, mode=mode, budget_s=budget,
        command=(env + " " if env else "") + "python -m pagesim.experiments.gpu_check " + shlex.join(argv),
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    if device.type == "cuda":
        meta["gpu_total_GiB"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    report = Report(out, meta)
    deadline = Deadline(budget - (time.perf_counter() - t0))
    ctx = Ctx(args, device, mode, deadline, report)
    wanted = set(args.sections.split(","))

    def on_term(signum, frame):
        ctx.killed = True
        raise OuterTimeout(f"signal {signum} (outer timeout)")

    old = None
    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        pass

    funcs = dict(correctness=section_correctness, bandwidth=section_bandwidth, end_to_end=section_end_to_end,
                 profile=section_profile, calibration=section_calibration)
    # Run order: the profile reuses section 3's model and runs before the long end-to-end part;
    # the calibration (also on that model) comes last.
    order = ["correctness", "bandwidth", "_build", "profile", "end_to_end", "calibration"]
    funcs["paper_figs"] = section_paper_figs  # Figs. 18a / 19a (pagesim/experiments/fig18_*, fig19_*)
    order.append("paper_figs")
    try:
        for key in order:
            sec = report.sections["end_to_end"] if key == "_build" else report.sections[key]
            if key != "_build" and key not in wanted:
                sec["status"] = "skipped (not requested)"
                continue
            if key == "_build" and not ({"end_to_end", "profile", "calibration"} & wanted):
                continue
            if ctx.killed or deadline.remaining() < 3:
                if key != "_build":
                    sec["status"] = "skipped: out of time" if not ctx.killed else "skipped: killed by outer timeout"
                continue
            t = time.perf_counter()
            print(f"[gpu_check] {key} ... ({deadline.elapsed():.0f} s elapsed)", flush=True)
            try:
                if key == "_build":
                    build_models(ctx, sec)
                else:
                    sec["status"] = "ok"
                    funcs[key](ctx, sec)
            except BaseException as e:  # noqa: BLE001 - record everything, go on
                sec["status"] = "error" if not isinstance(e, OuterTimeout) else "killed by outer timeout"
                sec["error"] = (sec.get("error", "") + "\n" + traceback.format_exc()).strip()
                print(f"[gpu_check] {key} failed: {type(e).__name__}: {e}", flush=True)
                if isinstance(e, KeyboardInterrupt):
                    raise
            finally:
                sec["data"][f"section_s{'_build' if key == '_build' else ''}"] = round(time.perf_counter() - t, 2)
                report.write()
            status = ("model built" if "model" in sec["data"] else "model build failed") if key == "_build" else sec["status"]
            print(f"[gpu_check] {key}: {status} in {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        report.write()
    print(f"[gpu_check] wrote {report.md_path} and {report.json_path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0 if all(s["status"] in ("ok",) or s["status"].startswith("skipped (not")
                    for s in report.sections.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

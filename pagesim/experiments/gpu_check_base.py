"""What the GPU check's sections share (pagesim/experiments/gpu_check.py): the shapes per mode, the
tiny Llama configs, the deadline, and the report written after every section."""

from __future__ import annotations

import json
import math
import os
import time
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

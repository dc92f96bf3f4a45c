"""What writing the results folder's CSVs costs: steps.csv and requests.csv written from two 10k
replays (main: OPT-13B on an A100-40GB, 200,912 steps; chunked: Llama-2-7B on an A100-80GB with
chunked prefill, 490,302 steps), timed in-process apart from the replay, in nanoseconds a line.

A whole `replay --out` command's time is mostly the replay: on a shared machine its noise hides a
change to the writers (a few per cent of the command), and instruction counts miss most of it
(fewer cache misses and allocations, which callgrind does not weigh). Timing the writers alone,
the best of several writes, shows it. `--peer TREE` times another source tree's writers the same
way, each round one process of this tree then one of the peer's (both replay the same requests),
so that both see the same machine.

Usage:  python -m benchmarks.bench_writers --out /tmp/x.md [--rounds 3] [--repeat 3] [--peer TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPLAYS = {
    "main": dict(rate=2.0, num_requests=10_000),
    "chunked": dict(rate=2.0, num_requests=10_000, model="llama-2-7b", gpu="a100-80gb", chunked_prefill=True,
                    max_num_batched_tokens=4096),
}


def measure(repeat: int) -> dict:
    """{replay: {"steps": seconds, "requests": seconds, "lines": steps}}, each the best of
    `repeat` writes (run inside the tree whose pagesim is imported)."""
    from pagesim.api import finish_replay, prepare_replay
    from pagesim.metrics import files
    from pagesim.workload.trace import load_trace

    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    found = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, options in REPLAYS.items():
            metrics = finish_replay(prepare_replay(trace, keep_steps=True, **options), "sharegpt").metrics
            steps, requests = [], []
            for _ in range(repeat):
                start = time.perf_counter()
                files.write_steps_csv(Path(folder) / "steps.csv", metrics.step_log)
                steps.append(time.perf_counter() - start)
                start = time.perf_counter()
                files.write_requests_csv(Path(folder) / "requests.csv", metrics.requests)
                requests.append(time.perf_counter() - start)
            found[name] = {"steps": min(steps), "requests": min(requests), "lines": len(metrics.step_log),
                           "rows": len(metrics.requests)}
    return found


def run_tree(tree: Path, repeat: int) -> dict:
    """measure() in a process of its own that imports tree's pagesim."""
    env = dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1")
    code = f"import json, runpy; m = runpy.run_path({str(Path(__file__).resolve())!r}); " \
           f"print(json.dumps(m['measure']({repeat})))"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"writers in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best(runs: list[dict]) -> dict:
    """The best time of each writer over the rounds."""
    return {name: {key: (min(r[name][key] for r in runs) if key in ("steps", "requests") else runs[0][name][key])
                   for key in runs[0][name]} for name in runs[0]}


def main() -> int:
    from benchmarks.profile_sim import write_report  # (here: a peer's process runs this file's measure() alone)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3, help="processes of each tree, interleaved")
    ap.add_argument("--repeat", type=int, default=3, help="writes of each file in a process (the best counts)")
    ap.add_argument("--peer", type=Path, help="another source tree, timed the same way")
    args = ap.parse_args()
    ours, peer = [], []
    for _ in range(args.rounds):
        ours.append(run_tree(ROOT, args.repeat))
        if args.peer:
            peer.append(run_tree(args.peer.resolve(), args.repeat))
    ours_best, peer_best = best(ours), (best(peer) if peer else None)

    lines = ["# Writing the results folder's CSVs (benchmarks/bench_writers.py)", "",
             f"Command: `{shlex.join(['python', '-m', 'benchmarks.bench_writers'] + sys.argv[1:])}`", "",
             f"Each writer's best time over {args.rounds} processes x {args.repeat} writes, in-process, apart from "
             "the replay (see the module's doc)." + (f" Peer: the tree in `{args.peer}`." if args.peer else ""), "",
             "| replay | file | lines | this tree (ms) | ns a line |" + (" peer (ms) | ns a line | this / peer |" if peer_best else ""),
             "|---|---|---|---|---|" + ("---|---|---|" if peer_best else "")]
    for name, found in ours_best.items():
        for file, count in (("steps", "lines"), ("requests", "rows")):
            seconds, n = found[file], found[count]
            row = f"| {name} | {file}.csv | {n:,} | {seconds * 1e3:.1f} | {seconds / n * 1e9:.0f} |"
            if peer_best:
                other = peer_best[name][file]
                row += f" {other * 1e3:.1f} | {other / n * 1e9:.0f} | {seconds / other:.2f} |"
            lines.append(row)
    write_report(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

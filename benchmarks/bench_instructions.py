"""Simulator cost in instructions: bench_sim's whole commands, each run once under callgrind.

A count of executed instructions does not move with the machine's load, as wall time does on a
shared machine (bench_sim's interleaved medians of the same command have varied by 40 % within
one run). It is not time: it leaves out cache misses, and a run that allocates more memory (the
prefix cache's tables) costs more time per instruction. So bench_sim's wall times stay the
measure the targets are stated in, and this report says where they stand without the noise.
Both the paths' instruction counts and the ratio targets (bench_sim.RATIOS) are given; a
`--peer PATH=CMD` runs CMD the same way beside PATH.

Usage:  python -m benchmarks.bench_instructions --out /tmp/x.md [--paths main,chunked] [--peer ...]
(needs valgrind; about a minute per 10,000-request path: valgrind runs ~50x slower). The big
paths are left out unless --big-requests is given. OpenBLAS is held to one thread in the
children: its idle threads spin, and callgrind counts every thread's instructions.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_sim import RATIOS, ROOT, make_paths, pagesim_command, parse_peers

VALGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
_COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(cmd: list[str] | str) -> int:
    """Instructions cmd executes (callgrind's count over every thread of the process)."""
    # (a command line for the shell: the shell and the processes it starts, each counted apart)
    full = VALGRIND + (["--trace-children=yes", "sh", "-c", cmd] if isinstance(cmd, str) else cmd)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(full, cwd=ROOT, env=env, capture_output=True, text=True)
    found = _COLLECTED.findall(proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{shlex.join(full)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return sum(map(int, found))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--big-requests", type=int, default=0, help="requests of the big paths (0: leave them out)")
    ap.add_argument("--paths", default="", help="comma-separated path names (default: all)")
    ap.add_argument("--peer", action="append", default=[], metavar="PATH=CMD")
    ap.add_argument("--peer-note", default="")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("bench_instructions: valgrind is not installed (it counts the instructions)", file=sys.stderr)
        return 2
    paths = make_paths(args)
    peers = parse_peers(args.peer, {p.name for p in paths})
    counts: dict[str, int] = {}
    for path in paths:
        folder = tempfile.mkdtemp(prefix="bench_instructions_")
        try:
            counts[path.name] = instructions(pagesim_command() + [folder if a == "OUT" else a for a in path.args])
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"{path.name}: {counts[path.name] / 1e9:.3f} G", file=sys.stderr)
    peer_counts = [instructions(cmd) for _, cmd in peers]

    lines = ["# Simulator cost in instructions (benchmarks/bench_instructions.py)", "",
             f"Command: `{shlex.join(['python', '-m', 'benchmarks.bench_instructions'] + sys.argv[1:])}`", "",
             "Each path's whole command (start-up included) once under `valgrind --tool=callgrind`: the instructions "
             "it executed, which the machine's load does not change. Not time (see the module's doc).", "",
             "| path | command (`pagesim ...`) | instructions (G) |", "|---|---|---|"]
    lines += [f"| {p.name} | `{shlex.join(p.args)}` | {counts[p.name] / 1e9:.3f} |" for p in paths]
    lines += ["", "| ratio | target | in instructions |", "|---|---|---|"]
    lines += [f"| {label} | <= {limit:g} | {counts[top] / counts[bottom]:.3f} |"
              for label, top, bottom, limit in RATIOS if top in counts and bottom in counts]
    if peers:
        lines += ["", "## Beside another command", "", args.peer_note, "",
                  "| path | pagesim (G) | peer command | peer (G) | pagesim / peer |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {counts[name] / 1e9:.3f} | `{cmd}` | {n / 1e9:.3f} | {counts[name] / n:.3f} |"
                  for (name, cmd), n in zip(peers, peer_counts)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

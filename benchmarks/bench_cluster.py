"""Cluster simulation targets (issue 28), written to a markdown report:

1. 1,000,000 requests over 16 replicas, whole command, <= 60 s, memory flat in requests (no
   --out: no per-step records are kept);
2. a 16-replica replay costs no more per request than one replica (the same per-replica load:
   16x the rate and 16x the requests);
3. prefix affinity against round-robin on a shared-prefix trace with prefix caching: hit rate
   and TTFT (needs a router registered as `prefix-affinity`; otherwise the section says so).

    python benchmarks/bench_cluster.py --out reports/bench_cluster.md [--big 1000000] [--base 10000]
    python benchmarks/bench_cluster.py --out /dev/null --side-by-side PEER [--rounds 4]  (CPU per request against another checkout)

Timings on a shared machine are noisy: the report records the load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def whole_command(args: list[str]) -> dict:
    """Wall time, max RSS and the summary of `pagesim replay ... --json` run as a child."""
    cmd = ["/usr/bin/time", "-v", PYTHON, "-m", "pagesim.cli", "replay", *args, "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"failed: {shlex.join(args)}\n{done.stderr[-2000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr))
    return {"args": args, "wall_s": wall, "cpu_s": cpu, "max_rss_mb": int(rss[1]) / 1024 if rss else None,
            "summary": json.loads(done.stdout)}


def prefix_affinity(trace: str, requests: int, rates: tuple[float, ...], replicas: int) -> list[dict] | str:
    sys.path.insert(0, str(ROOT))
    from pagesim.cluster.routers import ROUTERS

    if "prefix-affinity" not in ROUTERS:
        return "no router named `prefix-affinity` is registered on this branch (issue 28 item 2): not measured"
    rows = []
    for load in rates:
        for router in ("round-robin", "prefix-affinity"):
            args = [trace, "--num-requests", str(requests), "--rate", str(load), "--replicas", str(replicas),
                    "--router", router, "--model", "llama-2-7b", "--gpu", "a100-80gb", "--prefix-caching"]
            s = whole_command(args)["summary"]
            rows.append({"router": router, "rate": load, "args": args, "hit": s["prefix_hit_rate"],
                         "ttft_mean": s["ttft_mean"], "ttft_p99": s["ttft_p99"], "e2e_mean": s["e2e_mean"],
                         "imbalance": s["cluster"]["imbalance"]["requests_max_over_mean"]})
    return rows


def cpu_s() -> float:
    """CPU seconds of this process and of its children that ended (a cluster's replay workers)."""
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def scaling(total: int = 8000, counts=(1, 2, 4, 8, 16)) -> list[tuple[int, float, int]]:
    """In-process CPU per request of the same requests over 1..16 round-robin replicas (each at
    2 req/s; one process: jobs=1), and the decode runs taken: (replicas, us per request, runs)."""
    sys.path.insert(0, str(ROOT))
    import pagesim.sim.engine as engine
    from pagesim.api import replay_config
    from pagesim.cluster.cluster import Cluster
    from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
    from pagesim.workload.trace import load_trace

    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    runs = [0]
    take = engine.Replay._take_decode_run

    def counted(self, now, plan):
        runs[0] += 1
        return take(self, now, plan)

    engine.Replay._take_decode_run = counted
    rows = []
    for n in counts:
        cluster = Cluster(ClusterSpec([ReplicaGroup("r", replay_config(num_requests=total, rate=2.0 * n), n)],
                                      staleness_s=10.0), trace, keep_steps=False)
        runs[0] = 0
        start = cpu_s()
        cluster.run(jobs=1)
        rows.append((n, (cpu_s() - start) / total * 1e6, runs[0]))
    engine.Replay._take_decode_run = take
    return rows


def side_by_side(peer: Path, rounds: int, counts=(16, 1), total: int = 8000) -> list[str]:
    """In-process CPU per request of the same round-robin cluster run (8,000 ShareGPT requests at
    2 req/s per replica, as scaling() runs it) in this tree and in `peer` (another checkout), each
    in its own child process, alternating, `rounds` times: markdown lines with the medians and the
    per-round ratios (this / peer). CPU time counts the run's worker processes too, where a tree
    has them (replicas replayed apart)."""
    child = (
        "import resource, sys; sys.path.insert(0, sys.argv[1]); "
        "cpu = lambda: sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, "
        "(resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))); "
        "from pagesim.api import replay_config; from pagesim.cluster.cluster import Cluster; "
        "from pagesim.cluster.spec import ClusterSpec, ReplicaGroup; from pagesim.workload.trace import load_trace; "
        "n, total = int(sys.argv[2]), int(sys.argv[3]); trace = load_trace(sys.argv[1] + '/traces/sharegpt.json'); "
        "c = Cluster(ClusterSpec([ReplicaGroup('r', replay_config(num_requests=total, rate=2.0 * n), n)], "
        "staleness_s=10.0), trace, keep_steps=False); "
        "t = cpu(); c.run(); print((cpu() - t) / total * 1e6)")

    def us(root: Path, n: int) -> float:
        done = subprocess.run([PYTHON, "-c", child, str(root), str(n), str(total)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"failed in {root}:\n{done.stderr[-2000:]}")
        return float(done.stdout)

    lines = [f"| replicas | this tree, per round (us) | peer, per round (us) | this / peer, per round | median ratio |",
             "|---|---|---|---|---|"]
    for n in counts:
        mine, theirs = [], []
        for _ in range(rounds):
            mine.append(us(ROOT, n))
            theirs.append(us(peer, n))
        ratios = [a / b for a, b in zip(mine, theirs)]
        lines.append(f"| {n} | {' / '.join(f'{x:.0f}' for x in mine)} | {' / '.join(f'{x:.0f}' for x in theirs)} | "
                     f"{' / '.join(f'{r:.3f}' for r in ratios)} | {statistics.median(ratios):.3f} |")
    return lines


SCALING_HEAD = ["## Per-request cost against the number of replicas (in-process)", "",
                "The same 8,000 ShareGPT requests over 1, 2, 4, 8 and 16 round-robin replicas at 2 req/s each "
                "(`python benchmarks/bench_cluster.py --out /dev/null --scaling-only`): CPU time of the run, and "
                "the decode runs the replicas took.", "",
                "| replicas | CPU per request (us) | decode runs |", "|---|---|---|"]
SCALING_TAIL = ["", "The work is the same (decode runs within a few per cent: each replica stops at its own "
                "requests and finishes, as one replica does). Round-robin reads no load, so the replicas are "
                "replayed apart (pagesim.cluster.independent), here one after another in one process: each "
                "replica's objects stay hot in the CPU's caches, where on one clock 16 replicas' interleaved "
                "objects made every call slower (16 replicas cost 1.15-1.27x one replica's per request before).",
                ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--big", type=int, default=1_000_000, help="requests of the 16-replica target run")
    parser.add_argument("--base", type=int, default=10_000, help="requests per replica of the per-request comparison")
    parser.add_argument("--staleness", type=float, default=10.0, help="router view refresh for the big runs")
    parser.add_argument("--affinity-trace", default="traces/sharegpt_chat.json")
    parser.add_argument("--affinity-only", action="store_true", help="only the prefix-affinity comparison (printed)")
    parser.add_argument("--scaling-only", action="store_true", help="only the in-process 1..16 replica scaling")
    parser.add_argument("--affinity-json", type=Path, help="the comparison as --affinity-only printed it (measured "
                        "on a branch that has the router) instead of measuring it here")
    parser.add_argument("--affinity-note", default="", help="where --affinity-json was measured")
    parser.add_argument("--side-by-side", type=Path, metavar="PEER",
                        help="only the in-process CPU per request, this tree against another checkout PEER, alternating")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of --side-by-side")
    args = parser.parse_args()
    if args.side_by_side:
        print("\n".join(side_by_side(args.side_by_side.resolve(), args.rounds)))
        return
    if args.scaling_only:
        for n, us, runs in scaling():
            print(f"{n} replicas: {us:.0f} us CPU per request, {runs} decode runs")
        return
    if args.affinity_only:
        print(json.dumps(prefix_affinity(args.affinity_trace, 3000, (8.0, 24.0), 4), indent=1))
        return

    load = os.getloadavg()
    trace = "traces/sharegpt.json"
    big = whole_command([trace, "--rate", "32", "--num-requests", str(args.big), "--replicas", "16",
                         "--staleness", str(args.staleness)])
    one = whole_command([trace, "--rate", "2", "--num-requests", str(args.base)])
    sixteen = whole_command([trace, "--rate", "32", "--num-requests", str(16 * args.base), "--replicas", "16",
                             "--staleness", str(args.staleness)])
    serial = whole_command([trace, "--rate", "32", "--num-requests", str(16 * args.base), "--replicas", "16",
                            "--staleness", str(args.staleness), "--jobs", "1"])
    strict = whole_command([trace, "--rate", "32", "--num-requests", str(16 * args.base // 10), "--replicas", "16"])
    affinity = json.loads(args.affinity_json.read_text()) if args.affinity_json else \
        prefix_affinity(args.affinity_trace, 3000, (8.0, 24.0), 4)

    def row(name: str, run: dict) -> str:
        s = run["summary"]
        per, cpu = (run[key] / s["num_requests"] * 1e6 for key in ("wall_s", "cpu_s"))
        return (f"| {name} | `pagesim replay {shlex.join(run['args'])}` | {s['num_requests']:,} | {run['wall_s']:.1f} | "
                f"{run['cpu_s']:.1f} | {per:.0f} | {cpu:.0f} | {run['max_rss_mb']:.0f} |")

    lines = [
        "# Cluster simulation speed (benchmarks/bench_cluster.py)", "",
        f"Command: `python benchmarks/bench_cluster.py --out {args.out} --big {args.big} --base {args.base}`", "",
        f"Load average at start: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on {os.cpu_count()} CPUs "
        "(a shared machine: absolute times are noisy, the per-request ratios less so).", "",
        "| run | command | requests | wall (s) | CPU (s) | wall per request (us) | CPU per request (us) | max RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
        row("16 replicas, big", big), row("1 replica", one), row("16 replicas, same load per replica", sixteen),
        row("16 replicas, same load per replica, one process", serial),
        row("16 replicas, staleness 0 (loads read at every decision)", strict), "",
    ]
    def per_request(run: dict, key: str) -> float:
        return run[key] / run["summary"]["num_requests"]

    ratio, cpu_ratio = (per_request(sixteen, key) / per_request(one, key) for key in ("wall_s", "cpu_s"))
    serial_ratio = per_request(serial, "cpu_s") / per_request(one, "cpu_s")
    lines += [
        "| target | measured (wall) | in CPU time | verdict |", "|---|---|---|---|",
        f"| {args.big:,} requests over 16 replicas <= 60 s | {big['wall_s']:.1f} s | {big['cpu_s']:.1f} s | "
        f"{'met' if big['wall_s'] <= 60 else 'NOT met'} (wall) |",
        f"| 16 replicas cost per request <= 1 replica's | {ratio:.2f}x | {cpu_ratio:.2f}x | "
        f"{'met' if cpu_ratio <= 1.0 else 'NOT met'} (CPU) |",
        f"| the same, in one process (`--jobs 1`) | {serial_ratio:.2f}x | {serial_ratio:.2f}x | "
        f"{'met' if serial_ratio <= 1.0 else 'NOT met'} (CPU) |",
        f"| memory flat in requests | {one['max_rss_mb']:.0f} MB at {one['summary']['num_requests']:,}, "
        f"{sixteen['max_rss_mb']:.0f} MB at {sixteen['summary']['num_requests']:,}, {big['max_rss_mb']:.0f} MB at "
        f"{big['summary']['num_requests']:,} | | NOT met |", "",
        "The 1-replica run's per-request figures include the start-up (about 0.25 s) spread over fewer requests.", "",
        "Round-robin reads no load, so the big runs refresh the router's view every "
        f"{args.staleness:g} s without changing a decision (tests/cluster/test_cluster.py checks that); with "
        "staleness 0 every replica's decode runs stop at every arrival, which costs about N times more per request.",
        "",
    ]
    lines += SCALING_HEAD + [f"| {n} | {us:.0f} | {runs:,} |" for n, us, runs in scaling()] + SCALING_TAIL
    lines += ["## Prefix affinity against round-robin", ""]
    if isinstance(affinity, str):
        lines.append(affinity)
    else:
        lines += ["| rate (req/s) | router | prefix hit rate | TTFT mean (s) | TTFT p99 (s) | e2e mean (s) | "
                  "requests max/mean |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['rate']:g} | {r['router']} | {r['hit']:.3f} | {r['ttft_mean']:.3f} | {r['ttft_p99']:.3f} | "
                  f"{r['e2e_mean']:.2f} | {r['imbalance']:.2f} |" for r in affinity]
        lines += ["", f"Commands: `pagesim replay {shlex.join(affinity[0]['args'])}` (and `--router prefix-affinity`, "
                  "and the second rate)." + (f" {args.affinity_note}" if args.affinity_note else "")]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""reports/route_check.md: the simulated cluster's routing decisions and latencies against a real
one, `pagesim route` in front of `pagesim serve` processes on 127.0.0.1 (issue 28, item 8).

    python -m pagesim.experiments.route_check                          # the report (about 2 min)
    python -m pagesim.experiments.route_check --replicas 2 --num-requests 8 --out X.md   # (tests)

For each router (round-robin; prefix-affinity with its load and KV weights at 0, so a decision
depends on the requests' order alone, not on timing):
1. N `pagesim serve` processes of the tiny random model (random:llama-tiny, CPU, one thread each)
   and `pagesim route --router R` in front, writing its decision log;
2. `pagesim bench` sends a synthetic shared-prefix trace (token-id prompts: a few shared prefixes
   of whole blocks, each request its own suffix) through the router, at the trace's own arrival
   times, each request with its trace id as x-request-id;
3. `pagesim replay TRACE --cluster FILE` simulates the same arrivals over N replicas behind the
   same router (the cluster file carries its parameters), with the cost model `profiled` on a
   profile of the same model measured on this machine (`pagesim profile --grid tiny`);
4. request by request: the backend the real router chose (its decision log, paired by
   x-request-id) against the replica the simulator's router chose; then the measured TTFT and
   E2E latency beside the simulated ones.
Arrivals are GAP_S apart, far longer than the router takes to decide, so the order the real
router sees them in is the trace's.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from pagesim.bench.child import CliChild, cli_env
from pagesim.workload.trace import Trace, TraceRequest, save_trace

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:llama-tiny"  # vocabulary of 128 token ids
VOCAB = 128
SIM_MODEL = "smollm2-135m"  # a catalog entry: it only names the model; the profile times the steps
BLOCK = 16
GPU_BLOCKS = 128  # each server's KV pool (--num-gpu-blocks), the simulated replicas' too
GAP_S = 0.25
OUTPUT_LEN = 8
ROUTERS = {"round-robin": {}, "prefix-affinity": {"load_weight": 0.0, "kv_weight": 0.0}}
STARTUP_S = 180.0


def shared_prefix_trace(num_requests: int, num_prefixes: int = 3, prefix_blocks: int = 3, seed: int = 0) -> Trace:
    """Request i: prefix (i * 7 + i // 3) mod num_prefixes (whole blocks of random ids), then a
    suffix of its own (3..12 ids), OUTPUT_LEN tokens out; arrivals GAP_S apart."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(prefix_blocks * BLOCK)] for _ in range(num_prefixes)]
    requests = []
    for i in range(num_requests):
        ids = prefixes[(i * 7 + i // 3) % num_prefixes] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 12))]
        requests.append(TraceRequest(len(ids), OUTPUT_LEN, arrival_time=round(i * GAP_S, 6), prompt_token_ids=ids))
    return Trace({"source": "pagesim.experiments.route_check (synthetic shared prefixes)"}, requests)


def warm_up(child: CliChild) -> None:
    """One short request, so that the first measured ones do not pay the server's first step."""
    model = httpx.get(f"{child.base}/v1/models", timeout=30).json()["data"][0]["id"]
    answer = httpx.post(f"{child.base}/v1/completions", timeout=60,
                        json={"model": model, "prompt": [5, 6, 7], "max_tokens": 2})
    answer.raise_for_status()


def cli(*args: str) -> None:
    """A pagesim command to its end (its output shown on failure)."""
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", *args], cwd=ROOT, env=cli_env(ROOT),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pagesim {' '.join(args[:2])} exited with {done.returncode}: "
                           f"{(done.stdout + done.stderr)[-2000:]}")


def read_requests(path: Path) -> dict[int, dict]:
    with open(path, newline="") as f:
        return {int(row["request_id"]): row for row in csv.DictReader(f)}


def real_choices(decisions: Path) -> dict[int, int]:
    """Trace request id -> the backend that served it (its last routed attempt)."""
    chosen = {}
    for line in decisions.read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "routed" and record.get("client_request_id") is not None:
            chosen[int(record["client_request_id"])] = record["backend"]
    return chosen


def cluster_file(path: Path, router: str, params: dict, replicas: int, profile: Path) -> None:
    lines = ["[router]", f'name = "{router}"', "staleness_s = 0.0", "[router.params]"]
    lines += [f"{k} = {v}" for k, v in params.items()]
    lines += ["", "[[groups]]", 'name = "tiny"', f"count = {replicas}", f'model = "{SIM_MODEL}"',
              'cost_model = "profiled"', f'profile = "{profile}"',
              f"num_gpu_blocks = {GPU_BLOCKS}", f"block_size = {BLOCK}"]
    path.write_text("\n".join(lines) + "\n")


@dataclass
class RouterRun:
    router: str
    requests: int
    agree: int
    disagree: list[int]  # request ids where the choices differ
    real_choices: list[int]  # per request, in id order: the backend the real router chose
    sim_choices: list[int]  # the replica the simulated router chose
    latency: dict  # metric -> (measured median, simulated median)

    def spread(self, choices: list[int]) -> list[int]:
        """Requests per backend."""
        return [choices.count(k) for k in range(max(self.real_choices + self.sim_choices) + 1)]


def check_router(router: str, params: dict, backends: list[CliChild], trace_path: Path, num_requests: int,
                 profile: Path, work: Path) -> RouterRun:
    n, count = len(backends), str(num_requests)
    decisions = work / f"{router}_decisions.jsonl"
    args = ["route", *[a for b in backends for a in ("--backend", b.base)], "--port", "0", "--router", router,
            *[a for k, v in params.items() for a in ("--router-param", f"{k}={v}")],
            "--block-size", str(BLOCK), "--decisions", str(decisions), "--log-level", "warning"]
    route = CliChild.start(args, ROOT)
    try:
        route.wait_healthy(time.monotonic() + STARTUP_S)
        cli("bench", str(trace_path), "--endpoint", route.base, "--rate", "0", "--num-requests", count,
            "--max-failed-share", "0", "--out", str(work / f"{router}_real"))
    finally:
        route.stop()
    spec = work / f"{router}_cluster.toml"
    cluster_file(spec, router, params, n, profile)
    # (--force: the profile is of the served model, not of the catalog entry that names it)
    cli("replay", str(trace_path), "--rate", "0", "--num-requests", count, "--cluster", str(spec), "--force",
        "--out", str(work / f"{router}_sim"))
    real = read_requests(work / f"{router}_real" / "requests.csv")
    sim = read_requests(work / f"{router}_sim" / "requests.csv")
    chosen = real_choices(decisions)
    ids = sorted(sim)
    if sorted(real) != ids or sorted(chosen) != ids:
        raise RuntimeError(f"{router}: the bench, the router's log and the simulator hold different requests "
                           f"({len(real)}, {len(chosen)}, {len(sim)})")
    sim_chosen = [int(sim[i]["replica"]) for i in ids]
    disagree = [i for i, k in zip(ids, sim_chosen) if chosen[i] != k]
    latency = {}
    for metric in ("ttft", "e2e_latency"):
        measured = [float(real[i][metric]) for i in ids if real[i]["status"] == "finished"]
        simulated = [float(sim[i][metric]) for i in ids if sim[i]["status"] == "finished"]
        if len(measured) != len(ids) or len(simulated) != len(ids):
            raise RuntimeError(f"{router}: not every request finished ({len(measured)} measured, "
                               f"{len(simulated)} simulated of {len(ids)})")
        latency[metric] = (statistics.median(measured), statistics.median(simulated))
    return RouterRun(router, len(ids), len(ids) - len(disagree), disagree, [chosen[i] for i in ids], sim_chosen,
                     latency)


def report(runs: list[RouterRun], replicas: int, num_requests: int, command: str, wall_s: float) -> str:
    out = ["# The simulated cluster against a real one: `pagesim route` over `pagesim serve`", "",
           f"Generated by `{command}` ({wall_s:.0f} s on this machine). {replicas} `pagesim serve` processes of "
           f"`{MODEL}` (CPU, one thread each, {GPU_BLOCKS} KV blocks) on 127.0.0.1 behind `pagesim route`; "
           f"`pagesim bench` sends {num_requests} token-id requests through it, {GAP_S:g} s apart, sharing "
           f"3 prefixes of 3 blocks, {OUTPUT_LEN} tokens out; `pagesim replay --cluster` simulates the same arrivals "
           "behind the same router. Method: pagesim/experiments/route_check.py's docstring.", "",
           "## Routing decisions, request by request", "",
           "| router | requests | same replica | differ | real: requests per backend | simulated | "
           "real choices, in request order |", "|---|---:|---:|---|---|---|---|"]
    for r in runs:
        out.append(f"| {r.router} | {r.requests} | {r.agree} | {r.disagree or 'none'} | {r.spread(r.real_choices)} | "
                   f"{r.spread(r.sim_choices)} | {''.join(map(str, r.real_choices))} |")
    out += ["", "Both routers' decisions depend on the order of the requests alone (prefix-affinity with "
            "`load_weight=0 kv_weight=0`: longest prefix the router has routed to a backend, ties to the backend "
            "believed to hold the fewest blocks, then the lowest index), so they must agree one for one; a load-"
            "reading router (least-outstanding, least-kv, the default prefix-affinity weights) depends on when "
            "each request ends and is not compared here.", "",
            "## Latencies: measured beside simulated (medians, seconds)", "",
            "| router | TTFT measured | TTFT simulated | E2E measured | E2E simulated |", "|---|---:|---:|---:|---:|"]
    for r in runs:
        (tm, ts), (em, es) = r.latency["ttft"], r.latency["e2e_latency"]
        out.append(f"| {r.router} | {tm:.4f} | {ts:.4f} | {em:.4f} | {es:.4f} |")
    out += ["", "The simulator times each replica's steps with the cost model `profiled` on a profile of the same "
            "tiny model measured just before (`pagesim profile --model random:llama-tiny --grid tiny`, thread CPU "
            "time). The measured latencies also hold what no step profile sees: HTTP through two hops (client, "
            "router, server), the server's request handling and streaming, and the other processes "
            "sharing this machine's cores (the runs were not quiet; each server took one warm-up request first): so the measured numbers are larger, and the "
            "comparison is of the routing and of the order of magnitude, not a calibration (reports/fidelity_cpu.md "
            "is that).", ""]
    return "\n".join(out)


def check(replicas: int, num_requests: int, routers: list[str]) -> list[RouterRun]:
    """Profile the model, start the servers, and check each router (files in a temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="route_check_") as tmp:
        work = Path(tmp)
        trace_path = work / "trace.json"
        save_trace(shared_prefix_trace(num_requests), trace_path)
        profile = work / "profile.json"
        cli("profile", "--model", MODEL, "--grid", "tiny", "--block-size", str(BLOCK), "--out", str(profile))
        backends = [CliChild.start(["serve", "--model", MODEL, "--port", "0", "--num-gpu-blocks", str(GPU_BLOCKS),
                                     "--log-level", "warning"], ROOT) for _ in range(replicas)]
        try:
            deadline = time.monotonic() + STARTUP_S
            for b in backends:
                b.wait_healthy(deadline)
            for b in backends:
                warm_up(b)
            return [check_router(r, ROUTERS[r], backends, trace_path, num_requests, profile, work) for r in routers]
        finally:
            for b in backends:
                b.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=3, help="pagesim serve processes (2 or 3)")
    ap.add_argument("--num-requests", type=int, default=24)
    ap.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of " + ", ".join(ROUTERS))
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "route_check.md")
    args = ap.parse_args(argv)
    if args.replicas < 2 or args.num_requests < 1:
        ap.error("--replicas >= 2 and --num-requests >= 1")
    routers = [r for r in args.routers.split(",") if r]
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        ap.error(f"--routers: unknown {unknown} (known: {', '.join(ROUTERS)})")
    started = time.monotonic()
    runs = check(args.replicas, args.num_requests, routers)
    command = "python -m pagesim.experiments.route_check" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(runs, args.replicas, args.num_requests, command, time.monotonic() - started))
    for r in runs:
        print(f"{r.router}: {r.agree}/{r.requests} decisions agree", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(not r.disagree for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

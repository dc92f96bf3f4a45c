"""The HTTP path's cost, and the load client's speed.

1. Throughput of `pagesim serve` driven over HTTP by `pagesim bench` (64 concurrent streams)
   against `pagesim run` in-process (the executor's own trace driver), on the same requests: the
   first --num-requests of traces/alpaca.json with lengths halved, synthetic prompt ids (seed 0),
   all arriving at once, max_num_seqs 64, greedy, ignore_eos; one torch thread in both. The
   ratio is output tokens/s over HTTP / in-process (target >= 0.8). Each random model runs
   in-process, over HTTP, in-process, over HTTP (each in fresh processes), and each side's best
   run counts, so a burst of load from other processes does not decide the ratio.
2. `pagesim bench` against a stub server that answers every completion at once with one chunk:
   the request rate it sustains (target >= 500 req/s), and with the stub holding each answer for
   --hold-s seconds, how many requests it keeps in flight.

Usage:  python -m benchmarks.bench_serve --out reports/bench_serve.md
The machine may be shared (2 cores here): the report records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["OMP_NUM_THREADS"] = "1"  # before torch starts its pool, in every process here
TARGET_RATIO = 0.8
TARGET_RATE = 500.0
MODELS = ("random:llama-tiny", f"random:{ROOT / 'benchmarks' / 'llama_small.json'}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{base} did not come up")


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ------------------------------------------------------------------ 1. HTTP vs in-process


def workload():
    from pagesim.compare import scaled_trace
    from pagesim.workload.trace import load_trace

    return scaled_trace(load_trace(ROOT / "traces" / "alpaca.json"), 2)


def in_process(model: str, trace_path: Path, args) -> tuple[dict, float]:
    """`pagesim run`'s driver, in a fresh process as the server is: its summary, and the CPU
    seconds the run itself took (model loading left out, as for the server)."""
    cmd = [sys.executable, "-m", "benchmarks.bench_serve", "--in-process", model, "--trace", str(trace_path),
           "--num-requests", str(args.num_requests), "--arrival-rate", str(args.arrival_rate)]
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    return result["summary"], result["cpu_s"]


def in_process_child(model: str, trace_path: Path, args) -> None:
    import torch

    from pagesim.workload.trace import load_trace

    from executor.models.loader import load_model
    from executor.run import RunConfig, run_trace

    torch.set_num_threads(1)
    lm = load_model(model, tokenizer=False)
    trace = load_trace(trace_path)
    cpu = time.process_time()
    summary, _ = run_trace(lm, trace, engine_config(), RunConfig(rate=args.arrival_rate, num_requests=args.num_requests))
    json.dump({"summary": summary, "cpu_s": time.process_time() - cpu}, sys.stdout, default=str)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_config():
    from executor.engine import EngineConfig

    return EngineConfig(max_num_seqs=64, num_gpu_blocks=2048, num_cpu_blocks=64)


def over_http(model: str, trace_path: Path, args) -> tuple[dict, float, float]:
    """bench's summary, the server's CPU seconds during the run, and the client's."""
    cfg = engine_config()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "pagesim.cli", "serve", "--model", model, "--port", str(port),
                               "--threads", "1", "--max-num-seqs", str(cfg.max_num_seqs),
                               "--num-gpu-blocks", str(cfg.num_gpu_blocks), "--num-cpu-blocks", str(cfg.num_cpu_blocks)],
                              cwd=ROOT, env=env(), stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, server)
        cmd = [sys.executable, "-m", "pagesim.cli", "bench", str(trace_path), "--endpoint", base,
               "--rate", str(args.arrival_rate), "--num-requests", str(args.num_requests), "--max-concurrency", "64",
               "--scrape-interval", "0", "--json"]
        server_cpu = process_cpu_s(server.pid)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, check=True)
        server_cpu = process_cpu_s(server.pid) - server_cpu
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        return json.loads(done.stdout), server_cpu, client_cpu
    finally:
        server.terminate()
        server.wait(30)


# ------------------------------------------------------------------ 2. the client against a stub

STUB = r'''
import asyncio, json, sys
hold = float(sys.argv[2])
CHUNK = b"data: " + json.dumps({"id": "x", "object": "text_completion", "created": 0, "model": "stub",
                                "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": "length"}]}).encode() + b"\n\n"
USAGE = b'data: {"id": "x", "object": "text_completion", "created": 0, "model": "stub", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}\n\n'
MODELS = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model", "vocab_size": 1000}]}).encode()

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"].endswith("/models"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": MODELS})
        return
    if scope["path"] == "/metrics":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if hold:
        await asyncio.sleep(hold)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": CHUNK + USAGE + b"data: [DONE]\n\n"})

import uvicorn
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", backlog=4096)
'''


def against_stub(trace_path: Path, rate: float, num: int, hold: float) -> tuple[dict, int, float]:
    """bench's summary against the stub, the most requests it had in flight at once, and the
    client's CPU seconds."""
    port = free_port()
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(port), str(hold)], env=env())
    base = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit("the stub did not come up")
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "pagesim.cli", "bench", str(trace_path), "--endpoint", base, "--rate", str(rate),
                   "--num-requests", str(num), "--scrape-interval", "0", "--json", "--out", out]
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            client_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
            import csv

            with open(Path(out) / "requests.csv") as f:
                rows = list(csv.DictReader(f))
        events = sorted([(float(r["first_scheduled_time"]), 1) for r in rows if r["first_scheduled_time"]]
                        + [(float(r["finish_time"]), -1) for r in rows if r["finish_time"]])
        in_flight = peak = 0
        for _, step in events:
            in_flight += step
            peak = max(peak, in_flight)
        return json.loads(done.stdout), peak, client_cpu
    finally:
        stub.terminate()
        stub.wait(10)


# ------------------------------------------------------------------ report


def sum_tokens(summary: dict) -> float:
    return summary["output_token_throughput"] * summary["duration_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--arrival-rate", type=float, default=10000.0, help="req/s: high enough that all arrive at once")
    ap.add_argument("--stub-rate", type=float, default=2000.0)
    ap.add_argument("--stub-requests", type=int, default=4000)
    ap.add_argument("--hold-s", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_serve.md")
    ap.add_argument("--in-process", metavar="MODEL", help=argparse.SUPPRESS)  # the child of part 1
    ap.add_argument("--trace", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.in_process:
        in_process_child(args.in_process, args.trace, args)
        return
    from pagesim.workload.trace import save_trace

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    trace = workload()
    lines = [f"Load average at start: {loadavg()}; {os.cpu_count()} CPUs; Python {platform.python_version()}.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "alpaca_half.json"
        save_trace(trace, trace_path)
        rows = []
        for model in MODELS:
            # in-process, HTTP, in-process, HTTP: the best of each side, so a burst of load from
            # other processes during one run does not decide the ratio
            runs = {"in-process": [], "HTTP": []}
            for side in ("in-process", "HTTP", "in-process", "HTTP"):
                log(f"{model}: {side}")
                if side == "in-process":
                    summary, cpu = in_process(model, trace_path, args)
                    runs[side].append((summary, cpu, 0.0))
                else:
                    runs[side].append(over_http(model, trace_path, args))
                summary, cpu, _ = runs[side][-1]
                log(f"  {summary['output_token_throughput']:.0f} tok/s, {summary['num_finished']} finished, CPU {cpu:.1f} s")
            rows.append((model, runs))
        log("stub, instant")
        instant, _, instant_cpu = against_stub(trace_path, args.stub_rate, args.stub_requests, 0.0)
        log(f"  {instant['request_throughput']:.0f} req/s")
        log(f"stub, holding {args.hold_s} s")
        held, peak, held_cpu = against_stub(trace_path, args.stub_rate / 2, args.stub_requests, args.hold_s)
        log(f"  peak in flight {peak}")
    lines += ["## 1. HTTP (`pagesim serve` + `pagesim bench`, 64 concurrent streams) vs in-process `pagesim run`", "",
              f"{args.num_requests} requests of traces/alpaca.json, lengths / 2, all arriving at once "
              f"(rate {args.arrival_rate:g} req/s), max_num_seqs 64, greedy, ignore_eos, 1 torch thread; the server "
              "is a separate process (one core for it, one for the client).", "",
              "Wall: output tokens/s from first arrival to last finish (pagesim.metrics' summary), best of two runs "
              "per side. CPU: output tokens per CPU second of the engine's process (the server process during the "
              "benchmark, or this process during `run_trace`), best of two; the client's CPU is listed apart. "
              "On a shared machine the CPU ratio is the steadier measure of what HTTP costs the server.", "",
              "| model | in-process tok/s (runs) | HTTP tok/s (runs) | **HTTP / in-process, wall** | in-process tok/CPU-s | "
              "server tok/CPU-s | HTTP / in-process, CPU | client CPU s | engine steps (in-process / server) | finished |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model, runs in rows:
        name = model if "llama-tiny" in model else "random:benchmarks/llama_small.json"
        ip, http = runs["in-process"], runs["HTTP"]
        wall = lambda side: [s["output_token_throughput"] for s, _, _ in side]  # noqa: E731
        per_cpu = lambda side: [s["num_finished"] and sum_tokens(s) / cpu for s, cpu, _ in side]  # noqa: E731
        wall_ratio = max(wall(http)) / max(wall(ip))
        cpu_ratio = max(per_cpu(http)) / max(per_cpu(ip))
        lines.append(f"| {name} | {' / '.join(f'{x:.0f}' for x in wall(ip))} | {' / '.join(f'{x:.0f}' for x in wall(http))} "
                     f"| **{wall_ratio:.2f}** (target >= {TARGET_RATIO}) | {max(per_cpu(ip)):.0f} | {max(per_cpu(http)):.0f} "
                     f"| {cpu_ratio:.2f} | {' / '.join(f'{c:.1f}' for _, _, c in http)} "
                     f"| {' / '.join(str(s['num_steps']) for s, _, _ in ip)} ; {' / '.join(str(s['num_steps']) for s, _, _ in http)} "
                     f"| {ip[0][0]['num_finished']} / {http[0][0]['num_finished']} |")
    lines += ["", "## 2. `pagesim bench` against a stub that answers at once", "",
              "Achieved req/s: finished requests / (first arrival to last finish), the client and the stub sharing "
              "the machine's cores with whatever else runs. Client CPU: the whole `pagesim bench` process (start-up "
              "included); requests per client CPU-second is what one free core would sustain.", "",
              "| stub | asked rate | requests | finished | failed | achieved req/s | client CPU s | req per client CPU-s "
              "| peak in flight |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
              f"| instant | {args.stub_rate:g} | {args.stub_requests} | {instant['num_finished']} | {instant['num_failed']} | "
              f"**{instant['request_throughput']:.0f}** (target >= {TARGET_RATE:g}) | {instant_cpu:.1f} | "
              f"{args.stub_requests / instant_cpu:.0f} | - |",
              f"| holds {args.hold_s:g} s | {args.stub_rate / 2:g} | {args.stub_requests} | {held['num_finished']} | "
              f"{held['num_failed']} | {held['request_throughput']:.0f} | {held_cpu:.1f} | {args.stub_requests / held_cpu:.0f} "
              f"| {peak} |", ""]
    command = "python -m benchmarks.bench_serve " + shlex.join(sys.argv[1:])
    text = "# `pagesim serve` and `pagesim bench`: overhead and client speed\n\n" + f"Produced by `{command}`.\n\n" + "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

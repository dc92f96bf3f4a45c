"""`pagesim bench` replays sessions and closed-loop load against a real `pagesim serve` (the
package's server, prefix caching on, 16-token blocks): a turn's prompt is its predecessor's prompt
plus the ids the server returned, so the server's prefix cache hits them, as many tokens as the
token ids determine (worked out by hand below) and as many as the simulator finds on the same trace."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys

import pytest

from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest, save_trace

from .conftest import ROOT, cli_env

BLOCK = 16  # the server's block size (pagesim serve's default)
# per session: turn 0's prompt, then (output, new tokens of the next turn) for each turn
SESSIONS = [(24, [(10, 6), (10, 7), (9, None)]), (37, [(5, 20), (12, None)]), (18, [(30, 3), (4, None)])]
THINK = 0.05


def session_trace(seed: int = 29) -> Trace:
    """Records hold the full prompt (docs/traces.md): history (the recorded reply: random ids the
    server will not produce) plus the new tokens; ids below llama-tiny's vocabulary of 128. Each
    test takes its own seed: the server is shared, and its cache remembers what it was sent."""
    rng = random.Random(seed)
    records = []
    for s, (first, turns) in enumerate(SESSIONS):
        prompt = [rng.randrange(4, 128) for _ in range(first)]
        for k, (output, new) in enumerate(turns):
            records.append(TraceRequest(len(prompt), output, arrival_time=0.1 * s, session_id=s, turn=k,
                                        think_time=THINK if k else None, prompt_token_ids=prompt))
            if new is not None:
                prompt = prompt + [rng.randrange(4, 128) for _ in range(output + new)]
    records.sort(key=lambda r: r.arrival_time)  # (stable: turns stay in order)
    return Trace({"source": "tests/serve", "count": len(records)}, records)


def expected_by_hand() -> tuple[list[int], int]:
    """Sent prompt lengths in file order, and the prefix-cache hits in tokens: a later turn finds
    the full blocks of its predecessor's computed tokens (prompt + output - 1)."""
    lens, hits = [], 0
    for first, turns in SESSIONS:
        prompt = first
        for output, new in turns:
            lens.append(prompt)
            if new is not None:
                hits += (prompt + output - 1) // BLOCK * BLOCK
                prompt += output + new
    return lens, hits


def test_bench_sessions_hit_the_servers_cache_as_the_simulator_does(server, tmp_path):
    path = tmp_path / "sessions.json"
    trace = session_trace()
    save_trace(trace, path)
    before = server.metrics()
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", "bench", str(path), "--endpoint", server.base,
                           "--rate", "0", "--num-requests", str(len(trace)), "--scrape-interval", "0", "--out", str(out)],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    after = server.metrics()
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(r["status"] == "finished" for r in rows), [r["reject_reason"] for r in rows]
    lens, hits = expected_by_hand()
    assert [int(r["prompt_len"]) for r in rows] == lens
    served_hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert served_hits == hits
    assert json.loads((out / "summary.json").read_text())["server_prefix_cache_hits"] == hits

    sim = Replay(ReplayConfig(rate=None, num_requests=len(trace), prefix_caching=True, num_gpu_blocks=128,
                              max_model_len=256, block_size=BLOCK), trace, cost_model=ConstantCostModel(0.01))
    simulated = sorted(sim.run().metrics.requests, key=lambda r: r.request_id)
    assert [r.prompt_len for r in simulated] == lens
    assert sum(r.cached_prompt_tokens for r in simulated) == hits

    # a turn is sent once its predecessor's answer ended, plus the think time
    by_session: dict[str, list[dict]] = {}
    for r in rows:
        by_session.setdefault(r["session_id"], []).append(r)
    for turns in by_session.values():
        assert [int(r["turn"]) for r in turns] == list(range(len(turns)))
        for before_turn, turn in zip(turns, turns[1:]):
            assert float(turn["arrival_time"]) >= float(before_turn["finish_time"]) + THINK - 1e-6


def test_bench_closed_loop_keeps_n_requests_in_flight(server, tmp_path):
    path = tmp_path / "plain.json"
    save_trace(Trace({"source": "tests/serve", "count": 3}, [TraceRequest(p, o) for p, o in ((12, 9), (30, 4), (6, 15))]),
               path)
    out = tmp_path / "closed"
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", "bench", str(path), "--endpoint", server.base,
                           "--num-requests", "10", "--concurrency", "2", "--scrape-interval", "0", "--out", str(out)],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    with open(out / "requests.csv") as f:
        rows = [r for r in csv.DictReader(f)]
    assert len(rows) == 10 and all(r["status"] == "finished" for r in rows)
    arrivals = sorted(float(r["arrival_time"]) for r in rows)
    finishes = sorted(float(r["finish_time"]) for r in rows)
    events = sorted([(t, 1) for t in arrivals] + [(t, -1) for t in finishes], key=lambda e: (e[0], e[1]))
    in_flight = 0
    for _, change in events:
        in_flight += change
        assert in_flight <= 2
    # the client sends the next one as the last ends: its release is that end, as the client saw it
    assert arrivals[:2] == [0.0, 0.0]
    assert arrivals[2:] == pytest.approx(finishes[:8], abs=0.05)


def test_compare_puts_the_simulator_beside_served_sessions(server, tmp_path):
    path = tmp_path / "sessions.json"
    trace = session_trace(seed=31)
    save_trace(trace, path)
    out = tmp_path / "cmp"
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", "compare", str(path), "--endpoint", server.base,
                           "--cost-model", "roofline", "--system", "paged-recompute", "--prefix-caching",
                           "--num-requests", str(len(trace)), "--rate", "5", "--num-gpu-blocks", "128",
                           "--num-cpu-blocks", "64", "--max-model-len", "256", "--out", str(out)],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    served = json.loads((out / "paged-recompute/served/summary.json").read_text())
    simulated = json.loads((out / "paged-recompute/simulator/summary.json").read_text())
    _, hits = expected_by_hand()
    assert served["num_finished"] == simulated["num_finished"] == len(trace)
    assert served["server_prefix_cache_hits"] == simulated["prefill_tokens_saved"] == hits

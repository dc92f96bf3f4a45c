"""`pagesim bench` and `pagesim compare --endpoint` against `pagesim serve` (real subprocesses; the
server is conftest's, shared by the package, and its shutdown is checked in its teardown)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from pagesim.workload.requests import build_requests
from pagesim.workload.trace import Trace, TraceRequest, save_trace

from .conftest import MODEL, ROOT, cli_env

LENGTHS = [(12, 9), (40, 3), (5, 30), (33, 17), (20, 1), (64, 12), (8, 25)]  # (prompt_len, output_len)


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "small.json"
    save_trace(Trace({"source": "tests/serve", "count": len(LENGTHS)}, [TraceRequest(p, o) for p, o in LENGTHS]), path)
    return path


def test_bench_accounts_for_every_request(server, small_trace, tmp_path):
    before = server.metrics()
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "pagesim.cli", "bench", str(small_trace), "--endpoint", f"{server.base}/v1",
           "--rate", "40", "--num-requests", "50", "--max-concurrency", "16", "--seed", "3", "--scrape-interval", "0.05",
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    summary = json.loads((out / "summary.json").read_text())
    assert not (out / "steps.csv").exists()
    # the same requests, in the same order with the same arrival times, as replay / run build
    expected, _ = build_requests(Trace({}, [TraceRequest(p, o) for p, o in LENGTHS]), rate=40, num_requests=50, seed=3)
    assert [int(r["request_id"]) for r in rows] == list(range(50))
    assert [float(r["arrival_time"]) for r in rows] == pytest.approx([r.arrival_time for r in expected])
    assert all(r["status"] == "finished" for r in rows), [r["reject_reason"] for r in rows if r["status"] != "finished"]
    assert [(int(r["prompt_len"]), int(r["output_len"])) for r in rows] == [(r.prompt_len, r.sampling.max_tokens)
                                                                           for r in expected]
    for r in rows:
        assert float(r["arrival_time"]) <= float(r["first_token_time"]) <= float(r["finish_time"])
    assert summary["num_requests"] == summary["num_finished"] == summary["num_sent"] == 50
    assert summary["num_failed"] == 0 and summary["driver"] == "http" and summary["model"] == MODEL
    assert summary["output_token_throughput"] > 0 and summary["itl_p50"] is not None
    assert summary["mean_batched_requests"] is not None and summary["num_preemptions"] == 0
    assert summary["num_steps"] >= max(o for _, o in LENGTHS), "the server's own step counter, read over /metrics"
    # the server saw exactly the 50 requests and their tokens: nothing sent twice, nothing extra
    after = server.metrics()
    assert after["vllm:request_success_total"] - before.get("vllm:request_success_total", 0) == 50
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == sum(r.sampling.max_tokens
                                                                                               for r in expected)


def test_bench_does_not_send_what_the_server_cannot_hold(server, tmp_path):
    # prompts of 250 tokens + 30 outputs exceed the model's 256 (its max_model_len in /v1/models):
    # skipped, each with its reason, and the exit status says so; clamped, they fit and finish
    path = tmp_path / "long.json"
    save_trace(Trace({"source": "tests/serve", "count": 1}, [TraceRequest(250, 30)]), path)
    cmd = [sys.executable, "-m", "pagesim.cli", "bench", str(path), "--endpoint", server.base, "--rate", "50",
           "--num-requests", "5", "--json"]
    skipped = subprocess.run(cmd, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert skipped.returncode == 3, skipped.stderr
    summary = json.loads(skipped.stdout)
    assert summary["num_skipped"] == 5 and summary["num_sent"] == 0 and summary["num_finished"] == 0
    assert summary["failure_reasons"] == {"skipped: prompt N + output N tokens exceed the server's max_model_len N": 5}
    assert "5 requests need more than the server's max_model_len 256 tokens" in skipped.stderr
    clamped = subprocess.run(cmd + ["--clamp-to-max-model-len"], cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                             timeout=120)
    assert clamped.returncode == 0, clamped.stderr
    summary = json.loads(clamped.stdout)
    assert summary["num_finished"] == 5 and summary["num_clamped"] == 5
    assert summary["total_input_tokens"] == 5 * 250 and summary["total_output_tokens"] == 5 * (256 - 250)


def test_compare_puts_simulated_beside_served(server, small_trace, tmp_path):
    out = tmp_path / "cmp"
    done = subprocess.run([sys.executable, "-m", "pagesim.cli", "compare", str(small_trace), "--endpoint", server.base,
                           "--profile", str(ROOT / "reports/profiles/smollm2_cpu.json"), "--system", "paged-auto",
                           "--num-requests", "10", "--rate", "20", "--num-gpu-blocks", "128", "--num-cpu-blocks", "64",
                           "--max-model-len", "256", "--out", str(out)],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "compare.json").read_text())["systems"]["paged-auto"]
    assert result["measured_by"] == "served"
    served = json.loads((out / "paged-auto/served/summary.json").read_text())
    simulated = json.loads((out / "paged-auto/simulator/summary.json").read_text())
    assert served["num_finished"] == simulated["num_finished"] == 10
    rows = {r["key"]: r for r in result["rows"]}
    assert rows["request_throughput"]["executor"] == served["request_throughput"]
    assert "| served | simulator |" in (out / "compare.md").read_text()

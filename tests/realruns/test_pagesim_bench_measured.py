"""pagesim's own run folders read back (a replay written by pagesim, and a bench-shaped folder
built here), the measured statistics against numpy, and format detection."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import pagesim
from pagesim.metrics import REQUEST_FIELDS
from pagesim.realruns import RealRequest, RealRunError, describe, load_real_run, measured_summary
from pagesim.workload.trace import Trace, TraceRequest, save_trace


def test_a_replay_folder_reads_back_as_a_run(tmp_path):
    shared = list(range(40))
    trace = Trace(metadata={"name": "t"}, requests=[
        TraceRequest(48, 5 + i % 3, prompt_token_ids=shared + [100 + i] * 8, prefix_group=0, shared_prefix_len=40)
        for i in range(12)])
    save_trace(trace, tmp_path / "trace.json")
    result = pagesim.replay(tmp_path / "trace.json", model="opt-125m", gpu="a100-40gb", num_requests=12, rate=4.0,
                            prefix_caching=True)
    result.write(tmp_path / "out")
    run = load_real_run(tmp_path / "out")
    assert run.source_format == "pagesim-bench" and run.server.engine == "pagesim"
    assert run.server.model == "opt-125m" and run.server.enable_prefix_caching is True
    by_id = {r.request_id: r for r in result.metrics.requests}
    start = min(r.arrival_time for r in by_id.values())
    for r in run.requests:
        rec = by_id[r.index]
        assert r.arrival_s == pytest.approx(rec.arrival_time - start, abs=1e-12)
        assert r.ttft_s == pytest.approx(rec.ttft, rel=1e-12) and r.e2e_s == pytest.approx(rec.e2e_latency, rel=1e-12)
        assert r.prompt_token_ids == trace.requests[r.index].prompt_token_ids  # taken back from the trace
    assert run.summary()["ttft_p90"] == pytest.approx(result.summary["ttft_p90"], rel=1e-9)
    assert run.summary()["e2e_mean"] == pytest.approx(result.summary["e2e_mean"], rel=1e-9)


def bench_folder(tmp_path, rows):
    folder = tmp_path / "bench"
    folder.mkdir()
    with open(folder / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=REQUEST_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({name: row.get(name, "") for name in REQUEST_FIELDS})
    (folder / "summary.json").write_text(json.dumps({"driver": "http", "model": "my-model",
                                                     "run": {"rate": 2.0, "max_concurrency": None},
                                                     "trace": str(tmp_path / "gone.json")}))
    return folder


def test_a_bench_folder_with_a_failed_request(tmp_path):
    folder = bench_folder(tmp_path, [
        {"request_id": 1, "status": "finished", "arrival_time": 0.75, "first_token_time": 1.0, "finish_time": 2.0,
         "prompt_len": 10, "output_len": 5},
        {"request_id": 0, "status": "finished", "arrival_time": 0.25, "first_token_time": 0.5, "finish_time": 0.9,
         "prompt_len": 12, "output_len": 3},
        {"request_id": 2, "status": "rejected", "reject_reason": "failed: HTTP 500", "arrival_time": 1.25,
         "prompt_len": 9, "output_len": 0},
    ])
    run = load_real_run(folder / "requests.csv")
    assert [(r.index, r.arrival_s) for r in run.requests] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert run.requests[1].ttft_s == pytest.approx(0.25) and run.requests[1].itl_s == pytest.approx(0.25)
    assert not run.requests[2].ok and run.requests[2].error == "failed: HTTP 500"
    assert run.server.model == "my-model" and run.stages[0].rate == 2.0
    assert any("not found" in a for a in run.assumptions)
    with open(folder / "requests.csv", "a") as f:
        f.write("3,finished,,2.0\n")  # a truncated line
    with pytest.raises(RealRunError, match=r"requests.csv: record line 5: wrong number of cells"):
        load_real_run(folder)


def test_a_bench_folder_with_a_bad_cell(tmp_path):
    folder = bench_folder(tmp_path, [{"request_id": 0, "status": "finished", "arrival_time": "soon",
                                      "first_token_time": 1.0, "finish_time": 2.0, "prompt_len": 3, "output_len": 2}])
    with pytest.raises(RealRunError, match=r"record line 2: field 'arrival_time': must be a number"):
        load_real_run(folder)


def test_measured_summary_against_numpy():
    rng = np.random.default_rng(1)
    requests = []
    for i in range(200):
        ttft, decode, n = rng.uniform(0.01, 1), rng.uniform(0.1, 5), int(rng.integers(1, 50))
        requests.append(RealRequest(i, float(i), 10, n, n, ttft_s=ttft, e2e_s=ttft + decode, ok=i % 17 != 0))
    s = measured_summary(requests)
    ok = [r for r in requests if r.ok]
    ttft = np.array([r.ttft_s for r in ok])
    tpot = np.array([(r.e2e_s - r.ttft_s) / (r.generated_len - 1) for r in ok if r.generated_len > 1])
    weights = np.array([r.generated_len - 1 for r in ok if r.generated_len > 1])
    assert s["num_ok"] == len(ok) == 188
    assert s["ttft_mean"] == pytest.approx(ttft.mean()) and s["ttft_p99"] == pytest.approx(np.percentile(ttft, 99))
    assert s["tpot_p50"] == pytest.approx(np.percentile(tpot, 50))
    repeated = np.repeat(tpot, weights)  # every gap of a request taken as its mean gap
    assert s["itl_mean"] == pytest.approx(repeated.mean()) and s["itl_p90"] == pytest.approx(np.percentile(repeated, 90))
    end = max(r.arrival_s + r.e2e_s for r in ok)
    assert s["request_throughput"] == pytest.approx(len(ok) / end)
    assert measured_summary([])["ttft_mean"] is None


def test_unknown_and_missing_paths(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(RealRunError, match="not a recorded run in a known format"):
        load_real_run(tmp_path / "notes.txt")
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(RealRunError, match="x.json: not a recorded run"):
        load_real_run(tmp_path / "x.json")
    with pytest.raises(RealRunError, match="no such file"):
        load_real_run(tmp_path / "nothing")


def test_describe_says_what_was_read_and_assumed(tmp_path):
    folder = bench_folder(tmp_path, [{"request_id": 0, "status": "finished", "arrival_time": 0.0,
                                      "first_token_time": 0.2, "finish_time": 1.2, "prompt_len": 3, "output_len": 11}])
    text = describe(load_real_run(folder))
    assert "pagesim-bench" in text and "requests: 1 (0 failed)" in text and "TTFT mean 200.0 ms" in text
    assert "TPOT mean 100.0 ms" in text and "assumed: the trace the run sent is not found" in text

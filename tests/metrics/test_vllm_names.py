"""summary.json's vLLM `bench serve` keys, against references computed here: a hand-timed
two-request timeline, numpy over the per-request records, and vLLM's own identities (a
request's TPOT is the mean of its inter-token latencies when every chunk is one token)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pagesim.metrics import REQUEST_FIELDS, STEP_FIELDS, RequestRecord, summarize_requests
from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest, load_trace

ROOT = Path(__file__).resolve().parents[2]
STEP = 0.01


def replay(trace, fast=True, **changes):
    return Replay(ReplayConfig(**changes), trace, cost_model=ConstantCostModel(STEP), fast_forward=fast).run()


@pytest.mark.parametrize("fast", [True, False])
def test_two_request_timeline_by_hand(fast):
    # As in tests/sim/test_replay.py: A (prompt 100, 10 outputs) arrives at 1.0 and gets tokens at
    # 1.01 .. 1.04, then waits out B's prefill [1.04, 1.05] and gets the rest at 1.06 .. 1.11;
    # B (prompt 50, 3 outputs) gets tokens at 1.05, 1.06, 1.07.
    trace = Trace({}, [TraceRequest(prompt_len=100, output_len=10, arrival_time=1.0),
                       TraceRequest(prompt_len=50, output_len=3, arrival_time=1.035)])
    result = replay(trace, fast, rate=None, num_requests=2)
    a, b = sorted(result.metrics.requests, key=lambda r: r.request_id)
    assert a.token_times == pytest.approx([1.01, 1.02, 1.03, 1.04, 1.06, 1.07, 1.08, 1.09, 1.10, 1.11], abs=1e-12)
    assert b.token_times == pytest.approx([1.05, 1.06, 1.07], abs=1e-12)
    s = result.summary
    itl_ms = [10.0] * 3 + [20.0] + [10.0] * 5 + [10.0] * 2  # A's gaps, then B's
    assert s["mean_itl_ms"] == pytest.approx(np.mean(itl_ms), abs=1e-9)
    assert s["median_itl_ms"] == pytest.approx(10.0, abs=1e-9)
    assert s["p99_itl_ms"] == pytest.approx(np.percentile(itl_ms, 99), abs=1e-9)  # 19.0
    assert s["std_itl_ms"] == pytest.approx(np.std(itl_ms), abs=1e-9)
    assert s["mean_tpot_ms"] == pytest.approx((100 / 9 + 10) / 2, abs=1e-9)
    assert s["mean_ttft_ms"] == pytest.approx((10 + 15) / 2, abs=1e-9)
    assert s["median_e2el_ms"] == pytest.approx((110 + 35) / 2, abs=1e-9)
    assert s["std_e2el_ms"] == pytest.approx(37.5, abs=1e-9)
    assert (s["completed"], s["failed"], s["total_input_tokens"], s["total_output_tokens"]) == (2, 0, 150, 13)
    assert s["output_throughput"] == pytest.approx(13 / 0.11, rel=1e-9)
    assert s["total_token_throughput"] == pytest.approx(163 / 0.11, rel=1e-9)
    assert s["request_throughput"] == pytest.approx(2 / 0.11, rel=1e-9)
    assert "normalized_latency_mean" not in s and s["mean_normalized_latency"] == pytest.approx((0.011 + 0.035 / 3) / 2)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_token_times_under_preemption_match_vllm_identities(preemption):
    # a pool too small for the load: requests are preempted and resumed
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    fast = replay(trace, True, rate=8.0, num_requests=60, num_gpu_blocks=300, preemption=preemption)
    slow = replay(trace, False, rate=8.0, num_requests=60, num_gpu_blocks=300, preemption=preemption)
    assert fast.summary["num_preemptions"] > 0
    assert [r.token_times for r in fast.metrics.requests] == [r.token_times for r in slow.metrics.requests]
    finished = [r for r in fast.metrics.requests if r.status == "finished"]
    for r in finished:
        assert len(r.token_times) == r.output_len
        assert r.token_times[0] == r.first_token_time and r.token_times[-1] == r.finish_time
        assert all(gap > 0 for gap in r.inter_token_latencies)
        if r.output_len > 1:  # vLLM: tpot = (latency - ttft) / (output_len - 1) = mean of the request's itl
            assert r.tpot == pytest.approx(np.mean(r.inter_token_latencies), rel=1e-9)
    # a preempted request waits longer between two of its tokens than any step lasts
    assert max(max(r.inter_token_latencies) for r in finished if r.num_preemptions) > 2 * STEP
    s = fast.summary
    itls = np.concatenate([np.diff(r.token_times) for r in finished]) * 1000
    assert s["p99_itl_ms"] == pytest.approx(np.percentile(itls, 99), rel=1e-9)
    assert s["std_itl_ms"] == pytest.approx(np.std(itls), rel=1e-9)
    tpots = [r.tpot * 1000 for r in finished if r.output_len > 1]
    assert s["median_tpot_ms"] == pytest.approx(np.median(tpots), rel=1e-9)
    assert s["total_output_tokens"] == sum(r.output_len for r in finished)


def record(rid, status, arrival, times, prompt=10):
    return RequestRecord(rid, status, "" if status == "finished" else "too long", arrival, times[0] if times else None,
                         times[0] if times else None, times[-1] if times else None, prompt, len(times), 1, 0, 0, 0,
                         **RequestRecord.spans_of(list(times)))


def test_summary_from_records_alone():
    # what an HTTP client measuring a server hands in: records, no steps
    records = [record(0, "finished", 0.0, [0.5, 0.6, 0.8]), record(1, "rejected", 0.2, []),
               record(2, "finished", 1.0, [1.2])]
    s = summarize_requests(records, warmup_s=0.0)
    assert (s["completed"], s["failed"], s["num_rejected"]) == (2, 1, 1)
    assert s["duration_s"] == pytest.approx(1.2)
    assert s["total_input_tokens"] == 20 and s["total_output_tokens"] == 4
    assert s["mean_itl_ms"] == pytest.approx(150.0) and s["p99_itl_ms"] == pytest.approx(np.percentile([100, 200], 99))
    assert s["mean_tpot_ms"] == pytest.approx(150.0)  # the one-token request has no TPOT (vLLM leaves it out)
    assert s["mean_ttft_ms"] == pytest.approx((500 + 200) / 2)
    assert s["reject_reasons"] == {"too long": 1}
    empty = summarize_requests([record(0, "rejected", 0.0, [])])
    assert empty["mean_itl_ms"] is None and empty["completed"] == 0 and empty["request_throughput"] == 0.0


def test_docs_metrics_names_every_field():
    documented = set(re.findall(r"`([a-z0-9_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    sim = Replay(ReplayConfig(num_requests=5, waste_interval_s=1.0), load_trace(ROOT / "traces" / "sharegpt.json"))
    fields = set(sim.run().summary) | set(REQUEST_FIELDS) | set(STEP_FIELDS)
    assert "waste_mean_share" in fields and "p99_itl_ms" in fields
    assert sorted(fields - documented) == []


@pytest.mark.parametrize("sharing", [{"n": 3}, {"beam_width": 4}])
def test_one_token_time_per_output_token_with_sharing(sharing):
    # the longest sequence of a parallel-sampling or beam group produces one token per step it runs
    trace = load_trace(ROOT / "traces" / "alpaca.json")
    result = replay(trace, rate=20.0, num_requests=30, **sharing)
    finished = [r for r in result.metrics.requests if r.status == "finished"]
    assert len(finished) == 30
    for r in finished:
        assert len(r.token_times) == r.output_len
        assert (r.token_times[0], r.token_times[-1]) == (r.first_token_time, r.finish_time)
        assert all(b > a for a, b in zip(r.token_times, r.token_times[1:]))

"""validate replays a closed-loop run closed loop: a guidellm report of one concurrent stage (2
streams) is replayed with 2 clients, each sending its next request the moment its last one ended in
the replay (not at the recorded send times, which followed the real server's latencies)."""

from __future__ import annotations

import pytest

from pagesim.realruns import load_real_run
from pagesim.validate import validate
from tests.realruns.conftest import write_json
from tests.realruns.test_vllm_bench_guidellm import guidellm_request

LENGTHS = [(120, 30), (40, 80), (300, 10), (60, 60), (200, 20), (90, 45), (30, 100), (150, 15)]


def concurrent_report(streams: int = 2) -> dict:
    t0 = 1_700_000_000.0
    requests = [guidellm_request(f"r{i}", t0 + 0.5 * i, t0 + 0.5 * i + 0.05, t0 + 0.5 * i + 1.0, p, o)
                for i, (p, o) in enumerate(LENGTHS)]
    bench = {"type_": "generative_benchmark", "config": {"strategy": {"type_": "concurrent", "streams": streams}},
             "requests": {"successful": requests, "errored": [], "incomplete": []}}
    return {"metadata": {"version": 2, "guidellm_version": "0.8.1"}, "benchmarks": [bench]}


def test_a_concurrent_stage_is_replayed_closed_loop(tmp_path):
    run = load_real_run(write_json(tmp_path / "benchmarks.json", concurrent_report()))
    assert run.stages[0].closed_loop and run.stages[0].concurrency == 2
    result = validate(run, model="opt-13b", gpu="a100-40gb")
    assert result.config.concurrency == 2 and any("closed loop" in n for n in result.notes)
    records = result.replay.metrics.requests
    arrivals = sorted(r.arrival_time for r in records)
    finishes = sorted(r.finish_time for r in records)
    assert arrivals[:2] == [0.0, 0.0]
    assert arrivals[2:] == finishes[:len(LENGTHS) - 2]  # no client idles, none runs two at once
    # --concurrency 0: the recorded send times instead
    open_loop = validate(run, model="opt-13b", gpu="a100-40gb", concurrency=0)
    assert open_loop.config.concurrency is None
    assert sorted(r.arrival_time for r in open_loop.replay.metrics.requests) == pytest.approx(
        [0.5 * i for i in range(len(LENGTHS))])


def sweep_report() -> dict:
    """A guidellm sweep: 1 stream (3 requests), then 2 streams (5 requests), then Poisson (2 requests,
    recorded 0.5 s apart)."""
    t0 = 1_700_000_000.0

    def bench(strategy: dict, start: float, lengths, gap: float = 0.5):
        requests = [guidellm_request(f"{start}-{i}", t0 + start + gap * i, t0 + start + gap * i + 0.05,
                                     t0 + start + gap * i + 1.0, p, o) for i, (p, o) in enumerate(lengths)]
        return {"type_": "generative_benchmark", "config": {"strategy": strategy},
                "requests": {"successful": requests, "errored": [], "incomplete": []}}

    return {"metadata": {"version": 2, "guidellm_version": "0.8.1"},
            "benchmarks": [bench({"type_": "synchronous"}, 0, LENGTHS[:3]),
                           bench({"type_": "concurrent", "streams": 2}, 100, LENGTHS[3:]),
                           bench({"type_": "poisson", "rate": 2.0}, 200, [(50, 5), (60, 6)])]}


def test_a_sweep_of_concurrencies_is_replayed_stage_after_stage(tmp_path):
    run = load_real_run(write_json(tmp_path / "benchmarks.json", sweep_report()))
    assert [(s.closed_loop, s.concurrency) for s in run.stages] == [(True, 1), (True, 2), (False, None)]
    result = validate(run, model="opt-13b", gpu="a100-40gb")
    assert result.config.concurrency is None and any("one after another" in n for n in result.notes)
    records = {r.request_id: r for r in result.replay.metrics.requests}
    stage = [[records[i] for i, real in enumerate(run.requests) if real.stage == k] for k in range(3)]
    one, two, poisson = stage
    # 1 client: each request sent the moment the one before ended, from 0
    assert one[0].arrival_time == 0.0
    assert [r.arrival_time for r in one[1:]] == [r.finish_time for r in one[:-1]]
    # 2 clients, from the moment stage 0's last request ended: never 3 at once, never a client idle
    start = max(r.finish_time for r in one)
    arrivals, finishes = sorted(r.arrival_time for r in two), sorted(r.finish_time for r in two)
    assert arrivals[:2] == [start, start]
    assert arrivals[2:] == finishes[:len(two) - 2]
    # open loop: the recorded 0.5 s gap, from the moment stage 1's last request ended
    start = max(r.finish_time for r in two)
    assert [r.arrival_time for r in poisson] == pytest.approx([start, start + 0.5])
    assert set(result.stages) == {0, 1, 2} and result.counts["compared"] == len(run.requests)
    # --concurrency 0: every stage at the recorded send times, as before
    recorded = validate(run, model="opt-13b", gpu="a100-40gb", concurrency=0)
    assert sorted(r.arrival_time for r in recorded.replay.metrics.requests) == pytest.approx(
        [0, 0.5, 1.0, 100, 100.5, 101, 101.5, 102, 200, 200.5])

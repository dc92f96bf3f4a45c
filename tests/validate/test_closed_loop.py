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

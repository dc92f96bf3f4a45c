"""The one sustainable-rate search (pagesim.sim.rate_search): against known thresholds, reusing
verdicts it already holds, and the early stop of hopeless runs against the same run in full."""

from __future__ import annotations

import math

import pytest

from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.sim.rate_search import SearchSettings, find_sustainable_rate, run_unless_hopeless, run_unless_over
from pagesim.workload.trace import Trace, TraceRequest


def counted(threshold: float):
    asked = []

    def sustainable(rate: float) -> bool:
        asked.append(rate)
        return rate < threshold
    return sustainable, asked


@pytest.mark.parametrize("threshold", [0.03, 0.7, 3.3, 950.0])
def test_brackets_a_known_threshold(threshold):
    sustainable, asked = counted(threshold)
    found = find_sustainable_rate(sustainable, SearchSettings(start_rate=1.0, tolerance=0.05))
    assert found.rate < threshold <= found.failing and found.failing / found.rate - 1 <= 0.05
    assert found.probed == asked and len(set(asked)) == len(asked)


def test_a_second_threshold_starts_from_the_first_ones_verdicts():
    # the figures search the higher threshold first; the lower one is bracketed by its probes
    cache: dict[float, float] = {}  # rate -> "latency" (the rate itself: latency grows with it)
    asked = []

    def under(threshold):
        def sustainable(rate):
            if rate not in cache:
                asked.append(rate)
                cache[rate] = rate
            return cache[rate] < threshold
        return sustainable

    settings = SearchSettings(start_rate=1.0, tolerance=0.1)
    high = find_sustainable_rate(under(5.0), settings)
    first = len(asked)
    low = find_sustainable_rate(under(3.0), settings, judged=sorted(cache))
    assert high.rate < 5.0 <= high.failing and low.rate < 3.0 <= low.failing
    assert low.failing / low.rate - 1 <= 0.1
    # the second search only ran rates inside the bracket the first one's probes gave it (2, 4)
    assert all(2.0 < r < 4.0 for r in asked[first:]) and low.probed == asked[first:]


def test_bounds_are_tried_themselves():
    never, _ = counted(0.0)
    none = find_sustainable_rate(never, SearchSettings(start_rate=1.0, min_rate=0.3))
    assert none.rate is None and none.failing == 0.3 and none.probed == [1.0, 0.5, 0.3]
    always, _ = counted(math.inf)
    capped = find_sustainable_rate(always, SearchSettings(start_rate=1.0, max_rate=5.0))
    assert capped.capped and capped.rate == 5.0 and capped.probed == [1.0, 2.0, 4.0, 5.0]


def test_hopeless_run_stops_early_with_a_lower_bound():
    # 400 requests of 50 output tokens arriving at 20 req/s on an engine that finishes about 2
    # req/s (one request at a time: max_num_seqs=1, 0.01 s a step): latency grows without bound
    trace = Trace({}, [TraceRequest(prompt_len=20, output_len=50)])
    cfg = ReplayConfig(rate=20.0, num_requests=400, max_num_seqs=1, num_gpu_blocks=64, warmup_s=1.0, seed=1)
    full = Replay(cfg, trace, cost_model=ConstantCostModel(0.01)).run().summary
    sim = Replay(cfg, trace, cost_model=ConstantCostModel(0.01))
    partial, stopped = run_unless_hopeless(sim, stop_above=0.2, min_measured=30)
    assert stopped and partial["num_measured"] >= 30 and partial["num_finished"] < full["num_finished"]
    assert 0.2 < partial["mean_normalized_latency"] <= full["mean_normalized_latency"]
    # the same run under a bound it never crosses goes to the end, unchanged
    whole, stopped = run_unless_hopeless(Replay(cfg, trace, cost_model=ConstantCostModel(0.01)), 1e9, 30)
    assert not stopped and whole == full


def test_run_stops_only_when_its_verdict_is_certain():
    # the overloaded engine above: the full run's mean is the truth every stopped run must agree with
    trace = Trace({}, [TraceRequest(prompt_len=20, output_len=50)])
    cfg = ReplayConfig(rate=20.0, num_requests=400, max_num_seqs=1, num_gpu_blocks=64, warmup_s=1.0, seed=1)
    full = Replay(cfg, trace, cost_model=ConstantCostModel(0.01)).run().summary
    mean = full["mean_normalized_latency"]
    stops = []
    for threshold in (0.05, 0.2, mean * 0.5, mean * 0.99, mean, mean * 1.01, 10 * mean):
        summary, stopped = run_unless_over(Replay(cfg, trace, cost_model=ConstantCostModel(0.01)), threshold)
        stops.append(stopped)
        if stopped:  # certain: the whole run ends above the threshold, and the partial run said so
            assert mean > threshold and summary["num_finished"] < full["num_finished"]
            assert summary.keys() == full.keys()
        else:  # ran to the end, unchanged
            assert summary == full
    # far below the mean it stops early; at or above the mean it cannot
    assert stops[:2] == [True, True] and stops[-3:] == [False, False, False]

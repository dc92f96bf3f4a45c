"""ITL statistics without per-token storage (pagesim.metrics) against the brute-force definition:
every request's token times materialized, np.diff per request, pooled, numpy's statistics."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from pagesim.metrics import (RequestRecord, _pooled_inter_token_latencies, _vllm_stats, exact_weighted_sum,
                             summarize_requests, weighted_percentiles)
from pagesim.metrics.itl import exact_weighted_sum_of
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", range(20))
def test_weighted_percentiles_are_numpys_on_the_repeated_values(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 40))
    values = rng.choice([0.1, 0.2, 0.25, 1e-3, 7.0], size) + rng.random(size) * (seed % 2)  # ties in half the cases
    weights = rng.integers(1, 6, size)
    qs = [0, 1, 37.5, 50, 90, 99, 100]
    expected = np.percentile(np.repeat(values, weights), qs)
    assert weighted_percentiles(values, weights, qs) == list(expected)  # exactly, not approximately


@pytest.mark.parametrize("seed", range(20))
def test_vllm_stats_are_numpys(seed):
    # (computed without np.percentile, which imports numpy.ma: the same floats, to the bit)
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 500))
    seconds = rng.exponential(0.05, size) if seed % 2 else rng.integers(0, 4, size) * 0.125  # ties in half the cases
    s = _vllm_stats("x", list(seconds))
    median, p99 = np.percentile(seconds, [50, 99]) * 1000.0
    assert (s["median_x_ms"], s["p99_x_ms"]) == (float(median), float(p99))
    assert (s["mean_x_ms"], s["std_x_ms"]) == (float(seconds.mean()) * 1000.0, float(seconds.std()) * 1000.0)


@pytest.mark.parametrize("seed", range(10))
def test_exact_weighted_sum_is_the_correctly_rounded_sum(seed):
    rng = np.random.default_rng(seed)
    values = rng.random(200) * 10.0 ** rng.integers(-6, 3, 200)
    weights = rng.integers(1, 2**20, 200)
    exact = sum(Fraction(float(v)) * int(w) for v, w in zip(values, weights))
    assert exact_weighted_sum(values, weights) == float(exact)
    # and the same value however the repeated values are grouped
    split = np.repeat(values[:5], weights[:5])
    assert exact_weighted_sum(np.concatenate([split, values[5:]]),
                              np.concatenate([np.ones(len(split), dtype=np.int64), weights[5:]])) == float(exact)


@pytest.mark.parametrize("kind", ["wide", "signed", "ties", "subnormal", "zero weights", "one chunk's worth"])
def test_exact_weighted_sum_of_any_doubles_is_the_fraction_sum(kind):
    # values across the whole double range, both signs, exact ties, subnormals, weights up to
    # 2**26 - 1 and zero: against the sum in exact rationals, rounded once
    rng = np.random.default_rng(len(kind))
    n = 400
    weights = rng.integers(0 if kind == "zero weights" else 1, 2**26, n)
    if kind == "wide":
        values = rng.random(n) * 10.0 ** rng.integers(-300, 290, n)
    elif kind == "signed":
        values = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
    elif kind == "ties":
        values = rng.integers(-8, 8, n) * 0.125
    elif kind == "subnormal":
        values = rng.standard_normal(n) * 2.0 ** rng.integers(-1074, -1010, n)
    elif kind == "zero weights":
        values = rng.exponential(0.02, n)
    else:  # more values than one chunk's pass, in pieces of uneven size
        values, weights = rng.exponential(0.02, 70_000), rng.integers(1, 300, 70_000)
    exact = sum((Fraction(float(v)) * int(w) for v, w in zip(values, weights)), Fraction(0))
    cut = len(values) // 3
    assert exact_weighted_sum_of([(values[:cut], weights[:cut]), (values[cut:], weights[cut:])]) == float(exact)
    assert exact_weighted_sum(values[::-1].copy(), weights[::-1].copy()) == float(exact)


def test_exact_weighted_sum_of_a_non_finite_value_is_nan():
    assert math.isnan(exact_weighted_sum(np.array([1.0, math.inf]), np.array([1, 1])))
    assert exact_weighted_sum(np.zeros(0), np.zeros(0, dtype=np.int64)) == 0.0


def _records_from_times(per_request: list[list[float]]) -> list[RequestRecord]:
    return [RequestRecord(i, "finished", "", 0.0, times[0], times[0], times[-1], 10, len(times), 1, 0, 0, 0,
                          **RequestRecord.spans_of(times)) for i, times in enumerate(per_request)]


def _brute_force(per_request_times: list[list[float]]) -> np.ndarray:
    return np.concatenate([np.diff(times) for times in per_request_times])


def test_spans_over_shared_step_times_equal_per_token_times():
    # requests that get tokens at some steps of one driver (gaps, breaks, shared runs)
    rng = random.Random(1)
    step_times = [0.0]
    for _ in range(300):
        step_times.append(step_times[-1] + rng.choice([0.01, 0.013, 0.2]) + rng.random() * 1e-3)
    records, brute = [], []
    for rid in range(40):
        steps = sorted(rng.sample(range(len(step_times)), rng.randint(1, 120)))
        spans = []
        for k in steps:
            if spans and spans[-1] == k:
                spans[-1] = k + 1
            else:
                spans += [k, k + 1]
        records.append(RequestRecord(rid, "finished", "", 0.0, step_times[steps[0]], step_times[steps[0]],
                                     step_times[steps[-1]], 10, len(steps), 1, 0, 0, 0, token_spans=spans,
                                     step_times=step_times))
        brute.append([step_times[k] for k in steps])
    for r, times in zip(records, brute):
        assert r.token_times == times
    values, weights = _pooled_inter_token_latencies(records)
    gaps = _brute_force(brute)
    assert sorted(np.repeat(values, weights)) == sorted(gaps)
    s = summarize_requests(records)
    assert s["median_itl_ms"] == np.percentile(gaps, 50) * 1000.0
    assert s["p99_itl_ms"] == np.percentile(gaps, 99) * 1000.0
    assert s["mean_itl_ms"] == pytest.approx(gaps.mean() * 1000.0, rel=1e-14)
    assert s["mean_itl_ms"] == math.fsum(gaps) / len(gaps) * 1000.0  # correctly rounded sum
    assert s["std_itl_ms"] == pytest.approx(gaps.std() * 1000.0, rel=1e-12)
    # the same summary from the same times held one by one
    assert summarize_requests(_records_from_times(brute)) == s


@pytest.mark.parametrize("changes", [dict(), dict(n=2, num_gpu_blocks=400), dict(chunked_prefill=True,
                                                                                   max_num_batched_tokens=512)])
def test_replay_itl_statistics_equal_the_per_token_definition(changes):
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    result = Replay(ReplayConfig(num_requests=150, rate=4.0, **changes), trace).run()
    finished = [r for r in result.metrics.requests if r.status == "finished"]
    gaps = _brute_force([r.token_times for r in finished])
    s = result.summary
    assert len(gaps) == sum(r.output_len - 1 for r in finished)
    assert s["median_itl_ms"] == np.percentile(gaps, 50) * 1000.0
    assert s["p99_itl_ms"] == np.percentile(gaps, 99) * 1000.0
    assert s["mean_itl_ms"] == math.fsum(gaps) / len(gaps) * 1000.0
    assert s["std_itl_ms"] == pytest.approx(gaps.std() * 1000.0, rel=1e-12)

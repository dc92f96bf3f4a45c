"""The ITL statistics read a chunk at a time (pagesim.metrics.itl) against numpy on the values
materialised and repeated: the same floats whatever the chunking, and a replay's pooled gaps
with tiny chunks equal to the per-token definition."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pagesim.metrics import itl
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
QS = [0, 0.5, 1, 37.5, 50, 90, 99, 99.9, 100]


def _split(rng, values, weights):
    """The pairs cut at random places into chunks (some empty)."""
    cuts = np.sort(rng.integers(0, len(values) + 1, int(rng.integers(0, 6))))
    edges = [0, *cuts.tolist(), len(values)]
    return [(values[a:b], weights[a:b]) for a, b in zip(edges, edges[1:])]


def _values(rng, kind: str, size: int) -> np.ndarray:
    if kind == "one bin":  # every value in one histogram bin (the same top mantissa bits)
        return 0.0250 + rng.random(size) * 1e-4
    if kind == "signed":
        return rng.normal(0.0, 3.0, size)
    if kind == "ties":
        return rng.choice([0.0, 1e-3, 0.02, 0.02, 7.0], size)
    return rng.exponential(0.03, size) * 10.0 ** rng.integers(-5, 4, size)  # many binades


@pytest.mark.parametrize("kind", ["one bin", "signed", "ties", "spread"])
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("sorted_at_once", [0, 1 << 18])  # radix select, or a sort of every value
def test_percentiles_over_chunks_are_numpys_on_the_repeated_values(kind, seed, sorted_at_once, monkeypatch):
    monkeypatch.setattr(itl, "SORTED_AT_ONCE", sorted_at_once)
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 300))
    values, weights = _values(rng, kind, size), rng.integers(1, 9, size).astype(np.int32)
    chunks = _split(rng, values, weights)
    expected = np.percentile(np.repeat(values, weights), QS)
    assert itl.weighted_percentiles_of(lambda: chunks, QS) == list(expected)  # exactly


@pytest.mark.parametrize("seed", range(6))
def test_stats_over_chunks_do_not_depend_on_the_chunking(seed):
    rng = np.random.default_rng(seed)
    values, weights = _values(rng, "spread", 400), rng.integers(1, 50, 400)
    whole = itl.weighted_vllm_stats("x", lambda: [(values, weights)])
    chunks = _split(rng, values, weights)
    assert itl.weighted_vllm_stats("x", lambda: chunks) == whole
    repeated = np.repeat(values, weights)
    assert whole["mean_x_ms"] == math.fsum(repeated) / len(repeated) * 1000.0  # correctly rounded
    assert whole["std_x_ms"] == pytest.approx(repeated.std() * 1000.0, rel=1e-12)
    assert itl.weighted_vllm_stats("x", lambda: [(values[:0], weights[:0])]) is None


def test_pair_counts_merged_as_they_come_equal_one_count_over_all(monkeypatch):
    monkeypatch.setattr(itl, "CHUNK", 8)  # merge often
    rng = np.random.default_rng(3)
    parts = [rng.integers(0, 50, int(rng.integers(0, 30))) for _ in range(40)]
    counter = itl._PairCounts()
    for part in parts:
        counter.add(part.astype(np.int64))
    unique, counts = counter.result()
    expected_unique, expected_counts = np.unique(np.concatenate(parts), return_counts=True)
    assert unique.tolist() == expected_unique.tolist() and counts.tolist() == expected_counts.tolist()


@pytest.mark.parametrize("changes", [dict(), dict(n=2, num_gpu_blocks=400),
                                     dict(chunked_prefill=True, max_num_batched_tokens=512)])
def test_replay_gaps_in_tiny_chunks_equal_the_per_token_definition(monkeypatch, changes):
    # chunks of 7 steps and folds of 5 span entries: every path of TokenGaps runs many times
    monkeypatch.setattr(itl, "CHUNK", 7)
    monkeypatch.setattr(itl, "SORTED_AT_ONCE", 7)
    monkeypatch.setattr(itl, "FOLD_SPANS", 5)
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    result = Replay(ReplayConfig(num_requests=120, rate=4.0, **changes), trace).run()
    finished = [r for r in result.metrics.requests if r.status == "finished"]
    gaps = np.concatenate([np.diff(r.token_times) for r in finished])
    values, weights = itl.TokenGaps(finished).arrays()
    assert sorted(np.repeat(values, weights)) == sorted(gaps)
    s = result.summary
    assert s["median_itl_ms"] == np.percentile(gaps, 50) * 1000.0
    assert s["p99_itl_ms"] == np.percentile(gaps, 99) * 1000.0
    assert s["mean_itl_ms"] == math.fsum(gaps) / len(gaps) * 1000.0


def test_stats_over_chunks_never_hold_every_value():
    # 2**21 (value, weight) pairs made a chunk at a time: materialised they take 24 MiB (float64
    # values, int32 weights) and the statistics another 38 MiB at their peak (measured); read in
    # chunks the peak stays a few chunks' worth (6 MiB here: mostly the exact sums' float lists)
    import tracemalloc

    size, step = 1 << 21, itl.CHUNK

    def chunks():
        for i in range(0, size, step):
            rng = np.random.default_rng(i)  # (the same chunk at every pass)
            yield rng.exponential(0.03, step), rng.integers(1, 9, step).astype(np.int32)

    tracemalloc.start()
    try:
        stats = itl.weighted_vllm_stats("x", chunks)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats["p99_x_ms"] > stats["median_x_ms"] > 0
    assert peak < 10 * 2**20, f"peak {peak / 2**20:.1f} MiB"

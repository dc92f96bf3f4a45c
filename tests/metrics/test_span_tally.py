"""A replay that keeps no per-step records (keep_steps=False: `--json`, the planner) keeps no
token spans in its records either: its measured requests' spans are folded into the recorder's
SpanTally as they leave. Its inter-token statistics must still be those of every measured
request's own token-to-token gaps (vLLM's per-token definition), read off a replay of the same
run that keeps the spans (the simulation does not depend on keep_steps)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pagesim.cluster.cluster import Cluster
from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
from pagesim.metrics import itl
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]


def _per_token_gaps(records, warmup_s: float) -> np.ndarray:
    measured = [r for r in records if r.status == "finished" and r.arrival_time >= warmup_s]
    return np.concatenate([np.diff(r.token_times) for r in measured])


def _check(summary: dict, gaps: np.ndarray) -> None:
    assert summary["median_itl_ms"] == np.percentile(gaps, 50) * 1000.0
    assert summary["p99_itl_ms"] == np.percentile(gaps, 99) * 1000.0
    assert summary["mean_itl_ms"] == math.fsum(gaps) / len(gaps) * 1000.0
    assert summary["std_itl_ms"] == pytest.approx(gaps.std() * 1000.0, rel=1e-9)


@pytest.mark.parametrize("changes", [dict(), dict(warmup_s=20.0), dict(n=2, num_gpu_blocks=400),
                                     dict(chunked_prefill=True, max_num_batched_tokens=512)])
def test_tallied_gaps_equal_the_per_token_definition(monkeypatch, changes):
    monkeypatch.setattr(itl, "FOLD_SPANS", 7)  # fold often: every path of SpanTally runs many times
    monkeypatch.setattr(itl, "SORTED_AT_ONCE", 0)  # and the radix select, not a sort
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    cfg = ReplayConfig(num_requests=150, rate=4.0, **changes)
    kept = Replay(cfg, trace).run()
    tallied = Replay(cfg, trace, keep_steps=False).run()
    assert all(not r.token_spans for r in tallied.metrics.requests)  # nothing per request
    assert tallied.metrics.span_tally.num_requests > 0
    _check(tallied.summary, _per_token_gaps(kept.metrics.requests, cfg.warmup_s))


def test_cluster_pools_its_replicas_tallies():
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    cfg = ReplayConfig(num_requests=200, rate=8.0, warmup_s=5.0)
    spec = ClusterSpec([ReplicaGroup("g", cfg, 3)], staleness_s=1.0)
    # (replayed apart, a cluster's records come back packed, without token times: those of the one clock's)
    kept = Cluster(spec, trace, independent=False).run()
    tallied = Cluster(spec, trace, keep_steps=False).run()
    assert all(not r.token_spans for r in tallied.requests)
    _check(tallied.summary, _per_token_gaps(kept.requests, cfg.warmup_s))


def test_a_tally_measured_by_another_warmup_is_refused():
    from pagesim.metrics import summarize_requests

    tally = itl.SpanTally([0.0, 1.0], warmup_s=10.0, origin=0.0)
    with pytest.raises(ValueError, match="warm-up"):
        summarize_requests([], 0.0, 0.0, [tally])


@pytest.mark.parametrize("requests", [3, 70_000])  # counts in 2 bytes, and past them
def test_gap_counts_give_the_tallys_statistics(requests):
    """SpanTally.gap_counts (what a packed recorder keeps): the same gaps as distinct values with
    counts, so the same statistics, without the step times."""
    times = [0.0, 0.5, 1.5, 2.0, 3.0, 3.25]  # gaps 0.5, 1.0, 0.5, 1.0, 0.25: two values recur
    tally = itl.SpanTally(times, warmup_s=0.0, origin=0.0)
    for k in range(requests):
        tally.add([0, 6] if k % 3 else [0, 2, 3, 5])  # (a break: steps 1 -> 3)
    counts = tally.gap_counts()
    assert counts.num_requests == requests and len(counts.values) == 4  # 0.25, 0.5, 1.0 and the break's 1.5
    assert counts.weights.dtype == (np.uint16 if requests < 1000 else np.int32)
    assert (counts.warmup_s, counts.origin) == (0.0, 0.0)
    expected = itl.weighted_vllm_stats("itl", lambda: itl.TokenGaps([], [tally]).chunks())
    assert itl.weighted_vllm_stats("itl", lambda: itl.TokenGaps([], [counts]).chunks()) == expected

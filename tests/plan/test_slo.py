"""SLO parsing and evaluation, against numpy and a direct count."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagesim.plan.slo import SLOError, goodput, parse_slos, slo_values


def test_parse_names_stats_and_thresholds():
    slos = parse_slos("ttft_p99=2.0, tpot_p99=0.1,e2e_p90=30,normalized_latency_mean=0.5,ttft_p99.9=4,goodput=0.9")
    assert [(s.metric, s.stat, s.threshold) for s in slos] == [
        ("ttft", "p99", 2.0), ("tpot", "p99", 0.1), ("e2e", "p90", 30.0), ("normalized_latency", "mean", 0.5),
        ("ttft", "p99.9", 4.0), ("goodput", "", 0.9)]
    assert parse_slos("mean_normalized_latency=0.4")[0].name == "normalized_latency_mean"


@pytest.mark.parametrize("text, words", [
    ("latency_p99=2", "unknown SLO 'latency_p99=2'"),
    ("ttft_p100=2", "unknown SLO"),
    ("ttft_max=2", "unknown SLO"),
    ("ttft_p99", "expected NAME=VALUE"),
    ("ttft_p99=fast", "not a number"),
    ("ttft_p99=-1", ">= 0"),
    ("goodput=0.9", "needs at least one latency SLO"),
    ("ttft_p99=1,goodput=1.5", "fraction"),
    ("ttft_p99=1,ttft_p99=2", "given twice"),
    ("", "no SLO given"),
])
def test_bad_slos_are_named_with_the_valid_ones(text, words):
    with pytest.raises(SLOError) as e:
        parse_slos(text)
    assert words in str(e.value)
    if "unknown" in words:
        for name in ("ttft_<stat>", "tpot_<stat>", "e2e_<stat>", "normalized_latency_<stat>", "goodput"):
            assert name in str(e.value)


def test_values_match_numpy_and_goodput_matches_a_count():
    rng = random.Random(3)
    n = 501
    lat = {"ttft": [rng.expovariate(2) for _ in range(n)],
           "tpot": [None if i % 17 == 0 else rng.uniform(0.01, 0.2) for i in range(n)],
           "e2e": [None if i % 50 == 7 else rng.uniform(1, 60) for i in range(n)],
           "normalized_latency": [rng.uniform(0.01, 1) for _ in range(n)]}
    slos = parse_slos("ttft_p99=2,tpot_p95=0.15,e2e_mean=30,normalized_latency_p50=0.5,goodput=0.5")
    got = slo_values(lat, slos)
    present = lambda m: [v for v in lat[m] if v is not None]  # noqa: E731
    assert got["ttft_p99"] == pytest.approx(np.percentile(lat["ttft"], 99), rel=1e-12)
    assert got["tpot_p95"] == pytest.approx(np.percentile(present("tpot"), 95), rel=1e-12)
    assert got["e2e_mean"] == pytest.approx(np.mean(present("e2e")), rel=1e-12)
    assert got["normalized_latency_p50"] == pytest.approx(np.median(lat["normalized_latency"]), rel=1e-12)
    good = sum(1 for i in range(n) if lat["e2e"][i] is not None and lat["ttft"][i] <= 2
               and (lat["tpot"][i] is None or lat["tpot"][i] <= 0.15) and lat["e2e"][i] <= 30
               and lat["normalized_latency"][i] <= 0.5)
    assert got["goodput"] == good / n
    assert 0 < good < n  # the check above is not vacuous
    assert goodput({"e2e": []}, slos[:1]) is None

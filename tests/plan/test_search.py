"""The bracketing search: against a known threshold, and against a brute-force scan of real
simulated runs on a small grid."""

from __future__ import annotations

import math

import pytest

from pagesim.plan import GridPoint, SearchSettings, bracket_search, parse_slos
from pagesim.plan.search import ROUNDING, scouted_search
from pagesim.plan.cache import RunCache, trace_hash
from pagesim.plan.run import Evaluation, RateEvaluator
from tests.plan.common import SMALL_TRACE, TINY_RUNS


def step(threshold: float):
    """Sustainable exactly below `threshold`; records the rates asked for."""
    asked = []

    def evaluate(rate: float) -> Evaluation:
        asked.append(rate)
        ok = rate < threshold
        return Evaluation(rate, ok, {}, "flat", [] if ok else ["ttft_p99"])
    evaluate.asked = asked
    return evaluate


@pytest.mark.parametrize("threshold", [0.037, 0.9, 1.0, 1.01, 7.3, 123.4, 5000.0])
def test_finds_a_known_threshold_within_tolerance(threshold):
    settings = SearchSettings(start_rate=1.0, tolerance=0.02)
    ev = step(threshold)
    found = bracket_search(ev, settings)
    assert found.rate < threshold <= found.rate * 1.02 + 1e-12
    assert found.upper.rate >= threshold and found.upper.rate / found.rate - 1 <= 0.02 * (1 + ROUNDING)
    # geometric bisection: about log2(log(growth) / log(1 + tol)) steps after bracketing
    bracketing = abs(math.log(threshold, 2)) + 2
    assert len(ev.asked) <= bracketing + math.ceil(math.log2(math.log(2) / math.log(1.02))) + 1


def test_no_sustainable_rate_and_the_cap():
    # the bounds are tried themselves: min_rate fails, so nothing is sustainable; max_rate holds
    none = bracket_search(step(0.001), SearchSettings(min_rate=0.01))
    assert none.rate is None and none.lower is None and none.upper.rate == 0.01
    capped = bracket_search(step(math.inf), SearchSettings(max_rate=100.0))
    assert capped.capped and capped.rate == 100.0 and capped.upper is None
    assert [p.rate for p in capped.points] == [1, 2, 4, 8, 16, 32, 64, 100]


@pytest.mark.slow  # ~5 minutes each: every probe runs to steady state (1,000+ measured requests)
@pytest.mark.parametrize("gpu, slo", [("a100-40gb", "ttft_p99=0.5"), ("h100-80gb", "tpot_p90=0.02")])
def test_bracketing_matches_a_brute_force_scan_of_simulated_runs(gpu, slo):
    tol = 0.05
    slos = parse_slos(slo)
    point = GridPoint(gpu, 1, 16, "recompute", 256)
    evaluate = RateEvaluator(TINY_RUNS, point, SMALL_TRACE, trace_hash(SMALL_TRACE), slos, RunCache(None))
    found = bracket_search(evaluate, SearchSettings(start_rate=1.0, tolerance=tol))
    assert found.rate is not None and not found.capped
    # Brute force: every rate on a fine geometric grid (step 2%) from 30% below to 30% above,
    # independent of where the search looked; the capacity is the last rate before the first failure.
    rates = [found.rate / 1.3 * 1.02 ** k for k in range(int(math.log(1.3 * 1.3) / math.log(1.02)) + 1)]
    verdicts = [evaluate(r).sustainable for r in rates]
    assert verdicts[0] and not verdicts[-1], "the scan must straddle the capacity"
    first_fail = verdicts.index(False)
    brute = rates[first_fail - 1]
    assert abs(found.rate - brute) / brute <= tol + 0.02, (found.rate, brute)


def test_a_growing_queue_is_unsustainable_even_when_the_slos_hold():
    # TPOT does not see queueing: with at most 8 running sequences an overloaded replica keeps its
    # TPOT while requests pile up in the waiting queue; the steady-state trend must catch that.
    slos = parse_slos("tpot_p99=10")
    point = GridPoint("a100-40gb", 1, 16, "recompute", 8)
    evaluate = RateEvaluator(TINY_RUNS, point, SMALL_TRACE, trace_hash(SMALL_TRACE), slos, RunCache(None))
    overloaded = evaluate(5.0)
    assert overloaded.values["tpot_p99"] <= 10 and overloaded.violations == ["queue grows"]
    trend = overloaded.stats["trend"]
    # 8 at a time with ShareGPT's outputs serve well under 1 req/s: the queue gains most of the 5 req/s
    assert trend["low"] > 0 and trend["slope"] > 2.5
    relaxed = evaluate(0.05)
    assert relaxed.sustainable and relaxed.steady == "flat"


@pytest.mark.parametrize("threshold", [0.037, 1.0, 7.3, 123.4])
@pytest.mark.parametrize("scout_bias", [0.5, 0.97, 1.0, 1.3, 3.0])
def test_the_scouted_search_finds_the_threshold_whatever_the_scout_says(threshold, scout_bias):
    """Scouts that put the knee at scout_bias x the true one (short runs flatter: above 1, the
    usual case): the full probes still bracket the true threshold within the tolerance, and a
    scout near the truth leaves only a few full probes."""
    settings = SearchSettings(start_rate=1.0, tolerance=0.02)
    full, scout = step(threshold), step(threshold * scout_bias)
    found = scouted_search(full, scout, settings)
    assert found.rate < threshold <= found.rate * 1.02 + 1e-12
    assert not found.upper.sustainable and found.upper.rate / found.rate - 1 <= 0.02 * (1 + ROUNDING)
    assert [p.rate for p in found.points] == full.asked and [p.rate for p in found.scouts] == scout.asked
    if scout_bias in (0.97, 1.0):  # the scouted capacity within ~5 % of the knee: a walk of a few steps
        assert len(full.asked) <= 4


def test_the_scouted_search_keeps_the_bounds():
    capped = scouted_search(step(math.inf), step(math.inf), SearchSettings(max_rate=100.0))
    assert capped.capped and capped.rate == 100.0 and [p.rate for p in capped.points] == [100.0]
    none = scouted_search(step(0.001), step(0.001), SearchSettings(min_rate=0.01))
    assert none.rate is None and none.upper.rate == 0.01 and [p.rate for p in none.points] == [0.01]


def test_a_bracket_one_tolerance_wide_by_construction_is_not_bisected_again():
    # the README plan's a100-80gb walk: a failure at 8 sqrt 2 = 11.3137 req/s, one step down a
    # pass at 11.3137 / 1.02 = 11.0919; in floats their ratio is 1 + 0.020000000000000018, over
    # the tolerance by rounding alone, which used to cost one more full probe (at 11.2022)
    start = 8 * math.sqrt(2)
    lo = start / 1.02
    assert start / lo - 1 > 0.02  # the premise: rounding puts the exact-width bracket over
    ev = step(11.2)
    found = bracket_search(ev, SearchSettings(start_rate=1.0, tolerance=0.02), start=start)
    assert ev.asked == [start, lo]
    assert (found.rate, found.upper.rate) == (lo, start)
    # the same from the bracketing (the scouts' search): a growth of exactly the tolerance makes
    # a bracket that passes; one wider by a relative 1e-6 (a thousand times the slack) is bisected
    for growth, asks in ((1.02, 2), (1.02 * (1 + 1e-6), 3)):
        ev = step(11.2)
        found = bracket_search(ev, SearchSettings(start_rate=lo, growth=growth, tolerance=0.02))
        assert len(ev.asked) == asks and found.rate < 11.2 <= found.upper.rate

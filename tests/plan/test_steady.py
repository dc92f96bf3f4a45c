"""Steady-state probes (pagesim.plan.steady, pagesim.plan.run.probe_steady) against systems whose
answer is computed by hand: an M/D/1 queue built from the simulator itself, and synthetic
number-in-system paths that are stable or grow slowly."""

from __future__ import annotations

import copy
import math
import random

import pytest

from pagesim.plan import steady
from pagesim.plan.run import probe_steady, run_record, scout_probe
from pagesim.plan.search import ROUNDING, SearchSettings, bracket_search, scouted_search
from pagesim.plan.slo import FailureWatch, parse_slos, statistic
from pagesim.sim.cost.base import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest

# M/D/1: one request at a time (max_num_seqs 1), every step STEP_S seconds, every request OUTPUT
# tokens (its prefill step gives the first, OUTPUT - 1 decode steps the rest): a deterministic
# service of S = OUTPUT x STEP_S, service rate 1 / S, Poisson arrivals.
STEP_S, OUTPUT = 0.01, 5
SERVICE_S = OUTPUT * STEP_S
MU = 1 / SERVICE_S  # 20 req/s
TRACE = Trace({"name": "md1"}, [TraceRequest(prompt_len=4, output_len=OUTPUT)])


# The searches below probe many of the same (rate, requests) runs (every search starts by doubling
# from 1 req/s, and the SLOs' knees lie close): each run is simulated once for the module. A run
# is deterministic (seed 0, constant step cost), so a stored record is the one a new run would give.
_MD1_RUNS: dict[tuple[float, int], dict] = {}


def md1_run(rate: float):
    def one(n: int) -> dict:
        if (rate, n) not in _MD1_RUNS:
            cfg = ReplayConfig(model="opt-125m", gpu="a100-40gb", rate=rate, num_requests=n, max_num_seqs=1,
                               warmup_s=0.2 * n / rate, seed=0)
            sim = Replay(cfg, TRACE, cost_model=ConstantCostModel(STEP_S), keep_steps=False)
            result = sim.run()
            _MD1_RUNS[rate, n] = run_record(rate, cfg.warmup_s, result.metrics.requests, result.summary)
        return copy.deepcopy(_MD1_RUNS[rate, n])  # (a caller may edit its record)
    return one


def md1_probe(slos, num_requests: int, tolerance: float = 0.02, max_requests: int = 40_000):
    return lambda rate: probe_steady(md1_run(rate), num_requests, max_requests, slos, tolerance)


def md1_search(slos, num_requests: int, scouted: bool, tolerance: float, max_requests: int):
    """The planner's search (scouted: short scout probes first, pagesim.plan.search) or plain bisection."""
    settings = SearchSettings(start_rate=1.0, tolerance=tolerance)
    probe = md1_probe(slos, num_requests, tolerance, max_requests)
    if not scouted:
        return bracket_search(probe, settings)
    return scouted_search(probe, lambda rate: scout_probe(md1_run(rate), num_requests, slos, tolerance), settings)


def test_the_md1_system_serves_at_its_hand_computed_rate():
    # at a low load no request waits: TTFT is one step, e2e the whole service
    # at a low load: TTFT is one step plus the Pollaczek-Khinchine wait rho S / (2 (1 - rho))
    rate = 0.5
    rho = rate / MU
    ev = md1_probe(parse_slos("ttft_mean=1"), 400)(rate)
    assert ev.sustainable and ev.values["ttft_mean"] == pytest.approx(STEP_S + rho * SERVICE_S / (2 * (1 - rho)), rel=0.03)


@pytest.mark.parametrize("scouted", [True, False], ids=["scouted", "bisection"])
@pytest.mark.parametrize("num_requests", [300, 3000])
def test_the_search_finds_the_md1_knee_of_a_mean_ttft_slo(num_requests, scouted):
    # Pollaczek-Khinchine for deterministic service: mean wait Wq = rho S / (2 (1 - rho)); the SLO
    # mean TTFT = Wq + one step <= STEP_S + 2 S holds up to rho = 2w / (1 + 2w) with w = 2, 0.8.
    w = 2.0
    knee = (2 * w / (1 + 2 * w)) * MU  # 16 req/s
    slos = parse_slos(f"ttft_mean={STEP_S + w * SERVICE_S}")
    found = md1_search(slos, num_requests, scouted, tolerance=0.03, max_requests=20_000)
    assert found.rate == pytest.approx(knee, rel=0.05), found.rate
    assert found.upper.rate / found.rate - 1 <= 0.03 * (1 + ROUNDING)
    assert found.lower.sustainable and not found.upper.sustainable  # both ends judged by full probes
    assert bool(found.scouts) == scouted


@pytest.mark.parametrize("scouted", [True, False], ids=["scouted", "bisection"])
@pytest.mark.parametrize("num_requests", [300, 3000])
def test_with_a_slo_that_never_binds_the_knee_is_the_service_rate(num_requests, scouted):
    # only the queue's growth can fail a rate: the capacity is just below mu, never above it
    found = md1_search(parse_slos("tpot_p50=100"), num_requests, scouted, tolerance=0.03, max_requests=10_000)
    assert 0.85 * MU <= found.rate <= MU / (1 - 0.03), found.rate  # growth < tolerance x rate: r - MU < 0.03 r
    assert "queue grows" in found.upper.violations or "undecided" in found.upper.violations


def md1_path(rate: float, num: int, seed: int = 1) -> list[tuple[float, float]]:
    """(arrival, departure) of num FCFS M/D/1 customers, by the Lindley recursion."""
    rng = random.Random(seed)
    t = free = 0.0
    stays = []
    for _ in range(num):
        t += rng.expovariate(rate)
        start = max(t, free)
        free = start + SERVICE_S
        stays.append((t, free))
    return stays


def test_a_stable_run_is_flat_and_a_slowly_growing_one_grows():
    # stable: rho = 0.5, 20,000 customers; growing: 3 % more arrivals than the server serves, a
    # queue that gains 0.6 requests per second: over 1,600 s about 1,000 requests
    stable = md1_path(0.5 * MU, 20_000)
    end = stable[-1][0]
    trend = steady.in_system_trend(stable, 0.2 * end, end)
    assert trend.verdict(0.02 * 0.5 * MU) == steady.FLAT
    growing = md1_path(1.03 * MU, 40_000)
    end = growing[-1][0]
    trend = steady.in_system_trend(growing, 0.2 * end, end)
    assert trend.low > 0 and trend.slope == pytest.approx(0.03 * MU, rel=0.35)
    assert trend.verdict(0.02 * 1.03 * MU) == steady.GROWS


def test_batch_means_integrate_the_number_in_system_exactly():
    # stays [0, 3) and [1, 2) over a 4 s window in 2 slices: [0, 2) holds 2 + 1 request-seconds, [2, 4) holds 1
    assert steady.batch_means([(0.0, 3.0), (1.0, 2.0)], 0.0, 4.0, batches=2) == [1.5, 0.5]
    # a least-squares line through 1, 2, 3 over 3 s: slope 1/s, no residual, a zero-width interval
    t = steady.fit_trend([1.0, 2.0, 3.0], 3.0)
    assert (t.slope, t.low, t.high) == pytest.approx((1.0, 1.0, 1.0))


def _loop_batch_means(stays, start, end, batches):
    """The reference: each stay's time in each slice it covers, added slice by slice in the stays'
    order, in Python floats."""
    width = (end - start) / batches
    area = [0.0] * batches
    for enter, leave in stays:
        lo, hi = max(enter, start), min(leave, end)
        if hi <= lo:
            continue
        for k in range(int((lo - start) // width), min(int((hi - start) // width), batches - 1) + 1):
            area[k] += max(0.0, min(hi, start + (k + 1) * width) - max(lo, start + k * width))
    return [x / width for x in area]


def test_batch_means_of_chunks_are_the_python_loops_floats():
    # random stays (most within a slice, some over several, some outside the window or empty,
    # some on slice edges exactly) in random chunks: the very floats of the loop over the stays
    np = pytest.importorskip("numpy")
    rng = random.Random(11)
    for trial in range(30):
        start, end = rng.uniform(0, 100), rng.uniform(150, 400)
        batches = rng.choice([1, 2, 7, 20])
        width = (end - start) / batches
        stays = []
        for _ in range(rng.randint(0, 3000)):
            enter = rng.choice([rng.uniform(0, 450), start + rng.randint(0, batches) * width])
            leave = enter + rng.choice([rng.expovariate(1 / 2), rng.uniform(0, 300), 0.0, -1.0])
            stays.append((enter, leave))
        expected = _loop_batch_means(stays, start, end, batches)
        assert steady.batch_means(stays, start, end, batches) == expected
        cuts = sorted(rng.sample(range(len(stays) + 1), min(4, len(stays) + 1)))
        pieces = [stays[a:b] for a, b in zip([0] + cuts, cuts + [len(stays)])]
        chunks = [(np.array([e for e, _ in p], dtype=float), np.array([x for _, x in p], dtype=float)) for p in pieces]
        assert steady.batch_means_of(chunks, start, end, batches) == expected, trial


def test_the_failure_watch_stops_only_when_the_failure_is_certain():
    # brute force: for random latencies, whenever the watch fires, even the best possible
    # remaining values (all zero) leave the SLO failed
    rng = random.Random(3)
    slos = parse_slos("ttft_p90=1.0,e2e_mean=2.0")
    for _ in range(200):
        n = rng.randint(5, 40)
        ttft = [rng.uniform(0, 2) for _ in range(n)]
        e2e = [rng.uniform(0, 4) for _ in range(n)]
        watch = FailureWatch(slos, n)
        for k in range(n):
            fired = watch.add({"ttft": ttft[k], "e2e": e2e[k], "tpot": None, "normalized_latency": None})
            if fired is None:
                continue
            best = [0.0] * (n - k - 1)  # the rest as good as can be
            values = {"ttft_p90": statistic(ttft[:k + 1] + best, "p90"), "e2e_mean": statistic(e2e[:k + 1] + best, "mean")}
            assert values[fired.name] > fired.threshold
            break
        else:  # never fired: a mean is decided exactly once every value is in, so it holds
            assert statistic(e2e, "mean") <= 2.0


def test_requests_needed_reaches_the_window():
    n = steady.requests_needed(1000, window_s=50.0, mean_service_s=20.0)  # needs 160 s: x3.2, +10 %
    assert n == math.ceil(1000 * 3.2 * 1.1)
    assert steady.requests_needed(1000, window_s=500.0, mean_service_s=10.0) == 2000  # at least doubled

import numpy as np
import pytest

from pagesim.workload.arrivals import (NUMPY_FROM, ArrivalProcess, _gamma_gaps, gamma_arrivals, poisson_arrivals,
                                      trace_arrivals, with_arrivals)
from pagesim.workload.exponential import standard_exponentials
from pagesim.workload.trace import Trace, TraceRequest


def gaps_of(times):
    return np.diff(np.concatenate([[0.0], times]))


def test_poisson_rate_and_cv():
    rate = 2.5
    times = poisson_arrivals(rate, count=20_000, seed=1)
    assert len(times) == 20_000 and times[0] > 0 and np.all(np.diff(times) >= 0)
    assert abs(len(times) / times[-1] - rate) / rate < 0.03
    gaps = gaps_of(times)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05


@pytest.mark.parametrize("burstiness", [0.5, 4.0])
def test_gamma_squared_cv_is_inverse_burstiness(burstiness):
    rate = 10.0
    times = gamma_arrivals(rate, burstiness, count=20_000, seed=2)
    gaps = gaps_of(times)
    assert abs(len(times) / times[-1] - rate) / rate < 0.03
    cv2 = gaps.var() / gaps.mean() ** 2
    assert abs(cv2 - 1 / burstiness) / (1 / burstiness) < 0.1


def test_burstiness_one_is_exactly_poisson():
    assert np.array_equal(gamma_arrivals(3.0, 1.0, count=500, seed=7), poisson_arrivals(3.0, count=500, seed=7))


@pytest.mark.parametrize("make", [lambda **kw: poisson_arrivals(4.0, **kw), lambda **kw: gamma_arrivals(4.0, 0.5, **kw)])
def test_duration_is_a_prefix_of_count(make):
    # 4 req/s over 3000 s: about 12,000 arrivals, several internal draw blocks.
    by_time = make(duration=3000.0, seed=5)
    by_count = make(count=len(by_time) + 10, seed=5)
    assert by_time[-1] <= 3000.0 < by_count[len(by_time)]
    assert np.array_equal(by_time, by_count[: len(by_time)])


def test_seeded():
    assert np.array_equal(poisson_arrivals(1.0, count=100, seed=3), poisson_arrivals(1.0, count=100, seed=3))
    assert not np.array_equal(poisson_arrivals(1.0, count=100, seed=3), poisson_arrivals(1.0, count=100, seed=4))


def test_argument_errors():
    with pytest.raises(ValueError, match="exactly one"):
        poisson_arrivals(1.0, count=3, duration=2.0)
    with pytest.raises(ValueError, match="exactly one"):
        poisson_arrivals(1.0)
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(0.0, count=3)
    with pytest.raises(ValueError, match="burstiness"):
        gamma_arrivals(1.0, 0.0, count=3)
    assert len(poisson_arrivals(1.0, duration=0.0)) == 0


def test_trace_timestamps_and_process():
    trace = Trace({}, [TraceRequest(3, 4, arrival_time=t) for t in (0.5, 1.0, 4.0)])
    assert trace_arrivals(trace) == [0.5, 1.0, 4.0]
    assert trace_arrivals(trace, duration=1.0) == [0.5, 1.0]
    # a duration counts from the first arrival, as the run does (a Unix-stamped trace held none)
    late = Trace({}, [TraceRequest(3, 4, arrival_time=t) for t in (1.7e9, 1.7e9 + 1.0, 1.7e9 + 4.0)])
    assert trace_arrivals(late, duration=1.0) == [1.7e9, 1.7e9 + 1.0]
    assert ArrivalProcess("trace").times(trace=trace, count=2) == [0.5, 1.0]
    with pytest.raises(ValueError, match="no arrival_time"):
        trace_arrivals(Trace({}, [TraceRequest(3, 4)]))
    # more requests than the trace holds at its own times: the message names the flags that decide it
    with pytest.raises(ValueError, match=r"holds 3 requests: --num-requests 5 asks for more .*--rate"):
        trace_arrivals(trace, count=5)
    assert np.array_equal(ArrivalProcess("gamma", rate=2.0, burstiness=4.0, seed=9).times(count=50), gamma_arrivals(2.0, 4.0, count=50, seed=9))
    with pytest.raises(ValueError, match="unknown arrival process"):
        ArrivalProcess("uniform", rate=1.0).times(count=1)


def test_with_arrivals_stamps_copies():
    reqs = [TraceRequest(3, 4), TraceRequest(5, 6), TraceRequest(7, 8)]
    stamped = with_arrivals(reqs, [0.25, 0.5])
    assert [r.arrival_time for r in stamped] == [0.25, 0.5] and reqs[0].arrival_time is None
    with pytest.raises(ValueError):
        with_arrivals(reqs[:1], [0.1, 0.2])


def _running_sums(gaps, count: int) -> list[float]:
    """The reference: the first `count` gaps added one by one, in Python floats."""
    times, t = [], 0.0
    for _, gap in zip(range(count), gaps):
        t += gap
        times.append(t)
    return times


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_many_arrivals_drawn_by_numpy_are_the_python_streams_floats(seed):
    # from NUMPY_FROM arrivals on, numpy draws the gaps and np.cumsum adds them: the very floats
    # of the pure-Python exponential stream (itself numpy's, tests/workload/test_exponential.py)
    # and of the gamma blocks, added one by one; fewer, and by duration, the Python path's prefix
    count = NUMPY_FROM + 4097
    scale = 1.0 / 3.5
    poisson = poisson_arrivals(3.5, count=count, seed=seed)
    assert type(poisson) is list and poisson == _running_sums((scale * x for x in standard_exponentials(seed)), count)
    assert poisson_arrivals(3.5, count=NUMPY_FROM - 1, seed=seed) == poisson[:NUMPY_FROM - 1]
    assert poisson_arrivals(3.5, duration=poisson[-1], seed=seed) == poisson
    gamma = gamma_arrivals(3.5, 0.4, count=count, seed=seed)
    assert gamma == _running_sums(_gamma_gaps(0.4, 1.0 / (3.5 * 0.4), seed), count)
    assert gamma_arrivals(3.5, 0.4, duration=gamma[-1], seed=seed) == gamma

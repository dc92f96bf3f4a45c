"""Arrival processes: when each request reaches the server.

All processes return a list of absolute arrival times in seconds (floats), in non-decreasing
order from a first arrival after 0 (the first gap is drawn like every other). Ask for a number
of arrivals (`count`) or for every arrival up to a time (`duration`); with the same seed, the
duration form returns a prefix of the same sequence, so the two forms agree.

- Poisson at `rate` req/s: exponential gaps with mean 1/rate; the numbers of
  numpy.random.default_rng(seed).exponential, drawn without numpy (pagesim.workload.exponential:
  importing numpy is a quarter of a short replay's start-up), or by numpy itself from
  NUMPY_FROM arrivals on, where drawing them in Python costs more than importing numpy.random.
- Gamma with a burstiness factor, as vLLM's benchmark_serving defines it: gaps ~
  Gamma(shape=burstiness, scale=1/(rate*burstiness)), so the mean gap stays 1/rate and the
  squared coefficient of variation of the gaps is 1/burstiness. burstiness < 1 is burstier than
  Poisson, > 1 more regular, and exactly 1 *is* Poisson (we return the same numbers).
- The trace's own timestamps (`arrival_time` of each request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from pagesim.workload.exponential import standard_exponentials

if TYPE_CHECKING:
    from pagesim.workload.trace import Trace, TraceRequest

# Gamma gaps are drawn from numpy in blocks; the block size does not change the numbers,
# because numpy's Generator consumes its stream the same way for one big draw or several small.
_BLOCK = 4096
# From this many arrivals on (a count given), the gaps are drawn by numpy at once and added by
# np.cumsum: the same floats, ~0.6 us an arrival less than drawing them in Python, against ~17 ms
# to import numpy.random (a million arrivals: 0.05 s instead of 0.63)
NUMPY_FROM = 50_000


def _check_count_duration(count: int | None, duration: float | None) -> None:
    if (count is None) == (duration is None):
        raise ValueError("give exactly one of count or duration")
    if count is not None and count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if duration is not None and not duration >= 0:
        raise ValueError(f"duration must be >= 0, got {duration}")


def _times_from_gaps(gaps: Iterator[float], count: int | None, duration: float | None) -> list[float]:
    """The running sums of gaps: the first count, or those <= duration. Added one by one in
    order, as numpy's cumsum adds, so the times are those of np.cumsum(gaps)."""
    _check_count_duration(count, duration)
    times = []
    t = 0.0
    if count is not None:
        for _, gap in zip(range(count), gaps):
            t += gap
            times.append(t)
        return times
    for gap in gaps:
        t += gap
        if not t <= duration:
            return times
        times.append(t)
    return times  # (a finite gaps iterator ran out)


def _running_sums(gaps) -> list[float]:
    """_times_from_gaps of a numpy array of `count` gaps, all of them: np.cumsum adds them one by
    one, left to right (an accumulate, not a pairwise sum), so the floats are the same."""
    import numpy as np

    return np.cumsum(gaps).tolist()


def poisson_arrivals(rate: float, *, count: int | None = None, duration: float | None = None, seed: int = 0) -> list[float]:
    """Poisson arrivals at `rate` requests per second."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    scale = 1.0 / rate
    if count is not None and count >= NUMPY_FROM and duration is None:
        import numpy as np

        # (numpy's exponential(scale) is scale times each standard draw, as below)
        return _running_sums(np.random.default_rng(seed).exponential(scale, count))
    return _times_from_gaps((scale * x for x in standard_exponentials(seed)), count, duration)


def _gamma_gaps(shape: float, scale: float, seed: int) -> Iterator[float]:
    import numpy as np

    rng = np.random.default_rng(seed)
    while True:
        yield from rng.gamma(shape, scale, size=_BLOCK).tolist()


def gamma_arrivals(
    rate: float,
    burstiness: float,
    *,
    count: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> list[float]:
    """Gamma-distributed gaps with mean 1/rate and squared CV 1/burstiness (vLLM semantics)."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if burstiness == 1.0:
        # Gamma(1) is the exponential; return exactly the Poisson stream for the same seed.
        return poisson_arrivals(rate, count=count, duration=duration, seed=seed)
    scale = 1.0 / (rate * burstiness)
    if count is not None and count >= NUMPY_FROM and duration is None:
        import numpy as np

        return _running_sums(np.random.default_rng(seed).gamma(burstiness, scale, count))
    return _times_from_gaps(_gamma_gaps(burstiness, scale, seed), count, duration)


def trace_arrivals(trace: "Trace", *, count: int | None = None, duration: float | None = None) -> list[float]:
    """The trace's own `arrival_time`s (all of them, the first `count`, or those at most `duration`
    after the first: a run counts from its first arrival, and a trace may be stamped in Unix time)."""
    if count is not None and duration is not None:
        raise ValueError("give at most one of count or duration")
    times = [r.arrival_time for r in trace.requests]
    if any(t is None for t in times):
        raise ValueError("this trace has no arrival_time on its requests; use a Poisson or gamma process")
    out = [float(t) for t in times]
    if count is not None:
        if count > len(out):
            raise ValueError(f"--rate 0 replays the trace's own arrival times, and it holds {len(out)} requests: "
                             f"--num-requests {count} asks for more (give at most {len(out)}, or a --rate, which "
                             "cycles the trace)")
        out = out[:count]
    if duration is not None:
        out = [t for t in out if t - out[0] <= duration]
    return out


@dataclass(frozen=True)
class ArrivalProcess:
    """A named arrival process, as a CLI or experiment config describes it.

    kind: "poisson", "gamma" or "trace". rate in req/s (poisson, gamma); burstiness (gamma).
    """

    kind: str
    rate: float | None = None
    burstiness: float = 1.0
    seed: int = 0

    def times(self, *, count: int | None = None, duration: float | None = None, trace: "Trace | None" = None) -> list[float]:
        if self.kind == "poisson":
            return poisson_arrivals(self._rate(), count=count, duration=duration, seed=self.seed)
        if self.kind == "gamma":
            return gamma_arrivals(self._rate(), self.burstiness, count=count, duration=duration, seed=self.seed)
        if self.kind == "trace":
            if trace is None:
                raise ValueError("arrival process 'trace' needs the trace")
            return trace_arrivals(trace, count=count, duration=duration)
        raise ValueError(f"unknown arrival process {self.kind!r} (poisson, gamma, trace)")

    def _rate(self) -> float:
        if self.rate is None:
            raise ValueError(f"arrival process {self.kind!r} needs a rate")
        return self.rate


def with_arrivals(requests: "list[TraceRequest]", times) -> "list[TraceRequest]":
    """Copies of the first len(times) requests, each stamped with its arrival time."""
    from dataclasses import replace

    times = [float(t) for t in times]
    if len(times) > len(requests):
        raise ValueError(f"{len(times)} arrival times for {len(requests)} requests")
    return [replace(r, arrival_time=t) for r, t in zip(requests, times)]

"""Arrival processes: when each request reaches the server.

All processes return a float64 numpy array of absolute arrival times in seconds, in
non-decreasing order from a first arrival after 0 (the first gap is drawn like every other). Ask for a
number of arrivals (`count`) or for every arrival up to a time (`duration`); with the same seed,
the duration form returns a prefix of the same sequence, so the two forms agree.

- Poisson at `rate` req/s: exponential gaps with mean 1/rate.
- Gamma with a burstiness factor, as vLLM's benchmark_serving defines it: gaps ~
  Gamma(shape=burstiness, scale=1/(rate*burstiness)), so the mean gap stays 1/rate and the
  squared coefficient of variation of the gaps is 1/burstiness. burstiness < 1 is burstier than
  Poisson, > 1 more regular, and exactly 1 *is* Poisson (we return the same numbers).
- The trace's own timestamps (`arrival_time` of each request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # (numpy is imported where arrivals are drawn: `import pagesim.workload` stays light)
    import numpy as np

    from pagesim.workload.trace import Trace, TraceRequest

# Draw gaps in blocks when generating up to a duration; the block size does not change the
# numbers, because numpy's Generator consumes its stream the same way for one big draw or
# several small ones.
_BLOCK = 4096


def _check_count_duration(count: int | None, duration: float | None) -> None:
    if (count is None) == (duration is None):
        raise ValueError("give exactly one of count or duration")
    if count is not None and count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if duration is not None and not duration >= 0:
        raise ValueError(f"duration must be >= 0, got {duration}")


def _times_from_gaps(draw: Callable[[int], np.ndarray], count: int | None, duration: float | None) -> np.ndarray:
    import numpy as np

    _check_count_duration(count, duration)
    if count is not None:
        return np.cumsum(draw(count), dtype=np.float64)
    chunks: list[np.ndarray] = []
    last = 0.0
    while True:
        # Start the running sum from `last` so each time is added in the same order as one
        # cumsum over all gaps would (count and duration then give bit-identical times).
        times = np.cumsum(np.concatenate([[last], draw(_BLOCK)]), dtype=np.float64)[1:]
        inside = times[times <= duration]
        chunks.append(inside)
        if len(inside) < _BLOCK:
            break
        last = float(times[-1])
    return np.concatenate(chunks) if chunks else np.empty(0)


def poisson_arrivals(rate: float, *, count: int | None = None, duration: float | None = None, seed: int = 0) -> np.ndarray:
    """Poisson arrivals at `rate` requests per second."""
    import numpy as np

    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = np.random.default_rng(seed)
    return _times_from_gaps(lambda k: rng.exponential(1.0 / rate, size=k), count, duration)


def gamma_arrivals(
    rate: float,
    burstiness: float,
    *,
    count: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Gamma-distributed gaps with mean 1/rate and squared CV 1/burstiness (vLLM semantics)."""
    import numpy as np

    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if burstiness == 1.0:
        # Gamma(1) is the exponential; return exactly the Poisson stream for the same seed.
        return poisson_arrivals(rate, count=count, duration=duration, seed=seed)
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate * burstiness)
    return _times_from_gaps(lambda k: rng.gamma(burstiness, scale, size=k), count, duration)


def trace_arrivals(trace: "Trace", *, count: int | None = None, duration: float | None = None) -> np.ndarray:
    """The trace's own `arrival_time`s (all of them, the first `count`, or those <= duration)."""
    import numpy as np

    if count is not None and duration is not None:
        raise ValueError("give at most one of count or duration")
    times = [r.arrival_time for r in trace.requests]
    if any(t is None for t in times):
        raise ValueError("this trace has no arrival_time on its requests; use a Poisson or gamma process")
    out = np.asarray(times, dtype=np.float64)
    if count is not None:
        if count > len(out):
            raise ValueError(f"asked for {count} arrivals but the trace has {len(out)}")
        out = out[:count]
    if duration is not None:
        out = out[out <= duration]
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

    def times(self, *, count: int | None = None, duration: float | None = None, trace: "Trace | None" = None) -> np.ndarray:
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
    import numpy as np
    from dataclasses import replace

    times = np.asarray(times, dtype=np.float64)
    if len(times) > len(requests):
        raise ValueError(f"{len(times)} arrival times for {len(requests)} requests")
    return [replace(r, arrival_time=float(t)) for r, t in zip(requests, times)]

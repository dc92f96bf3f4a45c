"""Steady state: is a finite run long enough to judge, and does its queue grow?

A run starts from an empty system, which flatters latency until the batch has filled and the
queue has found its level; a replica offered more than it serves builds a queue that only a long
enough run shows. So a probe is judged on steady state (docs/plan.md, "What sustainable means"):

1. warm-up: requests arriving in the first `warmup_fraction` of the arrival span are left out;
2. length: the measurement window (warm-up end to last arrival) must span at least
   MIN_WINDOW_SERVICES mean service times (first scheduled -> finished, of the measured
   requests): the time the system takes to refill, so the window sees the level it settles at;
3. trend: the number of requests in the system, L(t) (waiting, running or swapped), is averaged
   over NUM_BATCHES equal slices of the window (batch means, which tame L's autocorrelation) and
   a least-squares line is fitted through them; its slope g (requests/s) gets a 95 % Student t
   interval (NUM_BATCHES - 2 degrees of freedom). L, not the waiting queue alone, because the
   slow part of reaching steady state is the running batch filling up with long requests, before
   any request waits; TTFT alone passes runs too short to see it. Against the practical bound
   b = tolerance x rate (arrivals outrunning departures by more than the search's own tolerance):
     grows      the interval lies above 0 and g > b   (overloaded: unsustainable, whatever the SLOs)
     flat       the interval's upper end is below b   (steady: the SLOs decide)
     undecided  otherwise                             (the run is extended)
   The interval is only trusted when the batches are longer than the queue's memory: if the
   lag-1 autocorrelation of the residuals about the line exceeds MAX_LAG1 (the one-sided 5 %
   point of a white sequence's, 1.645 / sqrt(NUM_BATCHES)), the batch means are not independent
   (a queue near saturation wanders for longer than the run) and the trend is undecided. This is
   the batch-means method's usual independence check (Law and Carson, 1979).

A run too short (2.) or undecided (3.) is extended to more requests (the same seed, so the longer
run begins with the same arrivals; the planner continues one replay instead of starting again:
pagesim.plan.continued), until the verdict is decided or the probe reaches its request cap, where
an undecided run counts as unsustainable (reason stated).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from pagesim.metrics import t_quantile_975

NUM_BATCHES = 20
MAX_LAG1 = 1.645 / NUM_BATCHES ** 0.5
MIN_WINDOW_SERVICES = 8.0
GROWS, FLAT, UNDECIDED = "grows", "flat", "undecided"


@dataclass(frozen=True)
class Trend:
    """The least-squares slope of batch means over a window, with its interval."""

    slope: float  # requests/s
    low: float  # 95 % interval of the slope
    high: float
    mean: float  # requests in the system, over the window
    window_s: float
    lag1: float = 0.0  # autocorrelation of the residuals about the line

    def verdict(self, bound: float) -> str:
        if self.low > 0 and self.slope > bound:
            return GROWS
        if self.high < bound and self.lag1 <= MAX_LAG1:
            return FLAT
        return UNDECIDED

    def to_dict(self) -> dict:
        return asdict(self)


def batch_means(stays: list[tuple[float, float]], start: float, end: float, batches: int = NUM_BATCHES) -> list[float]:
    """Time-average number of stays [enter, leave) covering each of `batches` equal slices of
    [start, end): the exact integral of L(t) over each slice, divided by its length."""
    import numpy as np

    pairs = np.array(list(stays), dtype=np.float64).reshape(-1, 2)
    return batch_means_of([(pairs[:, 0], pairs[:, 1])], start, end, batches)


def batch_means_of(chunks, start: float, end: float, batches: int = NUM_BATCHES) -> list[float]:
    """batch_means of stays given as (enters, leaves) arrays a chunk at a time, in order. Each
    stay adds to each slice it covers the length it spends there, and each slice's area is those
    lengths added in the stays' order, one by one: per element, numpy's arithmetic is Python's
    on the same doubles (floor division included), and np.add.at adds in index order, unbuffered,
    so the floats are those of a loop over the stays in Python (tests/plan/test_steady.py)."""
    import numpy as np

    if not end > start:
        raise ValueError("the window must have a positive length")
    width = (end - start) / batches
    area = np.zeros(batches)
    for enters, leaves in chunks:
        lo, hi = np.maximum(enters, start), np.minimum(leaves, end)
        inside = hi > lo
        lo, hi = lo[inside], hi[inside]
        first = ((lo - start) // width).astype(np.int64)
        last = np.minimum(((hi - start) // width).astype(np.int64), batches - 1)
        # one entry per slice a stay covers (most cover one), a stay's slices in order
        covered = np.maximum(last - first + 1, 0)
        stay = np.repeat(np.arange(len(lo)), covered)
        slice_ = first[stay] + (np.arange(len(stay)) - np.repeat(np.cumsum(covered) - covered, covered))
        inside_slice = np.minimum(hi[stay], start + (slice_ + 1) * width) - np.maximum(lo[stay], start + slice_ * width)
        np.add.at(area, slice_, np.maximum(inside_slice, 0.0))
    return [x / width for x in area.tolist()]


def fit_trend(means: list[float], window_s: float) -> Trend:
    """Least-squares line through equally spaced batch means over `window_s` seconds."""
    k = len(means)
    if k < 3:
        raise ValueError("a trend needs at least 3 batch means")
    dx = window_s / k
    xs = [(i + 0.5) * dx for i in range(k)]
    mx, my = sum(xs) / k, sum(means) / k
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, means)) / sxx
    residuals = [y - my - slope * (x - mx) for x, y in zip(xs, means)]
    sse = sum(r * r for r in residuals)
    half = t_quantile_975(k - 2) * math.sqrt(sse / (k - 2) / sxx)
    lag1 = sum(a * b for a, b in zip(residuals, residuals[1:])) / sse if sse > 0 else 0.0
    return Trend(slope, slope - half, slope + half, my, window_s, lag1)


def in_system_trend(stays: list[tuple[float, float]], start: float, end: float) -> Trend:
    """The trend of L(t) over [start, end], from every request's (arrival, departure)."""
    return fit_trend(batch_means(stays, start, end), end - start)


def in_system_trend_of(chunks, start: float, end: float) -> Trend:
    """in_system_trend of (arrivals, departures) arrays given a chunk at a time (batch_means_of)."""
    return fit_trend(batch_means_of(chunks, start, end), end - start)


def long_enough(window_s: float, mean_service_s: float | None) -> bool:
    return mean_service_s is not None and window_s >= MIN_WINDOW_SERVICES * mean_service_s


def requests_needed(num_requests: int, window_s: float, mean_service_s: float) -> int:
    """The request count whose window spans MIN_WINDOW_SERVICES service times (the window grows
    in proportion to the count), with a 10 % margin, at least twice the count."""
    ratio = MIN_WINDOW_SERVICES * mean_service_s / window_s if window_s > 0 else 2.0
    return max(2 * num_requests, math.ceil(num_requests * ratio * 1.1))


def mean_interval_of_batches(values: list[float], batches: int = NUM_BATCHES) -> tuple[float, float] | None:
    """95 % t interval of the mean of `values` (in arrival order) from the means of `batches`
    consecutive groups; None with fewer values than batches, or when the batch means are
    correlated (lag-1 autocorrelation above MAX_LAG1: batches shorter than the queue's memory,
    whose interval would be too narrow)."""
    n = len(values)
    if n < batches:
        return None
    means = [sum(values[i * n // batches:(i + 1) * n // batches]) / ((i + 1) * n // batches - i * n // batches)
             for i in range(batches)]
    m = sum(means) / batches
    ss = sum((x - m) ** 2 for x in means)
    if ss > 0 and sum((a - m) * (b - m) for a, b in zip(means, means[1:])) / ss > MAX_LAG1:
        return None
    sd = math.sqrt(ss / (batches - 1))
    half = t_quantile_975(batches - 1) * sd / math.sqrt(batches)
    return m - half, m + half

"""The bracketing search for the highest sustainable rate, and one configuration's whole plan.

Latency grows with the offered rate: monotone in expectation, noisy in any one run. Every rate is
simulated with the same seed (common random numbers), which keeps the noise from flipping the
verdict between neighbouring rates. The search
1. brackets: from `start_rate`, multiply by `growth` while the rate is sustainable (or divide
   while it is not) until the verdict changes, giving lo (sustainable) < hi (not);
2. bisects geometrically, mid = sqrt(lo * hi), until hi / lo - 1 <= `tolerance`;
and reports lo. So the answer is a simulated, sustainable rate within `tolerance` (relative) of
the point where the verdict changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from pagesim.plan.run import Evaluation


@dataclass(frozen=True)
class SearchSettings:
    start_rate: float = 1.0  # req/s per replica
    growth: float = 2.0
    tolerance: float = 0.02  # relative width of the final bracket
    min_rate: float = 0.01  # below this the configuration is called unable to meet the SLOs
    max_rate: float = 10_000.0  # above this the search stops and reports the cap

    def __post_init__(self) -> None:
        if not self.growth > 1:
            raise ValueError("growth must be > 1")
        if not 0 < self.tolerance < 1:
            raise ValueError("tolerance must be in (0, 1)")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError("need 0 < min_rate <= start_rate <= max_rate")


@dataclass
class SearchResult:
    rate: float | None  # highest sustainable rate found; None: none at or above min_rate
    lower: Evaluation | None  # the evaluation at `rate`
    upper: Evaluation | None  # the lowest unsustainable rate evaluated (None if capped)
    points: list[Evaluation] = field(default_factory=list)  # every evaluation, in search order
    capped: bool = False  # sustainable even at max_rate


def bracket_search(evaluate: Callable[[float], Evaluation], settings: SearchSettings = SearchSettings()) -> SearchResult:
    points: list[Evaluation] = []

    def ev(rate: float) -> Evaluation:
        e = evaluate(rate)
        points.append(e)
        return e

    lo = hi = None
    first = ev(settings.start_rate)
    if first.sustainable:
        lo = first
        while hi is None:
            rate = lo.rate * settings.growth
            if rate > settings.max_rate:
                return SearchResult(lo.rate, lo, None, points, capped=True)
            e = ev(rate)
            if e.sustainable:
                lo = e
            else:
                hi = e
    else:
        hi = first
        while lo is None:
            rate = hi.rate / settings.growth
            if rate < settings.min_rate:
                return SearchResult(None, None, hi, points)
            e = ev(rate)
            if e.sustainable:
                lo = e
            else:
                hi = e
    while hi.rate / lo.rate - 1 > settings.tolerance:
        e = ev(math.sqrt(lo.rate * hi.rate))
        if e.sustainable:
            lo = e
        else:
            hi = e
    return SearchResult(lo.rate, lo, hi, points)

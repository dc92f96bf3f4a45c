"""The highest request rate a configuration sustains: the one search the figures and the planner use.

Latency grows with the offered rate: monotone in expectation, noisy in any one run. Callers
simulate every rate with the same seed (common random numbers), which keeps the noise from
flipping the verdict between neighbouring rates. `find_sustainable_rate`
1. brackets: from `start_rate`, multiplies by `growth` while every rate tried is sustainable
   (divides while none is), never past `max_rate` or below `min_rate`, which are tried themselves;
2. bisects geometrically, mid = sqrt(lo * hi), until hi / lo - 1 <= `tolerance`;
and reports lo, the highest sustainable rate below the lowest unsustainable one. Rates already
judged (another threshold's probes, say) bracket the search before anything new is run.

`run_unless_hopeless` runs one simulation, stopping it early once its measured requests show it
cannot come under a latency bound: an overloaded run is the slow one, and its verdict is clear.
`run_unless_over` stops only where that is certain, not just clear (for searches that keep only
the verdict, so the verdict must be the full run's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

MAX_PROBES = 64  # a search that has not converged by then is a bug (or a tolerance of ~1e-12)


@dataclass(frozen=True)
class SearchSettings:
    start_rate: float = 1.0  # req/s
    growth: float = 2.0
    tolerance: float = 0.02  # relative width of the final bracket
    min_rate: float = 0.01  # nothing sustainable at this rate: the configuration sustains none
    max_rate: float = 10_000.0  # sustainable at this rate: the search stops there

    def __post_init__(self) -> None:
        if not self.growth > 1:
            raise ValueError("growth must be > 1")
        if not self.tolerance > 0:
            raise ValueError("tolerance must be > 0")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError("need 0 < min_rate <= start_rate <= max_rate")


@dataclass
class RateBracket:
    rate: float | None  # highest sustainable rate found; None: not even min_rate
    failing: float | None  # lowest unsustainable rate tried; None: max_rate was sustainable
    probed: list[float] = field(default_factory=list)  # rates this search judged anew, in order

    @property
    def capped(self) -> bool:
        return self.failing is None


def find_sustainable_rate(sustainable: Callable[[float], bool], settings: SearchSettings = SearchSettings(),
                          judged: Iterable[float] = ()) -> RateBracket:
    """The bracket around the highest sustainable rate, asking sustainable(rate) for each rate it
    tries; `judged` are rates whose verdicts sustainable() already knows (asked again, not counted
    as probes). Never tries a rate above an unsustainable one."""
    verdicts = {rate: sustainable(rate) for rate in judged}
    probed: list[float] = []

    def probe(rate: float) -> None:
        verdicts[rate] = sustainable(rate)
        probed.append(rate)

    for _ in range(MAX_PROBES):
        hi = min((r for r, ok in verdicts.items() if not ok), default=None)
        lo = max((r for r, ok in verdicts.items() if ok and (hi is None or r < hi)), default=None)
        if lo is not None and hi is not None:
            if hi / lo - 1 <= settings.tolerance:
                return RateBracket(lo, hi, probed)
            probe(math.sqrt(lo * hi))
        elif lo is None and hi is None:
            probe(settings.start_rate)
        elif lo is None:  # everything tried fails: go down
            if hi <= settings.min_rate:
                return RateBracket(None, hi, probed)
            probe(max(hi / settings.growth, settings.min_rate))
        else:  # everything tried passes: go up
            if lo >= settings.max_rate:
                return RateBracket(lo, None, probed)
            probe(min(lo * settings.growth, settings.max_rate))
    raise RuntimeError(f"no bracket after {MAX_PROBES} probes (settings {settings})")


class StopRun(Exception):
    """Raised from a run's progress hook (run_checked) to stop a run whose verdict is already known."""


def run_unless_hopeless(sim, stop_above: float | None, min_measured: int) -> tuple[dict, bool]:
    """Run a pagesim.sim.engine.Replay; returns (summary, stopped early). With stop_above, the run
    stops once at least min_measured requests that arrived after the warm-up have finished and
    their mean normalized latency is already over stop_above: under overload latency only grows
    with arrival time (FCFS), so the full run's mean would be higher still. A stopped run's summary
    holds that partial mean (a lower bound)."""
    warmup = sim.cfg.warmup_s
    measured = {"n": 0, "sum": 0.0}

    def check(_done: int) -> None:
        rec = sim.metrics.requests[-1]
        nl = rec.normalized_latency
        if nl is None or rec.arrival_time < warmup:
            return
        measured["n"] += 1
        measured["sum"] += nl
        if stop_above is not None and measured["n"] >= min_measured and measured["sum"] / measured["n"] > stop_above:
            raise StopRun

    return run_checked(sim, check)


def run_unless_over(sim, threshold: float) -> tuple[dict, bool]:
    """Run a Replay; returns (summary, stopped early). It stops once its mean normalized latency
    is certain to end above `threshold`: the run's mean is the sum over the measured requests
    that finish divided by their number, which is at most the number of requests arriving after
    the warm-up (known before the run), and every term is >= 0; so once the finished ones' sum
    exceeds threshold x that number, the mean ends above threshold whatever the rest do. A
    stopped run's summary is partial (its mean a lower bound); the verdict "mean < threshold" is
    exactly the full run's."""
    warmup = sim.cfg.warmup_s
    limit = threshold * sum(1 for r in sim.requests if r.arrival_time >= warmup)
    total = {"sum": 0.0}

    def check(_done: int) -> None:
        rec = sim.metrics.requests[-1]
        nl = rec.normalized_latency
        if nl is None or rec.arrival_time < warmup:
            return
        total["sum"] += nl
        if total["sum"] > limit:
            raise StopRun

    return run_checked(sim, check)


def run_checked(sim, check: Callable[[int], None]) -> tuple[dict, bool]:
    """Run a Replay calling check(num_done) as each request finishes; check raises StopRun to
    stop it. Returns (summary, stopped early)."""
    sim.on_progress = check
    try:
        return sim.run().summary, False
    except StopRun:
        return sim.summary(), True  # the partial run's, with the same keys as a whole run's

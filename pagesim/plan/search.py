"""The planner's face of the sustainable-rate search (pagesim.sim.rate_search): the same search,
with each rate's full Evaluation (SLO values, keep-up, violations) kept for the report.

A steady-state probe near the knee is expensive (tens of thousands of simulated requests to
decide a pass), one far from it cheap. `scouted_search` spends the expensive probes only near the
knee (docs/plan.md, "The search"):
1. scouting: the bracketing search over cheap scout probes (a probe capped at a short run and
   judged optimistically: only a real failure fails it) locates the knee roughly; short runs
   start from an empty system and flatter, so the scouted knee is usually at or above the true one;
2. refining: from the scouted capacity, full probes step by the tolerance towards the verdict's
   change (the first STEADY_STEPS steps; then each step is the square of the last, so a far scout
   still converges in a few probes), then bisect geometrically to the tolerance, like
   `bracket_search`. The capacity is still a rate a full probe sustained, within the tolerance
   below one a full probe did not: only where the search looks changes, not what decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from pagesim.plan.run import Evaluation
from pagesim.sim.rate_search import SearchSettings, find_sustainable_rate

__all__ = ["SearchSettings", "SearchResult", "bracket_search", "scouted_search"]

STEADY_STEPS = 3  # refining steps of one tolerance before the step grows
# Rates are built by multiplying (r x (1 + tolerance), sqrt(lo x hi)), so a bracket exactly one
# tolerance wide can come out a few ulps over it (8 sqrt 2 / (8 sqrt 2 / 1.02) - 1 =
# 0.020000000000000018) and would be bisected once more for nothing. The bracket test allows this
# relative slack: a million times float rounding's (~1e-15), a million times below any tolerance.
ROUNDING = 1e-9


@dataclass
class SearchResult:
    rate: float | None  # highest sustainable rate found; None: none at or above min_rate
    lower: Evaluation | None  # the evaluation at `rate`
    upper: Evaluation | None  # the lowest unsustainable rate evaluated (None if capped)
    points: list[Evaluation] = field(default_factory=list)  # every (full) evaluation, in search order
    capped: bool = False  # sustainable even at max_rate
    scouts: list[Evaluation] = field(default_factory=list)  # the scout probes (scouted_search), in order


def bracket_search(evaluate: Callable[[float], Evaluation], settings: SearchSettings = SearchSettings(),
                   start: float | None = None) -> SearchResult:
    """The sustainable-rate search over evaluate(rate); from `start`, the refining walk first
    (module docstring), else bracketing from settings.start_rate."""
    evaluations: dict[float, Evaluation] = {}
    order: list[float] = []

    def sustainable(rate: float) -> bool:
        if rate not in evaluations:
            evaluations[rate] = evaluate(rate)
            order.append(rate)
        return evaluations[rate].sustainable

    if start is not None:
        walk_to_change(sustainable, start, settings)
    found = find_sustainable_rate(sustainable, bracketing(settings), judged=list(evaluations))
    pick = lambda rate: None if rate is None else evaluations[rate]  # noqa: E731
    return SearchResult(found.rate, pick(found.rate), pick(found.failing), [evaluations[r] for r in order],
                        found.capped)


def bracketing(settings: SearchSettings) -> SearchSettings:
    """The settings a bracket is tested against: hi / lo - 1 <= tolerance, up to ROUNDING."""
    return replace(settings, tolerance=settings.tolerance * (1 + ROUNDING))


def walk_to_change(sustainable: Callable[[float], bool], start: float, settings: SearchSettings) -> None:
    """From `start`, step up while sustainable (down while not) until the verdict changes or a
    bound of the settings is reached: STEADY_STEPS steps of (1 + tolerance), then each step the
    square of the last."""
    up = sustainable(start)
    rate, step, steps = start, 1 + settings.tolerance, 0
    while (rate < settings.max_rate) if up else (rate > settings.min_rate):
        rate = min(rate * step, settings.max_rate) if up else max(rate / step, settings.min_rate)
        if sustainable(rate) != up:
            return
        steps += 1
        if steps >= STEADY_STEPS:
            step *= step


def scouted_search(evaluate: Callable[[float], Evaluation], scout: Callable[[float], Evaluation],
                   settings: SearchSettings = SearchSettings()) -> SearchResult:
    """Scout, then refine with full probes (module docstring). scout(rate) is the cheap probe."""
    rough = bracket_search(scout, settings)
    start = rough.rate if rough.rate is not None else rough.upper.rate
    found = bracket_search(evaluate, settings, start=start)
    found.scouts = rough.points
    return found

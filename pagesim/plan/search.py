"""The planner's face of the sustainable-rate search (pagesim.sim.rate_search): the same search,
with each rate's full Evaluation (SLO values, keep-up, violations) kept for the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pagesim.plan.run import Evaluation
from pagesim.sim.rate_search import SearchSettings, find_sustainable_rate

__all__ = ["SearchSettings", "SearchResult", "bracket_search"]


@dataclass
class SearchResult:
    rate: float | None  # highest sustainable rate found; None: none at or above min_rate
    lower: Evaluation | None  # the evaluation at `rate`
    upper: Evaluation | None  # the lowest unsustainable rate evaluated (None if capped)
    points: list[Evaluation] = field(default_factory=list)  # every evaluation, in search order
    capped: bool = False  # sustainable even at max_rate


def bracket_search(evaluate: Callable[[float], Evaluation], settings: SearchSettings = SearchSettings()) -> SearchResult:
    evaluations: dict[float, Evaluation] = {}

    def sustainable(rate: float) -> bool:
        if rate not in evaluations:
            evaluations[rate] = evaluate(rate)
        return evaluations[rate].sustainable

    found = find_sustainable_rate(sustainable, settings)
    pick = lambda rate: None if rate is None else evaluations[rate]  # noqa: E731
    return SearchResult(found.rate, pick(found.rate), pick(found.failing), [evaluations[r] for r in found.probed],
                        found.capped)

"""How sure a capacity is: the spread over arrival seeds, and the cost model's measured error.

- Seeds: the capacity search is repeated for other seeds of the arrival process (another
  Poisson draw over the same trace), each from the first seed's bracket (`seed_capacity`).
- Cost model: a capacity is about inversely proportional to the step time, so a relative step
  time error e moves it by about e. e is the mean |ITL error| of pagesim against real vLLM runs
  on runs each held out of its own fit, read from reports/sim2real/errors.csv (experiments/
  sim2real.py writes it): group `h100` for GPUs whose kernel terms are measured on an H100,
  `a100-fitted` for those measured on an A100 (engine fitted leaving each run out); a GPU whose
  terms are scaled from another GPU's (pagesim.sim.cost.calibrated.scale_calibration) takes the
  larger of that and group `rtx` (a GPU never fitted, its terms scaled: the error of scaling).
The interval is [min over seeds x (1 - e), max over seeds x (1 + e)].
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pagesim.plan.search import bracketing
from pagesim.sim.rate_search import SearchSettings, find_sustainable_rate

ERRORS_CSV = Path(__file__).resolve().parents[2] / "reports" / "sim2real" / "errors.csv"
ERRORS_NAME = "reports/sim2real/errors.csv"
MEASURED_GROUP = {"h100-80gb": "h100", "a100-80gb": "a100-fitted"}  # measured GPU -> its real-run group
SCALED_GROUP = "rtx"


@dataclass(frozen=True)
class ModelError:
    relative: float | None  # mean |ITL error|; None: no measurement applies
    basis: str  # in words, with the file and rows it comes from


def costs_source(gpu: str, cost_model: str) -> str:
    """Where a GPU's kernel costs come from: "measured", "scaled from <gpu>", or the cost model."""
    if cost_model != "calibrated":
        return f"{cost_model} cost model"
    from pagesim.sim.cost.calibrated import shipped_calibration

    source = shipped_calibration(gpu).source
    return f"scaled from {source['scaled_from']}" if "scaled_from" in source else "measured"


def _group_errors(path: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("system") == "pagesim" and row.get("itl_mean"):
                out.setdefault(row["group"], []).append(abs(float(row["itl_mean"])))
    return out


def model_error(gpu: str, cost_model: str, path: Path = ERRORS_CSV) -> ModelError:
    if cost_model != "calibrated":
        return ModelError(None, f"not measured for the {cost_model} cost model")
    try:
        groups = _group_errors(path)
    except (OSError, ValueError, KeyError) as e:
        return ModelError(None, f"unknown ({ERRORS_NAME} unreadable: {e})")
    from pagesim.sim.cost.calibrated import nearest_measured_gpu

    base = nearest_measured_gpu(gpu).name
    group = MEASURED_GROUP.get(base)
    if group not in groups:
        return ModelError(None, f"unknown: no real-run errors for GPUs measured as {base}")
    mean = lambda g: sum(groups[g]) / len(groups[g])  # noqa: E731
    e, basis = mean(group), f"mean |ITL error| of {len(groups[group])} held-out `{group}` runs in {ERRORS_NAME}"
    if base != gpu and SCALED_GROUP in groups and mean(SCALED_GROUP) > e:
        e = mean(SCALED_GROUP)
        basis = (f"costs scaled from {base}: mean |ITL error| of the {len(groups[SCALED_GROUP])} `{SCALED_GROUP}` runs "
                 f"(a GPU with scaled costs) in {ERRORS_NAME}")
    return ModelError(e, basis)


def seed_capacity(sustainable: Callable[[float], bool], lo: float, search: SearchSettings) -> float | None:
    """The capacity for another seed, searched from the first seed's capacity lo: lo first, then
    steps of the tolerance up or down (a bracket of one step is within it), then bisection."""
    settings = SearchSettings(start_rate=lo, growth=1 + search.tolerance, tolerance=search.tolerance,
                              min_rate=min(search.min_rate, lo), max_rate=max(search.max_rate, lo))
    return find_sustainable_rate(sustainable, bracketing(settings)).rate


def interval(capacities: list[float], error: float | None) -> tuple[float, float]:
    e = error or 0.0
    return min(capacities) * (1 - e), max(capacities) * (1 + e)

"""Fidelity measurements that need no torch: the cost model's error on the executor's own steps
(queueing removed), confidence bands over repeated executor runs, and the executor's speed
relative to a profile.

Step kinds: BatchShape.kind (a step that swaps is "with swap" whatever else it computes, ...).
Each step is counted in exactly one kind, plus "all". The executor's step log is a
step_shapes.csv (pagesim.sim.cost.step_shapes).
"""

from __future__ import annotations

import statistics

from pagesim.core.step import STEP_KINDS, BatchShape
from pagesim.metrics import nonnegative_interval, percentile

# ----------------------------------------------------------------------------- step-level error

def step_errors(steps: list[tuple[BatchShape, float]], cost_model) -> dict[str, dict]:
    """The cost model's relative error (predicted - measured) / measured on each measured step,
    by kind (STEP_KINDS, then "all"): count, median and p90 of |error|, and the signed mean
    (bias: a queue amplifies a bias, not scatter). Kinds without steps have count 0 and None."""
    errors = {kind: [] for kind in STEP_KINDS}
    for shape, seconds in steps:
        # a step the clock could not resolve has no relative error; an idle one no work to predict
        if seconds > 0 and shape.kind != "idle":
            errors[shape.kind].append(cost_model.iteration_time(shape) / seconds - 1)
    errors["all"] = [e for kind in STEP_KINDS for e in errors[kind]]
    return {kind: _error_summary(errs) for kind, errs in errors.items()}


def _error_summary(errs: list[float]) -> dict:
    if not errs:
        return {"count": 0, "median_abs": None, "p90_abs": None, "bias": None}
    absolute = [abs(e) for e in errs]
    return {"count": len(errs), "median_abs": percentile(absolute, 50), "p90_abs": percentile(absolute, 90),
            "bias": sum(errs) / len(errs)}


def speed_vs_profile(steps: list[tuple[BatchShape, float]], cost_model) -> float | None:
    """Median measured / predicted over the plain decode steps: above 1, the run was slower than
    the profile says (None without decode steps)."""
    ratios = [seconds / cost_model.iteration_time(shape) for shape, seconds in steps if shape.kind == "decode"]
    return statistics.median(ratios) if ratios else None


# ----------------------------------------------------------------------------- bands over repeats

def band_row(label: str, key: str, executor_values: list, simulated, tolerance: float = 0.05) -> dict:
    """One metric: the executor's mean and 95 % band over its runs (every metric compared is >= 0:
    pagesim.metrics.nonnegative_interval, `band_method` says which interval), the simulator's
    point, and whether the simulator is inside the band or within `tolerance` of the mean (the target)."""
    values = [v for v in executor_values if v is not None]
    row = {"label": label, "key": key, "runs": len(values), "executor_values": values, "simulator": simulated,
           "mean": None, "low": None, "high": None, "rel_to_mean": None, "inside_band": None, "within_tolerance": None,
           "target_met": None, "band_method": None}
    if len(values) < 2 or simulated is None:
        return row
    mean, low, high, method = nonnegative_interval(values)
    rel = (simulated - mean) / mean if mean else None
    inside = low <= simulated <= high
    within = rel is not None and abs(rel) <= tolerance
    row.update(mean=mean, low=low, high=high, rel_to_mean=rel, inside_band=inside, within_tolerance=within,
               target_met=inside or within, band_method=method)
    return row


# what identifies a profile record's grid cell: its sequence counts and block moves, not its
# token counts (a decode record's shape is its middle measured step, whose context depends on how
# many repetitions the shape took, so two profiles of one grid differ there by a few tokens)
CELL_FIELDS = ("num_prefill_seqs", "num_decode_seqs", "num_swap_blocks", "num_copy_blocks")


def pool_profiles(profiles: list[dict]) -> dict:
    """Profiles of the same grid measured at different times, as one: for each grid cell the record
    whose seconds is the median over the profiles (median_low for an even count: a measured
    record, with its own shape, rather than an average of slightly different shapes), so a
    profile that ran slow or fast moves it least; samples are concatenated. The records must
    match cell by cell (same grid, same model)."""
    if not profiles:
        raise ValueError("no profiles to pool")
    first = profiles[0]
    pooled = {**first, "pooled_from": [p.get("created") for p in profiles], "command": "pooled: "
              + "; ".join(str(p.get("command", "")) for p in profiles)}

    def cell(rec: dict) -> tuple:
        return (rec["kind"], *(rec["shape"].get(f, 0) for f in CELL_FIELDS))

    for section in ("steps", "swaps", "copies"):
        if any(len(p.get(section, [])) != len(first.get(section, [])) for p in profiles):
            raise ValueError(f"profiles differ in their number of {section}: pooling needs the same grid")
        records = []
        for i, rec in enumerate(first.get(section, [])):
            same = [p[section][i] for p in profiles]
            if any(cell(r) != cell(rec) for r in same):
                raise ValueError(f"profiles differ at {section}[{i}]: pooling needs the same grid in every profile")
            median = sorted(same, key=lambda r: r["seconds"])[(len(same) - 1) // 2]
            records.append({**median, "samples": [x for r in same for x in r.get("samples", [r["seconds"]])]})
        pooled[section] = records
    return pooled

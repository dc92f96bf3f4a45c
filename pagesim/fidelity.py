"""Fidelity measurements that need no torch: the cost model's error on the executor's own steps
(queueing removed), confidence bands over repeated executor runs, and the executor's speed
relative to a profile.

Step kinds (`step_kind`): a step that swaps is "with swap" whatever else it computes; otherwise
a step that copies blocks (copy-on-write) is "with copy"; otherwise "mixed" (prefill and decode
tokens in one step), "prefill" or "decode". Each step is counted in exactly one kind, plus "all".
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import astuple, fields
from pathlib import Path

from pagesim.core.step import BatchShape
from pagesim.metrics import percentile

STEP_KINDS = ("prefill", "decode", "mixed", "with swap", "with copy")
SHAPE_COLUMNS = tuple(f.name for f in fields(BatchShape)) + ("seconds",)  # step_shapes.csv's header (fixed format)

# two-sided 95 % quantiles of Student's t (t_{0.975, df}), df = 1..30; beyond, the Cornish-Fisher
# expansion around the normal's 1.96 (error below 1e-4 there)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def step_kind(shape: BatchShape) -> str:
    if shape.num_swap_blocks:
        return "with swap"
    if shape.num_copy_blocks:
        return "with copy"
    if shape.num_prefill_tokens and shape.num_decode_seqs:
        return "mixed"
    return "prefill" if shape.num_prefill_tokens else "decode"


# ----------------------------------------------------------------------------- step_shapes.csv

def write_step_shapes(path: str | Path, steps: list[tuple[BatchShape, float]]) -> None:
    """One row per executor step: its BatchShape fields (dataclass order) and its measured seconds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SHAPE_COLUMNS)
        for shape, seconds in steps:
            w.writerow((*astuple(shape), repr(float(seconds))))


def read_step_shapes(path: str | Path) -> list[tuple[BatchShape, float]]:
    path = Path(path)
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = tuple(next(rows, ()))
        if header != SHAPE_COLUMNS:
            raise ValueError(f"{path}: header must be {','.join(SHAPE_COLUMNS)}, got {','.join(header)}")
        steps = []
        for i, row in enumerate(rows, start=2):
            if len(row) != len(SHAPE_COLUMNS):
                raise ValueError(f"{path}: line {i}: expected {len(SHAPE_COLUMNS)} fields, got {len(row)}")
            try:
                ints = [int(v) for v in row[:-1]]
                seconds = float(row[-1])
            except ValueError as e:
                raise ValueError(f"{path}: line {i}: {e}") from None
            steps.append((BatchShape(*ints), seconds))
    return steps


# ----------------------------------------------------------------------------- step-level error

def step_errors(steps: list[tuple[BatchShape, float]], cost_model) -> dict[str, dict]:
    """The cost model's relative error (predicted - measured) / measured on each measured step,
    by kind (STEP_KINDS, then "all"): count, median and p90 of |error|, and the signed mean
    (bias: a queue amplifies a bias, not scatter). Kinds without steps have count 0 and None."""
    errors = {kind: [] for kind in STEP_KINDS}
    for shape, seconds in steps:
        if seconds > 0:  # a step the clock could not resolve has no relative error
            errors[step_kind(shape)].append(cost_model.iteration_time(shape) / seconds - 1)
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
    ratios = [seconds / cost_model.iteration_time(shape) for shape, seconds in steps if step_kind(shape) == "decode"]
    return statistics.median(ratios) if ratios else None


# ----------------------------------------------------------------------------- bands over repeats

def t_quantile_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"a t interval needs at least 2 values (df >= 1), got df={df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % Student t interval of the mean of `values` (at least 2)."""
    n = len(values)
    mean = sum(values) / n
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def band_row(label: str, key: str, executor_values: list, simulated, tolerance: float = 0.05) -> dict:
    """One metric: the executor's mean and 95 % band over its runs, the simulator's point, and
    whether the simulator is inside the band or within `tolerance` of the mean (the target)."""
    values = [v for v in executor_values if v is not None]
    row = {"label": label, "key": key, "runs": len(values), "executor_values": values, "simulator": simulated,
           "mean": None, "low": None, "high": None, "rel_to_mean": None, "inside_band": None, "within_tolerance": None,
           "target_met": None}
    if len(values) < 2 or simulated is None:
        return row
    mean, low, high = mean_interval(values)
    rel = (simulated - mean) / mean if mean else None
    inside = low <= simulated <= high
    within = rel is not None and abs(rel) <= tolerance
    row.update(mean=mean, low=low, high=high, rel_to_mean=rel, inside_band=inside, within_tolerance=within,
               target_met=inside or within)
    return row


def pool_profiles(profiles: list[dict]) -> dict:
    """Profiles of the same grid measured at different times, as one: each shape's seconds is the
    median of its per-profile medians (a profile that ran slow or fast moves it least), samples
    are concatenated. The shapes must match record by record (same grid, same model)."""
    if not profiles:
        raise ValueError("no profiles to pool")
    first = profiles[0]
    pooled = {**first, "pooled_from": [p.get("created") for p in profiles], "command": "pooled: "
              + "; ".join(str(p.get("command", "")) for p in profiles)}
    for section in ("steps", "swaps", "copies"):
        records = []
        for i, rec in enumerate(first.get(section, [])):
            same = [p[section][i] for p in profiles if i < len(p.get(section, []))]
            if len(same) != len(profiles) or any(r["kind"] != rec["kind"] or r["shape"] != rec["shape"] for r in same):
                raise ValueError(f"profiles differ at {section}[{i}]: pooling needs the same grid in every profile")
            records.append({**rec, "seconds": statistics.median(r["seconds"] for r in same),
                            "samples": [x for r in same for x in r.get("samples", [r["seconds"]])]})
        if any(len(p.get(section, [])) != len(records) for p in profiles):
            raise ValueError(f"profiles differ in their number of {section}: pooling needs the same grid")
        pooled[section] = records
    return pooled

"""Prediction error of a cost model on measured operator rows (`pagesim calibrate check`, the
calibration report).

For every row of an mlp.csv-format file the calibrated terms predict each operator from the row's
own model shape, token count and TP degree. Errors are absolute relative errors |pred / meas - 1|,
summarized as median and p90: per operator, and for the layer sum (all layer operators the row
measured, `emb` excluded: it runs once per step, not per layer), overall and by token bucket.
"""

from __future__ import annotations

from pagesim.metrics import percentile
from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibration import LAYER_OPERATORS, STEP_OPERATORS, Calibration
from pagesim.sim.cost.measurements import OperatorRow
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.specs import GPUSpec

TOKEN_BUCKETS = ((1, 64), (65, 512), (513, 4096))


def error_summary(errors: list[float]) -> dict:
    if not errors:
        return {"rows": 0, "median_abs_rel_error": None, "p90_abs_rel_error": None}
    return {"rows": len(errors), "median_abs_rel_error": percentile(errors, 50),
            "p90_abs_rel_error": percentile(errors, 90)}


def predicted_layer_seconds(cal: Calibration, row: OperatorRow) -> float:
    """The calibrated layer sum over the operators this row measured."""
    return sum(cal.operator_seconds(op, row.shape, row.num_tokens) for op in LAYER_OPERATORS if op in row.seconds)


def roofline_layer_seconds(gpu: GPUSpec, row: OperatorRow) -> float:
    """The roofline's time for the same layer: its linear and elementwise parts for the row's
    one-layer model (no attention, all-reduce or overhead: mlp.csv has none)."""
    key = (row.shape.model, gpu, row.shape.tp)
    if key not in _ROOFLINES:
        _ROOFLINES[key] = RooflineCostModel(*key)
    parts = _ROOFLINES[key].breakdown(BatchShape(num_prefill_tokens=row.num_tokens))
    return parts["linear"] + parts["elementwise"]


_ROOFLINES: dict = {}


def check_rows(cal: Calibration, rows: list[OperatorRow], roofline_gpu: GPUSpec | None = None) -> dict:
    """Error summary of `cal` on `rows` (and of the roofline on the same rows, when given a GPU)."""
    per_op: dict[str, list[float]] = {}
    layer: list[float] = []
    roof: list[float] = []
    buckets: dict[str, list[float]] = {f"{lo}-{hi}": [] for lo, hi in TOKEN_BUCKETS}
    roof_buckets: dict[str, list[float]] = {f"{lo}-{hi}": [] for lo, hi in TOKEN_BUCKETS}
    for r in rows:
        for op in LAYER_OPERATORS + STEP_OPERATORS:
            if op in r.seconds:
                per_op.setdefault(op, []).append(abs(cal.operator_seconds(op, r.shape, r.num_tokens) / r.seconds[op] - 1))
        measured = r.layer_seconds
        e = abs(predicted_layer_seconds(cal, r) / measured - 1)
        layer.append(e)
        bucket = next((f"{lo}-{hi}" for lo, hi in TOKEN_BUCKETS if lo <= r.num_tokens <= hi), None)
        if bucket:
            buckets[bucket].append(e)
        if roofline_gpu is not None:
            re = abs(roofline_layer_seconds(roofline_gpu, r) / measured - 1)
            roof.append(re)
            if bucket:
                roof_buckets[bucket].append(re)
    overall = error_summary(layer)
    out = {
        "rows": len(rows),
        "layer_sum_median_abs_rel_error": overall["median_abs_rel_error"],
        "layer_sum_p90_abs_rel_error": overall["p90_abs_rel_error"],
        "layer_sum_by_tokens": {b: error_summary(v) for b, v in buckets.items()},
        "operators": {op: error_summary(v) for op, v in per_op.items()},
    }
    if roofline_gpu is not None:
        out["roofline"] = {"layer_sum": error_summary(roof),
                           "layer_sum_by_tokens": {b: error_summary(v) for b, v in roof_buckets.items()}}
    return out

"""`pagesim calibrate`: the calibrated GPU cost model's fit and its check against measurements.

    pagesim calibrate check OPS_CSV --gpu GPU [--json]   prediction error on an mlp.csv-format file
    pagesim calibrate fit DATA_DIR [--out DIR]           refit the shipped coefficients
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.replay import fail

calibrate_app = typer.Typer(no_args_is_help=True, add_completion=False,
                            help="Fit and check the calibrated GPU cost model (docs/calibration.md).")
app.add_typer(calibrate_app, name="calibrate")

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "sim" / "data" / "calibrated"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


@calibrate_app.command()
def check(
    ops_csv: Path = typer.Argument(..., help="operator timings in the mlp.csv format (gpu_profiles/compute/...)"),
    gpu: str = typer.Option(..., help="GPU the file was measured on (catalog name: a100-80gb, h100-80gb, a40-48gb, ...)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
) -> None:
    """Predict every row of OPS_CSV (model from its columns, TP from num_tensor_parallel_workers) and
    print the median and p90 absolute relative error per operator and for the layer sum."""
    from rich.console import Console
    from rich.table import Table

    from pagesim.sim.cost.calibrated import shipped_calibration
    from pagesim.sim.cost.check import check_rows
    from pagesim.sim.cost.measurements import MeasurementError, read_operator_csv
    from pagesim.sim.specs import get_gpu

    try:
        spec = get_gpu(gpu)
        rows = read_operator_csv(ops_csv)
    except KeyError as e:
        fail(str(e.args[0]))
    except MeasurementError as e:
        fail(str(e))
    cal = shipped_calibration(spec)
    result = {"file": str(ops_csv), "gpu": spec.name, "calibration": cal.source.get("scaled_from", spec.name),
              **check_rows(cal, rows)}
    if as_json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True, allow_nan=False)  # never NaN: the inputs are bounded
        sys.stdout.write("\n")
        return
    console = Console()
    table = Table(title=f"calibrated model on {ops_csv} ({result['rows']} rows, {spec.name})", title_justify="left")
    for col in ("what", "rows", "median |err|", "p90 |err|"):
        table.add_column(col, justify="left" if col == "what" else "right")
    table.add_row("layer sum", str(result["rows"]), _pct(result["layer_sum_median_abs_rel_error"]),
                  _pct(result["layer_sum_p90_abs_rel_error"]), style="bold")
    for bucket, s in result["layer_sum_by_tokens"].items():
        table.add_row(f"  layer sum, {bucket} tokens", str(s["rows"]), _pct(s["median_abs_rel_error"]),
                      _pct(s["p90_abs_rel_error"]))
    for op, s in result["operators"].items():
        table.add_row(op, str(s["rows"]), _pct(s["median_abs_rel_error"]), _pct(s["p90_abs_rel_error"]))
    console.print(table)
    if "scaled_from" in cal.source:
        console.print(f"note: {spec.name} has no measurements; coefficients scaled from {cal.source['scaled_from']}")


@calibrate_app.command()
def fit(
    data_dir: Path = typer.Argument(..., help="the gpu_profiles directory (../shared/data/gpu_profiles)"),
    out: Optional[Path] = typer.Option(None, help=f"where the <gpu>.json files go (default: the shipped ones, {SHIPPED_DIR})"),
) -> None:
    """Fit every measured GPU's coefficients and write them (pagesim/sim/cost/fit.py)."""
    from pagesim.sim.cost.fit import write_calibrations
    from pagesim.sim.cost.measurements import MeasurementError

    try:
        written = write_calibrations(data_dir, out or SHIPPED_DIR)
    except MeasurementError as e:
        fail(str(e))
    for path in written:
        typer.echo(f"wrote {path}")

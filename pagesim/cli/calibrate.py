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
from pagesim.cli.checks import OUT_FILE, progress_bar
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
        with progress_bar("calibrate fit", "GPUs", None, bar=False):  # a line every 10 s in a log
            written = write_calibrations(data_dir, out or SHIPPED_DIR)
    except MeasurementError as e:
        fail(str(e))
    for path in written:
        typer.echo(f"wrote {path}")


@calibrate_app.command()
def engine(
    runs: list[Path] = typer.Argument(..., help="recorded real runs of one engine (any format `pagesim validate` reads)"),
    gpu: Optional[str] = typer.Option(None, help="GPU of the runs (catalog name; default: as each run records it)"),
    base: str = typer.Option("vllm-0.15", help="engine profile whose structure (CUDA graphs, async output) the fit keeps "
                             "and whose parameters it starts from"),
    name: Optional[str] = typer.Option(None, help="name of the fitted profile (default: the output file's stem)"),
    out: Path = typer.Option(..., parser=OUT_FILE, help="write the fitted profile (JSON) here; use it with --engine FILE"),
    loo: bool = typer.Option(True, help="also fit once per run without it and print its held-out errors"),
) -> None:
    """Fit an engine profile's parameters to real runs (docs/validate.md) and print the
    leave-one-run-out error of the mean E2E, TTFT and ITL."""
    from dataclasses import asdict, replace

    from pagesim.engine_fit import PRIORS, fit_engine
    from pagesim.realruns import RealRunError, load_real_run
    from pagesim.sim.cost.engine import EngineProfileError, load_engine_profile
    from pagesim.validate import ValidateError, fit_run, leave_one_out

    try:
        profile = load_engine_profile(base)
        fit_runs = [fit_run(load_real_run(path), gpu=gpu, engine=base) for path in runs]
    except (RealRunError, ValidateError, EngineProfileError, KeyError, ValueError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))
    echo = lambda message: typer.echo(message, err=True)  # noqa: E731
    done = []  # the fit's iterations, then the held-out runs: each says its own line, and a log gets one every 10 s

    def said(message: str) -> None:
        echo(message)
        done.append(message)
        advance(len(done))

    with progress_bar("calibrate engine: fit", "iterations", None, bar=False) as advance:
        result = fit_engine(fit_runs, profile, progress=said)
    held_out = {}
    if loo and len(fit_runs) > 1:
        done.clear()
        with progress_bar("calibrate engine: leave one run out", "runs", len(fit_runs), bar=False) as advance:
            def report(run_name, entry):
                e = entry["errors"]
                said(f"held out {run_name}: E2E {_pct(e.get('e2e_mean', {}).get('error'))}, TTFT "
                     f"{_pct(e.get('ttft_mean', {}).get('error'))}, ITL {_pct(e.get('itl_mean', {}).get('error'))}")
            held_out = leave_one_out(fit_runs, profile, result.params, progress=report)
    fitted = replace(profile, name=name or out.stem, params=result.params, provenance={
        "fitted_by": "pagesim calibrate engine", "base": profile.name, "runs": [r.name for r in fit_runs],
        "priors": {k: list(v) for k, v in PRIORS.items()}, "iterations": result.iterations,
        "leave_one_run_out": {k: {m: v["errors"].get(f"{m}_mean", {}).get("error") for m in ("e2e", "ttft", "itl")}
                              for k, v in held_out.items()}})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fitted.to_json(), indent=2, sort_keys=True) + "\n")
    typer.echo(json.dumps({"params": asdict(result.params), "iterations": result.iterations}, indent=2))
    if held_out:
        errors = [abs(v["errors"]["e2e_mean"]["error"]) for v in held_out.values() if v["errors"].get("e2e_mean")]
        typer.echo(f"leave-one-run-out mean |error| of the mean E2E: {_pct(sum(errors) / len(errors))} over "
                   f"{len(errors)} runs")
    typer.echo(f"wrote {out}")

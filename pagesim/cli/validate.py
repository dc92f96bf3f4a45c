"""`pagesim validate RUN`: replay a recorded real run and set the prediction beside the measurement."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import BLOCKS, COUNT, OUT_DIR, TP, fail, progress_bar
from pagesim.cli.config_file import config_option, given_options_line

ROWS = [("TTFT", "ttft", "s"), ("TPOT", "tpot", "s"), ("E2E", "e2e", "s")]


@app.command()
def validate(
    ctx: typer.Context,
    run: Path = typer.Argument(..., help="a recorded real run: inference-perf/BLIS replay_data JSON, LLMServingSim "
                               "requests.jsonl (or its folder), DistServe .exp, vllm bench serve JSON, guidellm JSON, "
                               "or a pagesim bench folder (docs/validate.md)"),
    config: Optional[Path] = config_option(help_text="TOML, YAML or JSON file of options named as the flags; flags "
                                           "given here override it"),
    gpu: Optional[str] = typer.Option(None, help="GPU from the catalog (default: as the run records it)"),
    model: Optional[str] = typer.Option(None, help="catalog model or config.json (default: as the run records it)"),
    engine: Optional[str] = typer.Option(None, help="engine profile (default: the one for the run's vLLM version)"),
    tp: Optional[int] = typer.Option(None, "--tp", "--tensor-parallel-size", parser=TP,
                                     help="tensor-parallel degree (default: as recorded)"),
    num_gpu_blocks: Optional[int] = typer.Option(None, "--num-gpu-blocks", "--num-gpu-blocks-override",
                                                 parser=BLOCKS, help="KV pool in blocks (default: as recorded)"),
    concurrency: Optional[int] = typer.Option(None, parser=COUNT, help="replay closed loop with N clients (default: a "
                                              "closed-loop run's own count; 0: the recorded send times)"),
    out: Optional[Path] = typer.Option(None, parser=OUT_DIR, help="write requests.csv, steps.csv, summary.json and "
                                       "validate.json here"),
    as_json: bool = typer.Option(False, "--json", help="print validate.json"),
) -> None:
    """Replay RUN (same arrivals, lengths and server settings) and print predicted against measured
    TTFT, TPOT, ITL, E2E and throughput, with signed errors, overall and per load stage."""
    from pagesim.realruns import RealRunError, load_real_run
    from pagesim.validate import ValidateError
    from pagesim.validate import validate as run_validation

    try:
        real = load_real_run(run)
    except RealRunError as e:
        fail(str(e))
    try:
        with progress_bar("validate", "requests", len(real.requests), quiet=as_json) as advance:
            result = run_validation(real, progress=advance, keep_steps=out is not None, gpu=gpu, model=model,
                                    engine=engine, tp=tp, num_gpu_blocks=num_gpu_blocks, concurrency=concurrency)
    except (ValidateError, KeyError, ValueError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))
    report = result.to_json()
    if out is not None:
        report["reproduce"] = given_options_line(ctx, run)
        write_results(out, result, report)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n")
        return
    print_validation(result)
    if out is not None:
        typer.echo(f"wrote {out}/requests.csv, steps.csv, summary.json, validate.json")
        typer.echo(f"reproduce with: {report['reproduce']}")


def write_results(out: Path, result, report: dict) -> None:
    """The replay's results with request_id = the real run's own request index, and validate.json."""
    from pagesim.results import results_folder

    metrics = result.replay.metrics
    ids = result.request_ids
    for record in metrics.requests:
        record.request_id = ids[record.request_id]
    with results_folder(out) as folder:
        metrics.write(folder, result.replay.summary)
        (folder / "validate.json").write_text(json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:,.1f} ms" if unit == "s" else f"{value:,.1f}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def print_validation(result) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    run = result.run
    table = Table(title=f"{run.name} · {result.config.model} on {result.config.tp} x {result.config.gpu} · "
                        f"engine {result.config.engine}", title_justify="left")
    for column in ("metric", "measured", "predicted", "error"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    rows = result.overall
    for label, key, unit in ROWS:
        for stat in ("mean", "median", "p90", "p99"):
            cell = rows.get(f"{key}_{stat}")
            if cell:
                table.add_row(f"{label} {stat}", _fmt(cell["measured"], unit), _fmt(cell["predicted"], unit),
                              _err(cell["error"]))
    for key, label, unit in (("itl_mean", "ITL mean", "s"), ("output_throughput", "output tok/s", "")):
        cell = rows.get(key)
        if cell:
            table.add_row(label, _fmt(cell["measured"], unit), _fmt(cell["predicted"], unit), _err(cell["error"]))
    console.print(table)
    if len(result.stages) > 1:
        stages = Table(title="per load stage (mean)", title_justify="left")
        for column in ("stage", "E2E", "TTFT", "ITL"):
            stages.add_column(column, justify="right")
        for index, cells in result.stages.items():
            stages.add_row(str(index), *(_err(cells.get(k, {}).get("error")) for k in ("e2e_mean", "ttft_mean", "itl_mean")))
        console.print(stages)
    c = result.counts
    console.print(f"compared {c['compared']:,} of {c['requests']:,} requests ({c['failed_real']:,} failed in the real run, "
                  f"{c['failed_in_replay_only']:,} more only in the replay)", markup=False, highlight=False)
    for line in list(run.assumptions) + result.notes:
        console.print(f"assumed: {line}", markup=False, highlight=False)
    for line in result.observations:
        console.print(f"note: {line}", markup=False, highlight=False)

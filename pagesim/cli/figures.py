"""`pagesim figures`: run the paper's figure scripts (pagesim/experiments/figNN_*.py) in parallel and write
reports/paper.md. The work is pagesim/experiments/run_all.py's; this is its CLI face."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import JOBS, OUT_DIR, fail


@app.command()
def figures(
    only: Optional[List[str]] = typer.Option(None, help="figure keys or script stems, repeated or comma-separated (fig12,fig13)"),
    jobs: int = typer.Option(2, parser=JOBS, help="figure scripts running at once"),
    full: bool = typer.Option(False, help="the paper's 3600 s of arrivals (default: the artifact's 600 s)"),
    smoke: bool = typer.Option(False, help="every script in its seconds-long smoke mode"),
    out_dir: Optional[Path] = typer.Option(None, parser=OUT_DIR, help="where the figure files go (default: reports/figures "
                                        "in the current folder, with reports/paper.md beside it; where results are there already, "
                                        "a --smoke run or one of fewer figures than paper.md lists must name a folder of its own)"),
) -> None:
    """Run the figure scripts in parallel processes and write reports/paper.md (in the current folder)."""
    from rich.console import Console
    from rich.table import Table

    from pagesim.experiments import run_all

    if full and smoke:
        fail("--full and --smoke exclude each other")
    try:
        figs = run_all.discover(only)
        if out_dir is None:  # the committed results: never replaced by smoke runs or by fewer figures
            run_all.check_default_target(figs, smoke)
    except ValueError as e:
        fail(str(e))
    out = out_dir or run_all.DEFAULT_OUT_DIR
    started = time.perf_counter()
    paper_md = run_all.run(figs, jobs=jobs, full=full, smoke=smoke, out_dir=out, progress=Console().is_terminal)
    wall_s = time.perf_counter() - started
    table = Table(title=f"wrote {paper_md}", title_justify="left",
                  caption=f"{len(figs)} figure scripts, {jobs} at a time: {wall_s:.0f} s wall in all", caption_justify="left")
    for col in ("figure", "run", "verdict"):
        table.add_column(col)
    for f in sorted(figs, key=lambda f: f.key):
        md = Path(out) / f"{f.stem}.md"
        verdict = "-"
        if f.returncode == 0 and md.exists():
            v = run_all.read_verdicts(md)
            verdict = f"{v.num_within} of {v.num_rows} within"
        table.add_row(f.stem, f"{'ok' if f.returncode == 0 else 'FAILED'} {f.wall_s:.0f} s", verdict)
    Console().print(table)
    for f in sorted(figs, key=lambda f: f.key):  # why, in whole lines (a table cell would cut them)
        if f.returncode != 0:
            Console().print(f"{f.stem} failed: {run_all.failure_reason(f)} (log {f.log})", markup=False, soft_wrap=True)
    if any(f.returncode != 0 for f in figs):
        raise typer.Exit(1)

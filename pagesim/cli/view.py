"""`pagesim view RUN_DIR [RUN_DIR ...]`: the runs' HTML page (pagesim.view)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import OUT_FILE, fail


@app.command()
def view(
    runs: List[Path] = typer.Argument(..., help="run folders (replay, run, bench or validate --out), a file in one, "
                                      "or a folder with runs below it (compare --out): several are overlaid"),
    out: Optional[Path] = typer.Option(None, parser=OUT_FILE, help="the page to write (default: report.html in the "
                                       "one run folder given)"),
    label: Optional[List[str]] = typer.Option(None, help="a run's name on the page, one per run in order (default: "
                                              "its folder's name)"),
) -> None:
    """Write one self-contained HTML page (plots over time, latency distributions, configuration
    and summary) for a run, or for several overlaid; it loads nothing from the network."""
    from pagesim.view import ViewError, write_report

    if out is None:
        if len(runs) != 1 or not runs[0].is_dir():
            fail("--out: name the page to write (the default, report.html in the run folder, needs one folder)")
        out = runs[0] / "report.html"
    try:
        write_report(runs, out, label or None)
    except ViewError as e:
        fail(str(e))
    typer.echo(f"wrote {out}")

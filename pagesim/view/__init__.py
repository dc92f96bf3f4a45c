"""`pagesim view`: one self-contained HTML page per run (or runs overlaid) from the files that
replay, run, bench, compare and validate write with --out (see docs/cli.md).

    from pagesim.view import write_report
    write_report([Path("out/run")], Path("report.html"))
"""

from __future__ import annotations

import os
from pathlib import Path

from pagesim.view.runs import MAX_RUNS, Run, ViewError, find_runs, load_run

__all__ = ["MAX_RUNS", "Run", "ViewError", "build_report", "load_runs", "write_report"]


def load_runs(paths: list[Path], labels: list[str] | None = None) -> list[Run]:
    """The runs the paths name (see pagesim.view.runs.find_runs), read; labels replace their names."""
    found = find_runs([Path(p) for p in paths])
    if labels:
        if len(labels) != len(found):
            raise ViewError(f"{len(labels)} --label given for {len(found)} runs "
                            f"({', '.join(label for label, _ in found)})")
        found = [(label, path) for label, (_, path) in zip(labels, found)]
    return [load_run(label, path) for label, path in found]


def build_report(paths: list[Path], labels: list[str] | None = None) -> str:
    from pagesim.view.page import render

    return render(load_runs(paths, labels))


def write_report(paths: list[Path], out: Path, labels: list[str] | None = None) -> None:
    """The page for `paths`, written to `out` whole (or not at all)."""
    from pagesim.results import results_file

    html = build_report(paths, labels)
    with results_file(out) as tmp:
        tmp.write_text(html)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # (a temporary file is private; the page is not)

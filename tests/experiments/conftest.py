"""Shared by the figure tests: one smoke run of a figure script with the checks every figure's
files must pass."""

from __future__ import annotations

import csv
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

@dataclass
class SmokeRun:
    result: dict  # what the script's main() returned
    rows: list[dict]  # its .csv
    md: str  # its .md


def run_smoke(name: str, out_dir: Path, columns) -> SmokeRun:
    """pagesim/experiments/<name>.py --smoke: its png/csv/md exist, the csv has the columns, the md names
    the exact command."""
    module = importlib.import_module(f"pagesim.experiments.{name}")
    result = module.main(["--smoke", "--out-dir", str(out_dir)])
    for ext in ("png", "csv", "md"):
        path = out_dir / f"{name}.{ext}"
        assert path.exists() and path.stat().st_size > 0, path
    with open(out_dir / f"{name}.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert set(columns) <= set(reader.fieldnames), set(columns) - set(reader.fieldnames)
    assert rows
    md = (out_dir / f"{name}.md").read_text()
    assert f"python -m pagesim.experiments.{name} --smoke --out-dir {out_dir}" in md
    return SmokeRun(result, rows, md)


@pytest.fixture
def smoke():
    return run_smoke

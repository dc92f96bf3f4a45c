"""bench against fake servers (tests/bench/fake_server.py): one CLI call per case, in process."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.trace import Trace, TraceRequest, save_trace

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = [(5, 4), (8, 2), (3, 6)]  # (prompt_len, output_len)


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity (which Python's json would accept)."""
    def refuse(name):
        raise ValueError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def assert_finite(value, where: str = "") -> None:
    if isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, dict):
        for k, v in value.items():
            assert_finite(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            assert_finite(v, f"{where}[{i}]")


@pytest.fixture
def small_trace(tmp_path) -> Path:
    path = tmp_path / "small.json"
    save_trace(Trace({"source": "tests/bench", "count": len(LENGTHS)}, [TraceRequest(p, o) for p, o in LENGTHS]), path)
    return path


def bench(trace: Path, base: str, *flags: str, out: Path | None = None):
    """`pagesim bench` in process; returns (result, summary.json or None)."""
    args = ["bench", str(trace), "--endpoint", base, "--rate", "100", "--timeout", "20", "--scrape-interval", "0.05",
            *flags]
    if out is not None:
        args += ["--out", str(out)]
    result = CliRunner().invoke(app, args)
    summary = strict_json((out / "summary.json").read_text()) if out is not None and (out / "summary.json").exists() else None
    return result, summary

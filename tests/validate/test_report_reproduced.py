"""`pagesim validate` on shared runs reproduces reports/sim2real.md's numbers (its errors.csv): the
report is what the command gives, not a separate computation."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.builders import default_data_dir

ROOT = Path(__file__).resolve().parents[2]
REAL = default_data_dir() / "real_vllm"
ERRORS = ROOT / "reports" / "sim2real" / "errors.csv"
PROFILES = ROOT / "reports" / "sim2real" / "profiles"
CASES = [  # (group, run, path under real_vllm, validate flags)
    ("rtx", "Llama-3.1-8B", "llmservingsim-vllm0.19/RTXPRO6000/Llama-3.1-8B",
     ["--gpu", "rtx-pro-6000-96gb", "--engine", str(PROFILES / "all-stable.json")]),
    ("a100", "vllm-100-1", "distserve-a100/vllm-100-1.exp", ["--gpu", "a100-80gb", "--engine", "paper"]),
    ("h100", "20260217-162547-llama-2-7b-tp1-roleplay",
     "blis-h100-vllm0.15/replay_data/20260217-162547-llama-2-7b-tp1-roleplay.json.gz",
     ["--gpu", "h100-80gb", "--engine", str(PROFILES / "without-20260217-162547-llama-2-7b-tp1-roleplay.json")]),
]


def reported(group: str, run: str) -> dict:
    with open(ERRORS) as f:
        for row in csv.DictReader(f):
            if row["group"] == group and row["run"] == run and row["system"] == "pagesim":
                return row
    raise AssertionError(f"{run} not in {ERRORS}")


@pytest.mark.skipif(not REAL.exists(), reason=f"needs the shared real runs ({REAL}; set PAGESIM_DATA_DIR)")
@pytest.mark.parametrize("group, run, path, flags", CASES, ids=[c[1] for c in CASES])
def test_validate_reproduces_the_report(group, run, path, flags):
    import json

    result = CliRunner().invoke(app, ["validate", str(REAL / path), *flags, "--json"])
    assert result.exit_code == 0, result.output
    overall = json.loads(result.output)["overall"]
    row = reported(group, run)
    for metric in ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90", "itl_mean"):
        assert overall[metric]["error"] == pytest.approx(float(row[metric]), rel=1e-9, abs=1e-12), metric

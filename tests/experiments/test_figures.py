"""Each figure script's main(--smoke) writes its .png/.csv/.md with the paper's numbers and verdicts."""

from __future__ import annotations

import csv
import importlib
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

paper = importlib.import_module("paper")


def _paper_numbers(name: str) -> list[float]:
    if name == "fig11_lengths":
        return [v for m in paper.FIG11_MEANS.values() for v in (m.prompt_len, m.output_len)]
    if name == "fig13_batched_requests":
        return [v for ref in paper.FIG13_BATCHED.values() for v in ref.values.values()]
    return [v for shares in paper.FIG02_SHARES.values() for v in shares.values() if v is not None]


CASES = {
    "fig11_lengths": ["trace", "kind", "bin_lo", "bin_hi", "count", "share"],
    "fig13_batched_requests": ["trace", "rate", "policy", "paper_mean_batched", "mean_batched_requests",
                               "request_throughput", "mean_step_ms"],
    "fig02_memory_waste": ["policy", "token_states_pct", "reserved_pct", "internal_fragmentation_pct",
                           "external_and_other_pct", "paper_token_states_pct", "free_pct"],
}
DIGITS = {"fig11_lengths": 2, "fig13_batched_requests": 2, "fig02_memory_waste": 1}


@pytest.mark.parametrize("name", list(CASES))
def test_smoke_outputs(name, tmp_path):
    module = importlib.import_module(name)
    result = module.main(["--smoke", "--out-dir", str(tmp_path)])
    for ext in ("png", "csv", "md"):
        path = tmp_path / f"{name}.{ext}"
        assert path.exists() and path.stat().st_size > 0, path
    with open(tmp_path / f"{name}.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert set(CASES[name]) <= set(reader.fieldnames)
    assert rows
    md = (tmp_path / f"{name}.md").read_text()
    assert f"python experiments/{name}.py --smoke --out-dir {tmp_path}" in md
    assert "| quantity | paper | ours |" in md
    for number in _paper_numbers(name):
        assert f"| {number:.{DIGITS[name]}f} |" in md, number
    # one verdict row per paper number
    assert len(result["rows"]) >= len(_paper_numbers(name))
    verdicts = [line for line in md.splitlines() if "**within**" in line or "**NOT within**" in line]
    assert len(verdicts) == len(result["rows"])


def test_policies_cover_fig13_and_fig02():
    for ref in paper.FIG13_BATCHED.values():
        assert set(ref.values) == set(paper.POLICIES)
    assert set(paper.FIG02_SHARES) == set(paper.POLICIES)

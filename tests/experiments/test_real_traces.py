"""python -m pagesim.experiments.real_traces --smoke: the report, its data and figures, the
Mooncake paper's numbers beside ours, and the place left for the sessions section."""

from __future__ import annotations

import json

import pytest

from pagesim.experiments import real_traces


@pytest.mark.slow
def test_smoke_report(tmp_path):
    out = tmp_path / "real_traces.md"
    real_traces.main(["--smoke", "--out", str(out)])
    md = out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    for name in ("traces.png", "prefix_caching.png", "runs.csv", "traces.csv"):
        assert (tmp_path / "real_traces" / name).stat().st_size > 0
    assert real_traces.SESSIONS_MARK in md
    assert "| mooncake_conversation | mean input length | 12,035 |" in md  # Table 2 of the paper
    runs = data["runs"]
    assert {r["trace"] for r in runs} == set(real_traces.TRACES)
    described = {d["trace"]: d for d in data["traces"]}
    for name in real_traces.LOAD_STRETCH:
        mine = [r for r in runs if r["trace"] == name]
        (unbounded,) = [r for r in mine if r["unbounded"]]
        assert unbounded["evictions"] == 0
        # never more than the hash ids allow, and within a point of it
        assert unbounded["prompt_tokens_saved"] <= described[name]["hash_id_reuse"] + 1e-9
        assert described[name]["hash_id_reuse"] - unbounded["prompt_tokens_saved"] - unbounded["rejected_prompt_share"] < 0.01
        saved = [r["prompt_tokens_saved"] for r in sorted(mine, key=lambda r: (r["prefix_caching"], r["kv_blocks"]))]
        assert saved[0] == 0 and saved == sorted(saved)  # off, then more cache never serves less here

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


def test_sessions_section_on_the_session_trace():
    from pagesim.experiments.real_traces_sessions import TRACE, sessions_section
    from pagesim.workload.trace import load_trace

    trace = load_trace(real_traces.ROOT / TRACE)
    md, runs = sessions_section(real_traces.ROOT, real_traces.SETUP)
    off, gpu_pool, small_pool = runs
    # the turns as the trace holds them: turn 0 of each session, and the later ones
    firsts = sum(1 for r in trace.requests if r.turn == 0)
    assert [(r["first_turns"]["count"], r["later_turns"]["count"]) for r in runs] == \
        [(firsts, len(trace) - firsts)] * 3
    assert off["later_turns_cached_share"] == 0 and off["prefix_hit_rate"] is None
    # a later turn's prompt is its history plus a new message: most of it is found on a pool that
    # evicts nothing of it, less on a pool that must evict, and reuse shortens its TTFT
    assert gpu_pool["later_turns_cached_share"] > 0.5 > small_pool["later_turns_cached_share"] > 0
    assert gpu_pool["later_turns"]["ttft_mean"] < off["later_turns"]["ttft_mean"]
    assert md.count("\n| o") == 3 and "nan" not in md.lower()

"""The Python API (docs/api.md): named as the CLI's flags, the same runs as the CLI, DataFrames
that hold what the CSV files hold, and an `import pagesim` that loads nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

import pagesim
import pagesim.api
from pagesim.cli.cluster import CLUSTER_FLAGS
from pagesim.cli import app
from pagesim.workload.trace import save_trace
from tests.plan.common import SMALL_TRACE

ROOT = Path(__file__).resolve().parents[1]
SHAREGPT = ROOT / "traces" / "sharegpt.json"


def test_import_pagesim_is_light():
    code = ("import sys, pagesim; heavy = [m for m in ('torch', 'simpy', 'pandas', 'numpy', 'matplotlib', 'triton') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_replay_options_are_the_cli_flags():
    command = typer.main.get_command(app).commands["replay"]
    # (what --out writes: ReplayRun.write; --html: its page; --config: a file of these options; the
    # cluster flags describe replicas, not one replay: pagesim.cluster in Python, docs/cluster.md; --jobs
    # says how many processes replay a cluster's replicas, which changes nothing in what is simulated)
    flags = {p.name for p in command.params} - {"trace", "out", "steps", "as_json", "config", "html", "jobs"} \
        - set(CLUSTER_FLAGS)
    options = set(pagesim.api.replay_options())
    # every flag is an option of the same name; the API also reaches the config fields without a flag
    assert flags <= options and options - flags == {"allocator", "prefix_key", "waste_interval_s",
                                                     "client_timeout_s"}


def test_replay_matches_the_cli_files(tmp_path):
    args = ["--num-requests", "40", "--rate", "3", "--seed", "2", "--model", "opt-13b", "--block-size", "32"]
    result = CliRunner().invoke(app, ["replay", str(SHAREGPT), *args, "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    run = pagesim.replay(str(SHAREGPT), num_requests=40, rate=3, seed=2, model="opt-13b", block_size=32)
    written_summary = json.loads((tmp_path / "summary.json").read_text())
    assert written_summary.pop("reproduce").startswith(f"pagesim replay {SHAREGPT} --config SUMMARY_JSON --out")
    assert run.summary == written_summary
    written = pd.read_csv(tmp_path / "requests.csv", dtype={"reject_reason": str}, converters={"session_id": lambda t: t or None}).fillna({"reject_reason": ""})  # "" reads back as NaN
    pd.testing.assert_frame_equal(run.requests, written, check_dtype=False)
    pd.testing.assert_frame_equal(run.steps, pd.read_csv(tmp_path / "steps.csv"), check_dtype=False)
    assert len(run.requests) == 40 and run.requests["status"].eq("finished").all()
    # the summary's figures are the records' own
    assert run.summary["total_output_tokens"] == run.requests["output_len"].sum()
    assert run.summary["p99_ttft_ms"] == pytest.approx(run.requests["ttft"].quantile(0.99) * 1000, rel=1e-9)


def test_replay_takes_a_trace_object_and_rejects_unknown_options():
    trace = pagesim.load_trace(SHAREGPT)
    run = pagesim.replay(trace, num_requests=5, rate=2.5)
    assert run.summary["num_finished"] == 5 and run.config.rate == 2.5 and "trace" not in run.summary
    assert pagesim.api.replay_config(rate=0).rate is None  # 0: the trace's own arrival times, as the flag
    with pytest.raises(TypeError, match="unknown replay option.*num_request\\b.*valid: .*num_requests"):
        pagesim.replay(trace, num_request=5)


def test_a_summary_config_recreates_the_run(tmp_path):
    # swap_space_gib, warmup_s, force_profile: summary.json names them as ReplayConfig does
    args = ["--num-requests", "30", "--rate", "4", "--swap-space", "1.5", "--warmup", "2", "--preemption", "swap",
            "--max-num-seqs", "6", "--seed", "5"]
    result = CliRunner().invoke(app, ["replay", str(SHAREGPT), *args, "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"swap_space_gib", "warmup_s", "force_profile"} <= set(summary["config"])
    run = pagesim.replay(str(SHAREGPT), **summary["config"])
    assert run.config.swap_space_gib == 1.5 and run.config.warmup_s == 2 and run.config.max_num_seqs == 6
    summary.pop("reproduce")
    assert run.summary == summary
    written = pd.read_csv(tmp_path / "requests.csv", dtype={"reject_reason": str}, converters={"session_id": lambda t: t or None}).fillna({"reject_reason": ""})
    pd.testing.assert_frame_equal(run.requests, written, check_dtype=False)
    with pytest.raises(TypeError, match="given twice: swap_space and swap_space_gib"):
        pagesim.api.replay_config(swap_space=1, swap_space_gib=1)


def test_plan_matches_the_cli(tmp_path):
    trace_file = tmp_path / "small.json"
    save_trace(SMALL_TRACE, trace_file)
    common = dict(model="llama-2-7b", target_rate=50, slo="ttft_p99=0.5,tpot_p99=0.05", gpus=["a100-40gb"],
                  preemption=["recompute", "swap"], num_requests=40, min_duration=0, tolerance=0.1, start_rate=32, jobs=1,
                  min_measured=50, max_requests=1280, seeds=1, check_longer=0)
    plan = pagesim.plan(trace=trace_file, out=tmp_path / "api", **common)
    args = ["plan", "--model", "llama-2-7b", "--trace", str(trace_file), "--target-rate", "50", "--slo",
            common["slo"], "--gpus", "a100-40gb", "--preemption", "recompute,swap", "--num-requests", "40",
            "--min-duration", "0", "--tolerance", "0.1", "--start-rate", "32", "--jobs", "1", "--no-cache",
            "--min-measured", "50", "--max-requests", "1280", "--seeds", "1", "--check-longer", "0",
            "--out", str(tmp_path / "cli")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cli = json.loads((tmp_path / "cli" / "plan.json").read_text())
    assert (tmp_path / "api" / "report.html").is_file()
    assert len(plan.results) == 2 and plan.recommendation is not None
    by_point = {r["point"]["preemption"]: r for r in cli["results"]}
    for r in plan.results:
        assert r.capacity == pytest.approx(by_point[r.point.preemption]["capacity"], rel=1e-12)

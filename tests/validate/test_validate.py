"""`pagesim validate`: a run built here replays with its own arrivals and lengths, the comparison
is measured against the file's numbers computed independently, request ids are the run's own;
a run pagesim cannot simulate is one line; client timeouts and GPU names."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.realruns import load_real_run
from pagesim.validate import catalog_gpu, client_timeout, engine_for, validate


def distserve_run(path, n=30):
    """A DistServe .exp file (line 1 a Python literal): n requests, 0.5 s apart."""
    rows = []
    for i in range(n):
        prompt, output = 100 + 7 * i, 20 + i
        issue = 0.5 * i
        ttft_ms, latency_ms = 40.0 + i, 900.0 + 10 * i
        rows.append({"prompt_len": prompt, "output_len": output, "issue_time": issue,
                     "first_token_time": issue + ttft_ms / 1e3, "complete_time": issue + latency_ms / 1e3,
                     "ttft_ms": ttft_ms, "tpot_ms": (latency_ms - ttft_ms) / (output - 1), "latency_ms": latency_ms})
    path.write_text(repr(rows) + "\n")
    return path, rows


def test_validate_cli_compares_against_the_file(tmp_path):
    run_path, rows = distserve_run(tmp_path / "vllm-30-2.exp")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["validate", str(run_path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["counts"]["compared"] == 30 and report["config"]["engine"] == "paper"  # a pre-v1 fork
    overall = report["overall"]
    assert overall["e2e_mean"]["measured"] == pytest.approx(statistics.mean(r["latency_ms"] / 1e3 for r in rows))
    assert overall["ttft_mean"]["measured"] == pytest.approx(statistics.mean(r["ttft_ms"] / 1e3 for r in rows))
    itl = sum(r["latency_ms"] - r["ttft_ms"] for r in rows) / 1e3 / sum(r["output_len"] - 1 for r in rows)
    assert overall["itl_mean"]["measured"] == pytest.approx(itl)
    for cell in overall.values():
        assert cell["error"] == pytest.approx(cell["predicted"] / cell["measured"] - 1)
    written = (out / "requests.csv").read_text().splitlines()
    assert len(written) == 31 and (out / "validate.json").exists() and (out / "steps.csv").exists()
    sim = json.loads((out / "summary.json").read_text())
    assert sim["num_finished"] == 30


def test_validate_replays_the_runs_arrivals_and_lengths(tmp_path):
    run_path, rows = distserve_run(tmp_path / "vllm-30-2.exp")
    v = validate(load_real_run(run_path))
    records = sorted(v.replay.metrics.requests, key=lambda r: r.request_id)
    assert [r.arrival_time for r in records] == pytest.approx([r["issue_time"] for r in rows])
    assert [r.prompt_len for r in records] == [r["prompt_len"] for r in rows]
    assert [r.output_len for r in records] == [r["output_len"] for r in rows]


def test_a_model_pagesim_cannot_load_is_one_line(tmp_path):
    run_path, _ = distserve_run(tmp_path / "vllm-30-2.exp")
    result = CliRunner().invoke(app, ["validate", str(run_path), "--model", "gpt-17"])
    assert result.exit_code == 2 and "gpt-17" in result.output and len(result.output.strip().splitlines()) == 1


def test_rules_for_engine_gpu_and_timeout():
    assert engine_for("0.15.1") == "vllm-0.15" and engine_for("0.19.0") == "vllm-0.19"
    assert engine_for("0.4.2") == "paper" and engine_for("DistServe's fork of vLLM (early 2024)") == "paper"
    assert engine_for(None) == "vllm-0.19"
    assert catalog_gpu("A100-SXM4-80GB") == "a100-80gb" and catalog_gpu("NVIDIA H100 80GB HBM3") == "h100-80gb"
    assert catalog_gpu("RTXPRO6000") == "rtx-pro-6000-96gb"

    class R:
        def __init__(self, ok, after):
            self.ok, self.abandoned_after_s = ok, after

    class Run:
        requests = [R(True, None)] * 5 + [R(False, 300.0 + 0.1 * i) for i in range(12)]

    assert client_timeout(Run) == 300.0
    Run.requests = [R(False, 10.0 * (i + 1)) for i in range(12)]  # spread out: not a timeout
    assert client_timeout(Run) is None


def test_a_client_timeout_aborts_and_counts_the_request():
    from pagesim.sim.engine import Replay, ReplayConfig
    from pagesim.workload.trace import Trace, TraceRequest

    # one request that takes far longer than the client waits (4000 output tokens)
    trace = Trace({}, [TraceRequest(prompt_len=10, output_len=4000, arrival_time=0.0),
                       TraceRequest(prompt_len=10, output_len=5, arrival_time=0.1)])
    cfg = ReplayConfig(model="llama-2-7b", gpu="h100-80gb", rate=None, num_requests=None, client_timeout_s=2.0)
    result = Replay(cfg, trace).run()
    by_id = {r.request_id: r for r in result.metrics.requests}
    assert by_id[0].status == "rejected" and "client timeout" in by_id[0].reject_reason
    assert by_id[1].status == "finished"
    assert result.summary["num_finished"] == 1 and result.summary["num_rejected"] == 1


def test_calibrate_engine_writes_a_profile_replay_can_use(tmp_path):
    from pagesim.sim.cost.engine import load_engine_profile

    a, _ = distserve_run(tmp_path / "vllm-30-2.exp")
    b, _ = distserve_run(tmp_path / "vllm-20-1.exp", n=20)
    out = tmp_path / "mine.json"
    result = CliRunner().invoke(app, ["calibrate", "engine", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "leave-one-run-out mean |error| of the mean E2E" in result.output
    profile = load_engine_profile(str(out))
    assert profile.name == "mine" and profile.provenance["runs"] == ["vllm-30-2", "vllm-20-1"]
    assert set(profile.provenance["leave_one_run_out"]) == {"vllm-30-2", "vllm-20-1"}
    replay = CliRunner().invoke(app, ["validate", str(a), "--engine", str(out), "--json"])
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.output)["cost_model"]["engine"] == "mine"

"""Closed-loop capacity (pagesim.plan.concurrency) on a system worked out by hand: every step takes
10 ms (the constant cost model), every request is 100 prompt tokens and 10 output tokens, and a step
computes at most 2560 tokens. N clients start together, so their N prompts are prefilled in
ceil(100 N / 2560) prompt-only steps, then decoded together: with N <= 25 every TTFT is one step
(10 ms), every request ends after 10 steps and the N clients send again at once; from N = 26 some
prompt waits a second step (TTFT 20 ms). So with a TTFT p99 SLO of 15 ms, the capacity is
2560 // 100 = 25 clients, delivering 25 requests per 100 ms: 250 req/s."""

from __future__ import annotations

import pytest

from pagesim.plan.concurrency import evaluate_concurrency, max_concurrency
from pagesim.plan.slo import parse_slos
from pagesim.sim.engine import ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest

TRACE = Trace({}, [TraceRequest(100, 10)])
CFG = ReplayConfig(cost_model="constant", num_requests=400, max_num_batched_tokens=2560, rate=1.0)
SLOS = parse_slos("ttft_p99=0.015")


def test_capacity_in_clients_by_hand():
    found = max_concurrency(TRACE, CFG, SLOS, max_clients=256)
    assert found.concurrency == 25 and not found.capped
    assert found.at_capacity.values["ttft_p99"] == pytest.approx(0.01)
    assert found.at_capacity.request_throughput == pytest.approx(250.0)
    assert found.replicas_for(100) == 4 and found.replicas_for(101) == 5
    # the search brackets the knee: 32 failed, and 26 (one prompt too many for a step) too
    assert not next(p for p in found.points if p.concurrency == 26).meets_slos


def test_one_client_too_many_waits_a_step():
    point = evaluate_concurrency(TRACE, CFG, 26, SLOS)
    assert not point.meets_slos and point.values["ttft_p99"] == pytest.approx(0.02)


def test_plan_target_concurrency_writes_the_plan(tmp_path):
    import json

    from typer.testing import CliRunner

    from pagesim.cli import app
    from pagesim.workload.trace import save_trace

    trace = tmp_path / "t.json"
    save_trace(TRACE, trace)
    args = ["plan", "--model", "opt-13b", "--trace", str(trace), "--slo", "ttft_p99=0.015", "--gpus", "a100-40gb",
            "--cost-model", "constant", "--max-num-batched-tokens", "2560", "--num-requests", "400",
            "--out", str(tmp_path / "plan")]
    result = CliRunner().invoke(app, args + ["--target-concurrency", "60"])
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan" / "plan_concurrency.json").read_text())
    (row,) = plan["configurations"]
    assert row["clients_per_replica"] == 25 and row["replicas"] == 3  # ceil(60 / 25), the knee worked out above
    both = CliRunner().invoke(app, args + ["--target-concurrency", "60", "--target-rate", "2"])
    assert both.exit_code == 2 and "one of them" in both.output

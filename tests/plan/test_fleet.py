"""Fleets sized by simulating the cluster (pagesim.plan.fleet) on an M/D/1-like system whose
single-replica answer is computed by hand (as tests/plan/test_steady.py): one request at a time
(max_num_seqs 1), every step STEP_S, every request OUTPUT tokens, so a deterministic service of
S = OUTPUT x STEP_S and a service rate MU = 1 / S = 20 req/s per replica."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.plan import RunSettings, SearchSettings
from pagesim.plan.fleet import FleetShape, parse_fleet, size_fleet
from pagesim.plan.grid import GridPoint
from pagesim.plan.planner import ConfigJob
from pagesim.plan.slo import parse_slos
from pagesim.sim.cost.base import ConstantCostModel
from pagesim.workload.trace import Trace, TraceRequest

STEP_S, OUTPUT = 0.01, 5
SERVICE_S = OUTPUT * STEP_S
MU = 1 / SERVICE_S
TRACE = Trace({"name": "md1"}, [TraceRequest(prompt_len=4, output_len=OUTPUT)])
CONSTANT = ConstantCostModel(STEP_S)
COSTS = {"replicas": CONSTANT, "prefill": CONSTANT, "decode": CONSTANT}
SETTINGS = RunSettings("opt-125m", num_requests=1300, min_duration_s=0.0, max_requests_per_probe=6000)


def job(target: float, slo: str) -> ConfigJob:
    point = GridPoint("a100-40gb", 1, 16, "recompute", 1)
    return ConfigJob(point, SETTINGS, SearchSettings(tolerance=0.03), parse_slos(slo), target, 0.0, TRACE, "md1",
                     None, seeds=1, longer_factor=0)


def test_round_robin_needs_the_ideal_count_never_fewer():
    # no latency SLO binds (tpot p50 <= 100 s): a replica sustains anything below MU, so the ideal
    # is ceil(44 / 20) = 3 replicas; 2 would each get 22 req/s > MU and their queues grow
    target = 2.2 * MU
    ideal = math.ceil(target / MU)
    found = size_fleet(job(target, "tpot_p50=100"), FleetShape("round-robin"), ideal, COSTS)
    assert found.replicas in (ideal, ideal + 1), found.tried
    assert found.tried[ideal - 1] is False and "queue grows" in found.below.violations
    assert found.evaluation.stats["num_finished"] == found.evaluation.stats["num_requests"]
    imb = found.imbalance
    assert imb["requests_max_over_mean"] == pytest.approx(1.0, abs=0.01)  # round-robin deals evenly


def test_least_outstanding_needs_no_more_replicas_than_random():
    # mean TTFT <= one step + 2 S: by Pollaczek-Khinchine (Wq = rho S / (2 (1 - rho))) an M/D/1
    # replica meets it up to rho = 0.8, 16 req/s. Random routing splits Poisson arrivals into
    # independent Poisson streams, so at 50 req/s it needs ceil(50 / 16) = 4 replicas (3 would
    # each run at rho 0.83: mean TTFT 0.135 s > 0.11 s); joining the shortest queue does better.
    target, slo = 50.0, f"ttft_mean={STEP_S + 2 * SERVICE_S}"
    ideal = math.ceil(target / 16)
    rand = size_fleet(job(target, slo), FleetShape("random"), ideal, COSTS)
    least = size_fleet(job(target, slo), FleetShape("least-outstanding"), ideal, COSTS)
    assert rand.replicas == 4, rand.tried
    assert least.replicas is not None and least.replicas <= rand.replicas, (least.tried, rand.tried)


def test_a_pd_fleet_finishes_every_request():
    found = size_fleet(job(10.0, "tpot_p50=100"), FleetShape("round-robin", (1, 1)), 1, COSTS)
    assert found.units == 1 and found.replicas == 2, (found.tried, found.reason)
    stats = found.evaluation.stats
    assert stats["num_finished"] == stats["num_requests"] and stats["num_rejected"] == 0


def test_pd_imbalance_is_judged_within_each_role():
    # one prefill replica serves every request, three decode replicas a third each: across roles
    # that is max / mean 2; within each role round-robin deals evenly (1, up to the remainder)
    found = size_fleet(job(10.0, "tpot_p50=100"), FleetShape("round-robin", (1, 3)), 1, COSTS)
    assert found.replicas == 4 and found.imbalance["requests_max_over_mean"] == pytest.approx(1.0, abs=0.01)
    assert found.evaluation.stats["num_finished"] == found.evaluation.stats["num_requests"]


def test_fleet_flags_parse():
    shapes = parse_fleet("round-robin,random", "none,1:3")
    assert [s.label for s in shapes] == ["round-robin, co-located", "round-robin, P:D 1:3", "random, co-located",
                                         "random, P:D 1:3"]
    assert [s.unit for s in shapes] == [1, 4, 1, 4]


def test_a_fleet_shapes_cluster_spec_carries_its_staleness():
    shapes = parse_fleet("least-outstanding", "none,1:1", 0.5)
    assert [s.label for s in shapes] == ["least-outstanding, co-located, view 0.5 s stale",
                                         "least-outstanding, P:D 1:1, view 0.5 s stale"]
    cfg = SETTINGS.replay_config(job(10.0, "tpot_p50=100").point, 10.0, 100)
    assert [s.spec(cfg, 2).staleness_s for s in shapes] == [0.5, 0.5]
    assert all(s.staleness_s == 0.0 for s in parse_fleet("least-outstanding", "none,1:1"))
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="--staleness"):
            parse_fleet("round-robin", "none", bad)


def routed_replicas(shape: FleetShape) -> list[int]:
    """Each request's replica, by request id, in the shape's 2-replica cluster over four requests:
    r0 at 0 (50 tokens: on its replica until 0.5 s), r1 at 0.01 (2 tokens: ends at 0.03), r2 at
    0.1 and r3 at 0.2 (2 tokens each). Every step 0.01 s."""
    from pagesim.api import replay_config
    from pagesim.cluster.cluster import Cluster

    trace = Trace({}, [TraceRequest(4, out, arrival_time=t) for t, out in ((0.0, 50), (0.01, 2), (0.1, 2), (0.2, 2))])
    cfg = replay_config(rate=0, num_requests=4, model="opt-125m", gpu="a100-40gb", cost_model="constant")
    cluster = Cluster(shape.spec(cfg, 2), trace, cost_models=COSTS)
    result = cluster.run()
    assert result.summary["cluster"]["staleness_s"] == shape.staleness_s
    return [k for _, k in sorted(zip((r.request_id for r in result.requests), result.replica))]


def test_a_stale_view_changes_a_least_outstanding_fleets_choices_by_hand():
    # fresh (read at every decision; ties to the lowest index): r0 -> 0, r1 -> 1; r1 has ended
    # when r2 comes (outstanding 1, 0) -> 1; r2 has ended when r3 comes -> 1.
    assert routed_replicas(FleetShape("least-outstanding")) == [0, 1, 1, 1]
    # a view 1 s stale: r0's arrival refreshes it, and all four, reaching the router within the
    # second, are routed from it: counts 0,0 -> 0; 1,0 -> 1; 1,1 -> 0 (r1's end unseen); 2,1 -> 1
    assert routed_replicas(FleetShape("least-outstanding", staleness_s=1.0)) == [0, 1, 0, 1]
    # round-robin reads no load: the same at any staleness
    assert routed_replicas(FleetShape("round-robin", staleness_s=1.0)) == routed_replicas(FleetShape("round-robin"))


def test_fleet_runs_are_cached_apart_by_staleness(tmp_path):
    from pagesim.plan.cache import RunCache
    from pagesim.plan.fleet import FleetEvaluator

    records = []
    for staleness in (0.0, 0.25, 0.0):
        evaluate = FleetEvaluator(job(10.0, "tpot_p50=100"), FleetShape("least-outstanding", None, staleness), COSTS)
        evaluate.cache = RunCache(tmp_path)
        records.append(evaluate.record(1, 200))
        assert evaluate.num_simulated == (0 if len(records) == 3 else 1)  # the third: the first's cached run
    assert len(list(tmp_path.rglob("*.json"))) == 2


@pytest.mark.parametrize("flags, words", [
    (["--router", "nearest"], "--router: unknown router 'nearest'"),
    (["--pd", "1:0"], "--pd: '1:0' is neither none nor P:D"),
    (["--pd", "two"], "--pd: 'two' is neither none nor P:D"),
    (["--router", ","], "--router: no router given"),
    (["--staleness", "-1"], "--staleness"),
])
def test_malformed_fleet_flags_give_one_line_and_exit_2(flags, words, tmp_path):
    args = ["plan", "--model", "opt-125m", "--trace", "traces/sharegpt.json", "--target-rate", "5", "--slo",
            "ttft_p99=2", "--gpus", "a100-40gb", "--out", str(tmp_path / "p"), *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], result.output
    assert not (tmp_path / "p").exists()


def test_plan_with_a_fleet_reports_it(tmp_path):
    # the M/D/1 system through the command line (cost model `constant`: every step 0.01 s), no
    # latency SLO binding: capacity just below MU = 20 req/s, so 44 req/s needs 3 replicas, and 2
    # (22 req/s each, above MU) cannot keep up. The router's view is 0.5 s stale (round-robin
    # reads no load: the counts do not depend on it; the plan states it)
    from pagesim.workload.trace import save_trace

    trace = tmp_path / "md1.json"
    save_trace(TRACE, trace)
    prices = tmp_path / "prices.json"
    prices.write_text('{"retrieved": "test", "gpus": {"a100-40gb": {"usd_per_gpu_hour": 1.5}}}')
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, [
        "plan", "--model", "opt-125m", "--trace", str(trace), "--target-rate", "44", "--slo", "tpot_p50=100",
        "--gpus", "a100-40gb", "--max-num-seqs", "1", "--cost-model", "constant", "--num-requests", "1300",
        "--max-requests", "6000", "--min-duration", "0", "--tolerance", "0.03", "--jobs", "1", "--no-cache",
        "--seeds", "1", "--check-longer", "0", "--prices", str(prices), "--router", "round-robin", "--staleness", "0.5",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    import json

    plan = json.loads((out / "plan.json").read_text())
    assert "--router round-robin --pd none --staleness 0.5" in plan["command"]
    res = plan["results"][0]
    fleet, = res["fleet"]
    # the trend rule lets the queue grow by less than tolerance x rate: r - MU < 0.03 r, so r < MU / 0.97
    assert 0.85 * MU <= res["capacity"] <= MU / (1 - 0.03)
    assert fleet["ideal_replicas"] == res["replicas"] == 3 and fleet["staleness_s"] == 0.5
    assert fleet["replicas"] in (3, 4) and fleet["tried"]["2"] is False, fleet["tried"]
    assert fleet["cost_per_hour"] == pytest.approx(fleet["replicas"] * 1.5)
    assert fleet["router_cost_per_hour"] == pytest.approx((fleet["replicas"] - 3) * 1.5)
    assert fleet["evaluation"]["sustainable"] and fleet["below"]["sustainable"] is False
    if fleet["replicas"] == 3:
        assert "queue grows" in fleet["below"]["violations"]  # 2 replicas at 22 req/s each, above MU
    assert plan["fleet_recommendation"]["replicas"] == fleet["replicas"]
    md = (out / "report.md").read_text()
    assert "## Fleets simulated as clusters" in md and "round-robin, co-located, view 0.5 s stale" in md
    assert "refreshed every 0.5 s (--staleness)" in md
    assert md.index("## Fleets simulated as clusters") < md.index("## All configurations")
    assert "cheapest simulated fleet" in result.output


def test_fleet_with_closed_loop_clients_is_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["plan", "--model", "opt-125m", "--trace", "traces/sharegpt.json",
                                      "--target-concurrency", "5", "--slo", "ttft_p99=2", "--gpus", "a100-40gb",
                                      "--fleet", "--out", str(tmp_path / "p")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--target-rate (open-loop arrivals), not --target-concurrency" in lines[0], lines

"""Continued fleet probes (pagesim.plan.continued_cluster): one cluster run judged at checkpoints,
against restarted cluster runs where docs/plan.md says the two must agree (servers taking one
request at a time: later arrivals cannot touch the judged requests), against the same cluster
run through without a pause (batching, KV pressure, async output, P/D), and the simulated
arrivals of a probe that extends, counted."""

from __future__ import annotations

import pytest

from pagesim.cluster.cluster import Cluster
from pagesim.plan.continued_cluster import ContinuedCluster
from pagesim.plan.fleet import FleetShape
from pagesim.plan.run import checkpoint_record, probe_steady, run_record
from pagesim.plan.slo import parse_slos
from pagesim.sim.cost.base import ConstantCostModel
from pagesim.sim.engine import ReplayConfig

from tests.plan.test_continued import MIXED, async_cost
from tests.plan.test_steady import MU, STEP_S, TRACE

WARMUP = 0.2
# the fields a checkpoint shares with a restarted run of its n requests when nothing later touches
# them (the KV figures differ: the pool keeps serving later arrivals on the other replicas)
JUDGED = ("num_requests", "num_finished", "num_rejected", "reject_reasons", "num_measured", "window_s",
          "mean_service_s", "trend", "request_throughput", "output_token_throughput", "mean_output_len",
          "num_preemptions", "latencies")


def md1_cfg(rate: float, n: int) -> ReplayConfig:
    return ReplayConfig(model="opt-125m", gpu="a100-40gb", rate=rate, num_requests=n, max_num_seqs=1, seed=0,
                        warmup_s=WARMUP * n / rate)


def md1_costs() -> dict:
    return {name: ConstantCostModel(STEP_S) for name in ("replicas", "prefill", "decode")}


def restarted(shape: FleetShape, units: int, rate: float, n: int) -> dict:
    """A cluster run of exactly n requests, as the fleet driver made them before it continued."""
    cfg = md1_cfg(rate, n)
    result = Cluster(shape.spec(cfg, units), TRACE, keep_steps=False, cost_models=md1_costs()).run()
    return run_record(rate, cfg.warmup_s, result.requests, result.summary)


@pytest.mark.parametrize("router", ["round-robin", "least-outstanding"])
def test_a_checkpoint_of_one_at_a_time_replicas_is_the_restarted_runs_record(router):
    # two M/D/1 replicas at 75 % load: a request once routed is served FCFS, alone, so neither the
    # routing of the first n (decided at their arrivals, before any later one) nor their service
    # can depend on later arrivals
    shape, rate, cap = FleetShape(router), 1.5 * MU, 3000
    run = ContinuedCluster(shape.spec(md1_cfg(rate, cap), 2), TRACE, WARMUP, md1_costs())
    arrivals = [r.arrival_time for r in run.cluster.requests]
    for n in (400, 1000):  # the second continues the first's run
        record = checkpoint_record(rate, run.checkpoint(n))
        assert {k: record[k] for k in JUDGED} == {k: v for k, v in restarted(shape, 2, rate, n).items() if k in JUDGED}
        # what it simulated: the arrivals up to the last judged departure (it pauses just after)
        last = max(r.finish_time for r in run.cluster.records if r.request_id < n)
        assert run.simulated_arrivals() == sum(1 for a in arrivals if a <= last) < cap


def test_a_fleet_probe_that_extends_simulates_its_final_length_once():
    # two replicas behind a random router, each an M/D/1 at 95 %: the trend needs extensions
    shape, rate, cap = FleetShape("random"), 1.9 * MU, 20_000
    slos = parse_slos("tpot_p50=100")
    run = ContinuedCluster(shape.spec(md1_cfg(rate, cap), 2), TRACE, WARMUP, md1_costs())
    continued = probe_steady(lambda n: checkpoint_record(rate, run.checkpoint(n)), 300, cap, slos, 0.02)
    again = probe_steady(lambda n: restarted(shape, 2, rate, n), 300, cap, slos, 0.02)
    assert len(continued.runs) >= 3, continued.runs  # at least two extensions
    assert run.simulated_arrivals() <= 1.01 * continued.runs[-1]  # the last drain lets in a few more
    assert sum(again.runs) >= 1.5 * continued.runs[-1]  # what restarting costs: every length again
    assert (continued.runs, continued.sustainable, continued.steady) == (again.runs, again.sustainable, again.steady)


def batching_cfg(cap: int) -> ReplayConfig:
    return ReplayConfig(model="opt-125m", gpu="a100-40gb", rate=12.0, num_requests=cap, max_num_seqs=8,
                        num_gpu_blocks=40, seed=3)


def async_costs() -> dict:
    return {name: async_cost() for name in ("replicas", "prefill", "decode")}


@pytest.mark.parametrize("shape", [FleetShape("least-outstanding"), FleetShape("round-robin", (1, 1))],
                         ids=["co-located", "pd"])
def test_a_fleet_checkpoint_is_the_uninterrupted_runs_first_requests(shape):
    cap, n = 900, 500
    run = ContinuedCluster(shape.spec(batching_cfg(cap), 2 if shape.pd is None else 1), MIXED, WARMUP, async_costs())
    for earlier in (120, 250):  # pauses before: they must change nothing
        run.checkpoint(earlier)
    checkpoint = run.checkpoint(n)
    record = checkpoint_record(12.0, checkpoint)
    direct = ContinuedCluster(shape.spec(batching_cfg(cap), 2 if shape.pd is None else 1), MIXED, WARMUP,
                              async_costs())
    assert checkpoint_record(12.0, direct.checkpoint(n)) == record
    # brute force: the same cluster run through without a pause; its records as its clients saw them
    full = Cluster(shape.spec(batching_cfg(cap), 2 if shape.pd is None else 1), MIXED, keep_steps=True,
                   cost_models=async_costs()).run()
    judged = [r for r in full.requests if r.request_id < n]
    assert len(judged) == n and sum(r.num_preemptions for r in judged) > 0  # KV pressure: the pool is shared
    warmup = WARMUP * n / 12.0
    measured = sorted((r for r in judged if r.arrival_time >= warmup), key=lambda r: r.request_id)
    assert record["latencies"]["ttft"] == [r.ttft for r in measured]  # delivered a step late, as the full run's
    assert record["latencies"]["e2e"] == [r.e2e_latency for r in measured]
    assert record["num_preemptions"] == sum(r.num_preemptions for r in judged)
    # each replica's share of the judged requests (under P/D both stages count one each)
    served = checkpoint.summary["cluster"]["requests_per_replica"]
    by_replica = [k for r, k in zip(full.requests, full.replica) if r.request_id < n]
    assert served[0] == by_replica.count(0) and sum(served) == n * (1 if shape.pd is None else 2)

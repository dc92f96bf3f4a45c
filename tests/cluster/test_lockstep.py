"""Data-parallel ranks in lockstep (pagesim.cluster.lockstep) against a timeline worked out by
hand, and vLLM's DP balancer (dp-balance) against a hand-computed choice sequence."""

from __future__ import annotations

import pytest

from pagesim.api import replay_config
from pagesim.cluster.cluster import Cluster
from pagesim.cluster.lockstep import LockstepGroup
from pagesim.cluster.routers import ReplicaLoad, RoutedRequest, make_router
from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
from pagesim.sim.cost.base import CostModel
from tests.cluster.test_cluster import trace_of


class PrefillPriced(CostModel):
    """0.01 s a step plus 1 ms per prompt token computed."""

    name = "prefill-priced"

    def iteration_time(self, shape) -> float:
        return 0.01 + 0.001 * shape.num_prefill_tokens


def run(lockstep: bool):
    trace = trace_of((0.0, 50, 3), (0.001, 10, 3))
    cfg = replay_config(rate=0, num_requests=2, cost_model="constant")
    spec = ClusterSpec([ReplicaGroup("g", cfg, 2)], lockstep=lockstep)
    result = Cluster(spec, trace, cost_models={"g": PrefillPriced()}).run()
    return {r.request_id: (k, r.first_token_time, r.finish_time) for r, k in zip(result.requests, result.replica)}


def test_ranks_step_together_by_hand():
    # round-robin: request 0 (prompt 50) on rank 0, request 1 (prompt 10) on rank 1.
    # rank 0 [0, 0.06]: its prefill, 0.01 + 0.05.
    # rank 1 from 0.001: own 0.02, but rank 0's 0.06 step is in progress: [0.001, 0.061].
    # rank 0 from 0.06: a decode (own 0.01), rank 1's step (own 0.02) in progress: [0.06, 0.08].
    # rank 1 from 0.061: own 0.01, rank 0's step in progress is own 0.01: [0.061, 0.071], then
    #   [0.071, 0.081]: its third token. rank 0 from 0.08: [0.08, 0.09], its third token.
    assert run(lockstep=True) == {0: (0, pytest.approx(0.06), pytest.approx(0.09)),
                                  1: (1, pytest.approx(0.061), pytest.approx(0.081))}
    # apart, rank 1 does not wait for rank 0's long prefill
    assert run(lockstep=False) == {0: (0, pytest.approx(0.06), pytest.approx(0.08)),
                                   1: (1, pytest.approx(0.021), pytest.approx(0.041))}


def test_a_step_waits_only_for_steps_in_progress_at_its_start():
    group = LockstepGroup(3)
    assert group.step(0, 0.0, 0.5) == 0.5
    assert group.step(1, 0.1, 0.2) == 0.5  # rank 0's 0.5 s step is in progress
    assert group.step(2, 0.5, 0.1) == 0.2  # rank 0's ended at 0.5; rank 1's own 0.2 (not its 0.5) counts
    assert group.step(0, 0.7, 0.1) == 0.1  # nothing else in progress


def test_dp_balance_picks_least_waiting_times_four_plus_running():
    router = make_router("dp-balance")
    loads = [ReplicaLoad(0, waiting=1, running=0, info_time=0.0), ReplicaLoad(1, waiting=0, running=3, info_time=0.0)]
    request = RoutedRequest(0, 10)
    assert router.choose(request, loads, 0.0) == 1  # scores 4 and 3
    # until the counts are read again, the choice counts as one more waiting on replica 1: 4 vs 7
    assert router.choose(request, loads, 0.0) == 0
    # 8 vs 7
    assert router.choose(request, loads, 0.0) == 1
    for load in loads:
        load.info_time = 0.1  # a fresh read: the local additions are dropped
    assert router.choose(request, loads, 0.1) == 1
    loads[1].running = 4  # equal scores (4, 4): the first in order
    loads[1].info_time = loads[0].info_time = 0.2
    assert router.choose(request, loads, 0.2) == 0

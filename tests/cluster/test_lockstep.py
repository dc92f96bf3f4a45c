"""Data-parallel ranks in lockstep (pagesim.cluster.lockstep) against a timeline worked out by
hand, and vLLM's DP balancer (dp-balance) against a hand-computed choice sequence."""

from __future__ import annotations

import os
from pathlib import Path

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


# the real DP 2 / EP 2 run (../shared/data/real_vllm, or $PAGESIM_DATA_DIR)
ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PAGESIM_DATA_DIR", ROOT.parent / "shared" / "data"))
QWEN_MOE = DATA / "real_vllm" / "llmservingsim-vllm0.19" / "RTXPRO6000" / "Qwen3-30B-A3B-Instruct-2507"


@pytest.mark.skipif(not QWEN_MOE.is_dir(), reason=f"the real Qwen3-30B-A3B DP run is not at {QWEN_MOE}")
def test_validate_replays_every_rank_of_a_data_parallel_run():
    from pagesim.realruns import load_real_run
    from pagesim.validate import validate

    real = load_real_run(QWEN_MOE)
    assert real.server.data_parallel_size == 2
    v = validate(real, gpu="rtx-pro-6000-96gb", keep_steps=False)
    assert v.counts["requests"] == len(real.requests)  # all of them, not every 2nd
    assert v.counts["compared"] == sum(r.ok for r in real.requests)
    assert "2 ranks replayed, stepping in lockstep" in v.notes[0]
    assert v.replay.summary["cluster"]["num_replicas"] == 2
    assert all(n > 0 for n in v.replay.summary["cluster"]["requests_per_replica"])  # both ranks served


def test_lockstep_on_the_command_line_and_in_a_cluster_file(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pagesim.cli import app

    monkeypatch.chdir(ROOT)
    args = ["replay", "traces/sharegpt.json", "--num-requests", "40", "--rate", "20", "--model", "qwen3-30b-a3b",
            "--gpu", "h100-80gb", "--ep", "2", "--router", "dp-balance"]
    result = CliRunner().invoke(app, [*args, "--replicas", "2", "--lockstep", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "--lockstep --out" in result.output  # the reproduce line keeps the flag
    file = tmp_path / "c.toml"
    file.write_text('lockstep = true\n[[groups]]\nname = "a"\n[[groups]]\nname = "b"\n')
    bad = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--num-requests", "5", "--cluster", str(file)])
    assert bad.exit_code == 2 and f"{file}: lockstep: one group of mixed replicas" in bad.output

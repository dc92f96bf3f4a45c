"""The autoscaled cluster (pagesim.cluster.fleet) against a timeline worked out by hand on the
constant cost model (every step 0.01 s), and --autoscale / [autoscale] errors naming the key."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagesim.api import replay_config
from pagesim.cli import app
from pagesim.cluster.autoscale import AutoscalePolicy, parse_autoscale
from pagesim.cluster.cluster import Cluster
from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
from tests.cluster.test_cluster import ROOT, trace_of

# Requests 0-5 at t = 0.001 k, 6 at 1.5, 7 at 2.2, 8 at 2.25, 9 at 2.9, 10 at 2.91, 11 at 3.1;
# each prompt 10, output 30: with max_num_seqs=1 a request holds its replica for 30 steps, 0.3 s.
ARRIVALS = [0.0, 0.001, 0.002, 0.003, 0.004, 0.005, 1.5, 2.2, 2.25, 2.9, 2.91, 3.1]
POLICY = AutoscalePolicy(metric="queue", up_at=1.5, down_at=0.5, min_replicas=1, max_replicas=2, interval_s=1.0,
                         startup_s=0.75, cooldown_s=1.0)


def run_fleet(policy=POLICY, initial=1):
    trace = trace_of(*[(t, 10, 30) for t in ARRIVALS])
    cfg = replay_config(rate=0, num_requests=len(trace), cost_model="constant", max_num_seqs=1)
    return Cluster(ClusterSpec([ReplicaGroup("g", cfg, initial)], autoscale=policy), trace).run()


def test_scale_up_and_down_timeline_by_hand():
    # Replica 0 alone serves requests 0-5 back to back: they end at 0.3, 0.6, ..., 1.8.
    # t=1.0: 3 is running, 4 and 5 wait: 2 waiting per serving replica > 1.5: replica 1 is asked
    #   for (its GPU held from now), serving from 1.75. Request 6 (1.5) still goes to replica 0
    #   (replica 1 is starting): it runs [1.8, 2.1].
    # t=2.0: nothing waits (0 < 0.5) but the cool-down (1 s) runs from when replica 1 began
    #   serving (1.75), not from the ask (1.0): no change until 2.75.
    # Round-robin: 7 (2.2) -> replica 1 [2.2, 2.5], 8 (2.25) -> 0 [2.25, 2.55],
    #   9 (2.9) -> 1 [2.9, 3.2], 10 (2.91) -> 0 [2.91, 3.21].
    # t=3.0: nothing waits: one fewer. Both have 1 outstanding: the higher index, replica 1, drains:
    #   it takes nothing more (11 at 3.1 goes to replica 0, [3.21, 3.51]) and is released when 9
    #   ends at 3.2. The run ends at 3.51.
    result = run_fleet()
    by_id = {r.request_id: (r, k) for r, k in zip(result.requests, result.replica)}
    assert sorted(by_id) == list(range(12))  # every request once
    assert all(r.status == "finished" for r, _ in by_id.values())
    expect_replica = [0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0]
    assert [by_id[i][1] for i in range(12)] == expect_replica
    expect_finish = [0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.5, 2.55, 3.2, 3.21, 3.51]
    assert [by_id[i][0].finish_time for i in range(12)] == pytest.approx(expect_finish, abs=1e-9)
    events = [(round(t, 9), k, event, serving, held) for t, k, event, serving, held in result.cluster.fleet.events]
    assert events == [(0.0, 0, "serving", 1, 1), (1.0, 1, "asked", 1, 2), (1.75, 1, "serving", 2, 2),
                      (3.0, 1, "draining", 1, 2), (3.2, 1, "released", 1, 1)]
    section = result.summary["autoscale"]
    # replica 0 held 0 -> 3.51, replica 1 from its request (1.0) until drained (3.2); one GPU each
    assert section["gpu_hours"] == pytest.approx((3.51 + 2.2) / 3600)
    assert [d["change"] for d in section["decisions"]] == [1, -1]
    # serving: 1 replica for 1.75 s, 2 for 1.25 s, 1 for 0.51 s, over 3.51 s
    assert section["mean_serving_replicas"] == pytest.approx((1.75 + 2 * 1.25 + 0.51) / 3.51)


def test_a_fleet_that_never_scales_matches_a_fixed_one():
    # up_at beyond any queue, down_at below zero: the fleet stays at its 2 replicas, as --replicas 2
    still = AutoscalePolicy(up_at=1e9, down_at=-1.0, min_replicas=1, max_replicas=3)
    scaled = run_fleet(still, initial=2)
    trace = trace_of(*[(t, 10, 30) for t in ARRIVALS])
    cfg = replay_config(rate=0, num_requests=len(trace), cost_model="constant", max_num_seqs=1)
    fixed = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 2)]), trace).run()
    assert list(scaled.replica) == list(fixed.replica)
    assert [r.finish_time for r in scaled.requests] == [r.finish_time for r in fixed.requests]
    assert scaled.summary["autoscale"]["gpu_hours"] == pytest.approx(2 * fixed.cluster.end_time / 3600)


@pytest.mark.parametrize("text, problem", [
    ("metric=queue,up=4", "unknown key 'up'"), ("max=two", "max: a whole number"), ("min=3,max=2", "min_replicas"),
    ("startup", "not KEY=VALUE"), ("up_at=inf", "up_at: a finite number"), ("min=1,min=2", "min given twice")])
def test_bad_autoscale_flags_name_the_key(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_autoscale(text)


def test_the_flag_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = ["replay", "traces/sharegpt.json", "--num-requests", "60", "--rate", "20", "--cost-model", "constant"]
    result = CliRunner().invoke(app, [*args, "--autoscale", "min=1,max=3,up_at=2,interval=0.5,startup=1,cooldown=1",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_finished"] == 60 and summary["autoscale"]["peak_held_replicas"] <= 3
    assert (tmp_path / "run" / "fleet.csv").read_text().startswith("time,replica,event,serving,held\n")
    # the title says the fleet's range, and that the KV blocks shown are those of all max=3 replicas
    one = CliRunner().invoke(app, [*args, "--json"])
    assert summary["num_kv_blocks"] == 3 * json.loads(one.output)["num_kv_blocks"]
    assert "cluster 1 x mixed autoscaled to 1-3, KV pool at 3" in " ".join(result.output.split())
    bad = CliRunner().invoke(app, [*args, "--autoscale", "max=0"])
    assert bad.exit_code == 2 and "--autoscale" in bad.output and "min_replicas" in bad.output


def test_cluster_file_autoscale_section(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    file = tmp_path / "c.toml"
    file.write_text('[autoscale]\nmax = 2\nstartup = "soon"\n\n[[groups]]\nname = "g"\n')
    result = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--num-requests", "5", "--cluster", str(file)])
    assert result.exit_code == 2 and f"{file}: autoscale: startup: a number" in result.output

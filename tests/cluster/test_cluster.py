"""The simulated cluster (pagesim.cluster.cluster) against references worked out here: a
one-replica cluster against today's single replay byte for byte, round-robin timelines by hand,
every request finished exactly once, and a router that reads no load deciding the same at any
staleness."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.api import replay_config
from pagesim.cli import app
from pagesim.cluster.cluster import Cluster
from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
from pagesim.workload.trace import Trace, TraceRequest, load_trace

ROOT = Path(__file__).resolve().parents[2]
STEP = 0.01  # the constant cost model's step


def trace_of(*requests: tuple[float, int, int]) -> Trace:
    """(arrival time, prompt length, output length) per request."""
    return Trace({}, [TraceRequest(prompt_len=p, output_len=o, arrival_time=t) for t, p, o in requests])


def run(trace: Trace, count: int, staleness: float = 0.0, **options):
    cfg = replay_config(rate=0, num_requests=len(trace), cost_model="constant", **options)
    return Cluster(ClusterSpec([ReplicaGroup("g", cfg, count)], staleness_s=staleness), trace).run()


REFERENCE_REPLAYS = [
    ["traces/sharegpt.json", "--num-requests", "200", "--rate", "4"],
    ["traces/sharegpt.json", "--num-requests", "200", "--rate", "8", "--model", "llama-2-7b", "--gpu", "a100-80gb",
     "--chunked-prefill"],
    ["traces/sharegpt_chat.json", "--num-requests", "150", "--rate", "4", "--model", "llama-2-7b", "--gpu", "a100-80gb",
     "--prefix-caching"],
    ["traces/alpaca.json", "--num-requests", "200", "--rate", "20", "--policy", "orca-oracle"],
]


@pytest.mark.parametrize("args", REFERENCE_REPLAYS)
def test_one_replica_cluster_writes_the_single_replays_files(args, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    plain, cluster = tmp_path / "plain", tmp_path / "cluster"
    for out, extra in ((plain, []), (cluster, ["--replicas", "1"])):
        result = CliRunner().invoke(app, ["replay", *args, *extra, "--out", str(out)])
        assert result.exit_code == 0, result.output
    assert (cluster / "steps_replica0.csv").read_bytes() == (plain / "steps.csv").read_bytes()
    # requests.csv: the single replay's columns, then replica and decode_replica
    rows = list(csv.reader(io.StringIO((cluster / "requests.csv").read_text())))
    assert rows[0][-2:] == ["replica", "decode_replica"]
    assert all(row[-2:] == ["0", ""] for row in rows[1:])
    stripped = io.StringIO()
    csv.writer(stripped, lineterminator="\n").writerows(row[:-2] for row in rows)
    assert stripped.getvalue() == (plain / "requests.csv").read_text()
    a, b = (json.loads((out / "summary.json").read_text()) for out in (plain, cluster))
    section = b.pop("cluster")
    assert section["num_replicas"] == 1 and section["requests_per_replica"] == [a["num_requests"]]
    a.pop("reproduce"), b.pop("reproduce")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_round_robin_timeline_by_hand():
    # Four requests (prompt 10, output 3) at 0, 0.001, 0.002, 0.003: round-robin sends them to
    # replicas 0, 1, 0, 1. On replica 0, request 0 prefills in [0, 0.01]; request 2 arrives
    # during that step and prefills in [0.01, 0.02] (a prefill step of its own: prompts go first,
    # request 0 waits), then both decode together: [0.02, 0.03] gives each its second token,
    # [0.03, 0.04] its third (both done at 0.04). Replica 1 is the same 0.001 later.
    trace = trace_of((0.0, 10, 3), (0.001, 10, 3), (0.002, 10, 3), (0.003, 10, 3))
    result = run(trace, 2)
    by_id = {r.request_id: (r, k) for r, k in zip(result.requests, result.replica)}
    assert [by_id[i][1] for i in range(4)] == [0, 1, 0, 1]
    expect = {0: (0.01, 0.04), 1: (0.011, 0.041), 2: (0.02, 0.04), 3: (0.021, 0.041)}
    for rid, (first, finish) in expect.items():
        record = by_id[rid][0]
        assert record.first_token_time == pytest.approx(first)
        assert record.finish_time == pytest.approx(finish)
    assert result.summary["cluster"]["requests_per_replica"] == [2, 2]
    assert result.summary["num_steps"] == 8  # 4 steps on each replica


def test_every_request_finishes_exactly_once_on_the_replica_it_was_sent_to():
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    cfg = replay_config(rate=16.0, num_requests=400)
    result = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 4)]), trace).run()
    ids = [r.request_id for r in result.requests]
    assert sorted(ids) == list(range(400))
    for k, replica in enumerate(result.results):
        mine = {r.request_id for r in replica.metrics.requests}
        assert mine == {rid for rid, at in zip(ids, result.replica) if at == k}
        assert mine == {rid for rid in range(400) if rid % 4 == k}  # round-robin in arrival order
    assert result.summary["num_finished"] == 400
    imbalance = result.summary["cluster"]["imbalance"]
    assert imbalance["requests_max_over_mean"] == 1.0 and imbalance["requests_cv"] == 0.0


def test_a_router_that_reads_no_load_decides_the_same_at_any_staleness():
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    cfg = replay_config(rate=12.0, num_requests=300)
    runs = [Cluster(ClusterSpec([ReplicaGroup("g", cfg, 3)], staleness_s=s), trace).run() for s in (0.0, 0.5, 30.0)]
    reference = runs[0]
    for other in runs[1:]:
        assert list(other.replica) == list(reference.replica)
        assert [r.request_id for r in other.requests] == [r.request_id for r in reference.requests]
        assert [r.finish_time for r in other.requests] == [r.finish_time for r in reference.requests]


def test_replicas_may_differ():
    # one fast and one slow group: the same requests, round-robin, each group on its own hardware
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    fast = replay_config(rate=4.0, num_requests=100, model="llama-2-7b", gpu="h100-80gb")
    slow = replay_config(rate=4.0, num_requests=100, model="llama-2-7b", gpu="a100-40gb")
    result = Cluster(ClusterSpec([ReplicaGroup("fast", fast), ReplicaGroup("slow", slow)]), trace).run()
    s0, s1 = (r.summary for r in result.results)
    assert s0["num_requests"] == s1["num_requests"] == 50
    assert s0["tpot_mean"] < s1["tpot_mean"]  # the H100 decodes faster
    assert result.summary["num_kv_blocks"] == s0["num_kv_blocks"] + s1["num_kv_blocks"]


def test_a_cluster_run_is_re_created_from_its_summary_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = ["replay", "traces/sharegpt.json", "--num-requests", "120", "--rate", "6", "--pd", "1:2"]
    first, again = tmp_path / "first", tmp_path / "again"
    assert CliRunner().invoke(app, [*args, "--out", str(first)]).exit_code == 0
    result = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--config", str(first / "summary.json"),
                                      "--pd", "1:2", "--out", str(again)])
    assert result.exit_code == 0, result.output
    for name in ("summary.json", "requests.csv", "replicas.csv", "steps_replica2.csv"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name


def test_a_replica_with_a_longer_host_time_receives_its_requests_that_much_later():
    # engine profiles paper (no host time per request) and vllm-0.19 (4.5 ms): the router sees a
    # request at its arrival (the smaller host time), the vllm-0.19 replica takes it 4.5 ms later
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    groups = [ReplicaGroup(engine, replay_config(rate=2.0, num_requests=40, engine=engine))
              for engine in ("paper", "vllm-0.19")]
    cluster = Cluster(ClusterSpec(groups), trace)
    result = cluster.run()
    host = cluster.replicas[1].sim.request_host_s
    assert cluster.replicas[0].sim.request_host_s == 0.0 and host > 0.004
    waits = {k: [r.first_scheduled_time - r.arrival_time for r in result.results[k].metrics.requests] for k in (0, 1)}
    assert min(waits[1]) >= host - 1e-12
    assert min(waits[0]) == 0.0  # an idle replica starts a request the moment it arrives
    assert sorted(r.request_id for r in result.requests) == list(range(40))

"""Replicas replayed apart (pagesim.cluster.independent) against the same cluster on one clock
(Cluster(independent=False), the simulation every router runs on): the same files byte for byte,
in one process and in two; the one clock's order of requests leaving at one instant; and the
clusters that must stay on one clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.api import replay_config
from pagesim.cli import app
from pagesim.cluster.autoscale import AutoscalePolicy
from pagesim.cluster.cluster import Cluster
from pagesim.cluster.independent import _route_all, worker_count
from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
from pagesim.workload.trace import load_trace
from tests.cluster.test_cluster import ROOT, trace_of
from tests.sim.runs_taken import runs_taken

SHAREGPT = load_trace(ROOT / "traces" / "sharegpt.json")
CHAT = load_trace(ROOT / "traces" / "sharegpt_chat.json")
H100 = dict(model="llama-2-7b", gpu="h100-80gb")

CASES = {
    # async output (vllm-0.19 delivers tokens a step late), chunked prefill, clients giving up
    "round-robin": (SHAREGPT, [("g", dict(rate=24.0, num_requests=400, chunked_prefill=True, engine="vllm-0.19",
                                          client_timeout_s=6.0, **H100), 4)], "round-robin", 0.0),
    # prefix caching on a chat trace, a stale view (decides the same), swap preemption on a small pool
    "random": (CHAT, [("g", dict(rate=12.0, num_requests=300, prefix_caching=True, preemption="swap",
                                 num_gpu_blocks=400, **H100), 3)], "random", 5.0),
    # two groups on different hardware: different host times per request, so different entry times
    "two groups": (SHAREGPT, [("a", dict(rate=10.0, num_requests=300), 2),
                              ("b", dict(rate=10.0, num_requests=300, engine="vllm-0.15", **H100), 1)],
                   "round-robin", 0.0),
    # more replicas than requests: two replicas never get one
    "idle replicas": (SHAREGPT, [("g", dict(rate=4.0, num_requests=3), 5)], "round-robin", 0.0),
}


def spec_of(groups, router: str, staleness: float) -> ClusterSpec:
    return ClusterSpec([ReplicaGroup(name, replay_config(**options), count) for name, options, count in groups],
                       router, {}, staleness)


def files_of(cluster: Cluster, out: Path, jobs: int | None = None) -> dict[str, bytes]:
    result = cluster.run(jobs=jobs)
    out.mkdir()
    result.write(out, result.summary)
    return {path.name: path.read_bytes() for path in sorted(out.iterdir())}


@pytest.mark.parametrize("case", CASES)
def test_replicas_apart_write_the_one_clocks_files(case, tmp_path):
    trace, groups, router, staleness = CASES[case]
    together = Cluster(spec_of(groups, router, staleness), trace, independent=False)
    assert not together.independent and together.coupled_by is None
    expected = files_of(together, tmp_path / "together")
    assert len(expected) == 3 + sum(count for _, _, count in groups)  # requests, replicas, summary, steps each
    for jobs in (1, 2):
        apart = Cluster(spec_of(groups, router, staleness), trace)
        assert apart.independent
        files = files_of(apart, tmp_path / f"apart{jobs}", jobs)
        assert files.keys() == expected.keys()
        for name in expected:
            assert files[name] == expected[name], f"{case}, {jobs} process(es): {name} differs"


def test_replicas_apart_take_runs_past_finishes(monkeypatch):
    """Apart, a replica's ends reach nobody (the router reads no load): its decode runs go on past
    the steps in which groups finish (plan_decode's absorb_finishes), where the one clock stops
    at each; the test above holds the files to the one clock's."""
    runs = runs_taken(monkeypatch)
    trace, groups, router, staleness = CASES["two groups"]
    Cluster(spec_of(groups, router, staleness), trace, independent=False).run()
    assert not any(run.finishes for run in runs)
    runs.clear()
    Cluster(spec_of(groups, router, staleness), trace).run(jobs=1)
    assert sum(len(run.finishes or ()) for run in runs) >= 20


def test_requests_leaving_at_one_instant_are_kept_by_replica():
    # six requests at once, round-robin over three replicas; those of 10,000 tokens do not fit
    # (max_model_len 2,048) and are turned away as they enter, all at t = 0: the router sent them
    # to replicas 0, 1, 2, 0, 1, 2, which is the order the one clock records them in; both runs
    # keep them by replica, and the two that fit finish later
    trace = trace_of(*[(0.0, 10_000 if k % 3 else 10, 5) for k in range(6)])
    cfg = replay_config(rate=0, num_requests=6, cost_model="constant", max_model_len=2048)
    for independent in (False, True):
        result = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 3)]), trace, independent=independent).run(jobs=1)
        rejected = [(r.request_id, replica) for r, replica in zip(result.requests, result.replica)
                    if r.status == "rejected"]
        assert rejected == [(1, 1), (4, 1), (2, 2), (5, 2)]
        assert [r.request_id for r in result.requests if r.status == "finished"] == [0, 3]


def test_a_cluster_replayed_apart_builds_no_request_before_it_is_replayed():
    """Apart, the cluster keeps the workload as arrival times (pagesim.workload.requests.Workload),
    each request built where it is routed and replayed: the same requests as the trace's records
    (cycled) at the arrival process's times, built anew at each ask; on one clock, built once."""
    from pagesim.core import Request
    from pagesim.workload.arrivals import poisson_arrivals
    from pagesim.workload.requests import Workload

    cfg = replay_config(rate=6.0, num_requests=len(CHAT) + 7, seed=3)
    apart = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 2)]), CHAT)
    together = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 2)]), CHAT, independent=False)
    assert isinstance(apart.requests, Workload) and type(together.requests) is list
    assert apart.requests[5] is not apart.requests[5]
    times = poisson_arrivals(6.0, count=len(CHAT) + 7, seed=3)
    for i, (request, built) in enumerate(zip(apart.requests, together.requests)):
        record = CHAT.requests[i % len(CHAT)]
        assert isinstance(request, Request)
        assert (request.request_id, request.arrival_time, request.prompt_len, request.sampling.max_tokens,
                request.prompt_token_ids) == (i, times[i], record.prompt_len, record.output_len, record.prompt_token_ids)
        assert request == built
    assert len(apart.requests) == len(together.requests) == len(times)


@pytest.mark.parametrize("case", CASES)
def test_routing_from_trace_records_routes_as_the_built_requests_do(case):
    """_route_all reads each request's arrival time and trace record, building none: the same
    replicas and entry times as Cluster.place given every request built (a twin cluster's router)."""
    trace, groups, router, staleness = CASES[case]
    cluster, twin = (Cluster(spec_of(groups, router, staleness), trace) for _ in range(2))
    routed = _route_all(cluster)
    assert cluster.feed.exhausted
    expected = [([], []) for _ in twin.replicas]
    for index, request in enumerate(twin.requests):
        replica, entering, at = twin.place(request, request.arrival_time + twin.host_s)
        assert entering is request
        expected[replica.index][0].append(at)
        expected[replica.index][1].append(index)
    assert [(times.tolist(), indices.tolist()) for times, indices in routed] == expected
    assert sum(len(indices) for _, indices in expected) == len(twin.requests) > 0


@pytest.mark.parametrize("router, options, why", [
    ("least-outstanding", {}, "router least-outstanding reads their loads"),
    ("round-robin", {"concurrency": 4}, "sessions or a closed loop"),
])
def test_clusters_whose_replicas_meet_stay_on_one_clock(router, options, why):
    cfg = replay_config(rate=4.0, num_requests=20, **options)
    cluster = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 2)], router), SHAREGPT)
    assert not cluster.independent and why in cluster.coupled_by


def test_pd_and_autoscaled_clusters_stay_on_one_clock():
    cfg = replay_config(rate=4.0, num_requests=20, **H100)
    pd = Cluster(ClusterSpec([ReplicaGroup("p", cfg, 1, "prefill"), ReplicaGroup("d", cfg, 1, "decode")]), SHAREGPT)
    assert not pd.independent and "P/D" in pd.coupled_by
    scaled = Cluster(ClusterSpec([ReplicaGroup("g", cfg, 1)], autoscale=AutoscalePolicy(min_replicas=1, max_replicas=2)),
                     SHAREGPT)
    assert not scaled.independent and "autoscaling" in scaled.coupled_by


def test_worker_count():
    cpus = len(os.sched_getaffinity(0))
    assert worker_count(None, 64) == min(cpus, 64)
    assert worker_count(8, 3) == 3
    assert worker_count(2, 16) == 2


def test_jobs_flag(monkeypatch):
    monkeypatch.chdir(ROOT)
    alone = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--num-requests", "20", "--jobs", "2"])
    assert alone.exit_code == 2 and "--jobs" in alone.output and "--replicas" in alone.output
    coupled = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--num-requests", "40", "--replicas", "2",
                                       "--router", "least-outstanding", "--jobs", "2", "--json"])
    assert coupled.exit_code == 0, coupled.output
    assert "reads their loads" in coupled.output and "one process" in coupled.output


def test_a_replicas_records_outlive_the_cluster_result():
    """Replayed apart, the records are read from files (pagesim.cluster.spill): a replica's own
    records stay readable, in its order, however long they are kept after the rest is let go."""
    import gc

    trace, groups, router, staleness = CASES["two groups"]
    together = Cluster(spec_of(groups, router, staleness), trace, independent=False).run()
    expected = [list(r.metrics.requests) for r in together.results]
    summaries = [r.metrics.summary() for r in together.results]
    result = Cluster(spec_of(groups, router, staleness), trace).run(jobs=2)
    merged = list(result.requests)
    parts = [r.metrics for r in result.results]
    del result
    gc.collect()
    assert [[r.request_id for r in m.requests] for m in parts] == [[r.request_id for r in e] for e in expected]
    assert [r.request_id for r in merged] == [r.request_id for r in together.requests]
    # (its summary from its files: its records and its token gaps)
    assert [m.summary() for m in parts] == summaries and parts[0].span_tally.count > 0


_BROKEN_RESULT = """
import sys
from pagesim.cluster import independent


def fail():
    raise RuntimeError("this result cannot be rebuilt")


class Broken:
    def __reduce__(self):
        return fail, ()


independent._spilled = lambda index, replayed, folder: Broken()  # (inherited by the forked workers)
from pagesim.cli import main
sys.argv = ["pagesim", "replay", "traces/sharegpt.json", "--num-requests", "40", "--rate", "8", "--replicas", "2",
            "--jobs", "2", "--json"]
main()
"""


def test_a_worker_result_that_cannot_be_unpickled_fails_the_replay_instead_of_hanging():
    # (multiprocessing's own unpickling of a result ends the pool's result thread, and the parent
    # waited for ever: a compiled class without __reduce__ did that once)
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _BROKEN_RESULT], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode != 0
    assert "this result cannot be rebuilt" in proc.stderr, proc.stderr[-2000:]

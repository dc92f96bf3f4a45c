"""Sessions and closed-loop clients in the simulated cluster (pagesim.cluster.cluster): one feed
for the cluster, turn k + 1 released when turn k ends on whichever replica. Against a timeline
worked out by hand (constant cost model, every step STEP seconds), and against the same cluster
stepping one step at a time (fast_forward=False), which cannot miss a release."""

from __future__ import annotations

import random

import pytest

from pagesim.cluster.cluster import Cluster
from pagesim.cluster.spec import ClusterSpec, ReplicaGroup
from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest

STEP = 0.01


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def two_sessions() -> Trace:
    """A: turn 0 at 0 (10 + 3 tokens), turn 1 0.5 s after it ends (10 + 3 + 4 new, output 2).
    B: turn 0 at 0.015 (5 + 2 tokens), turn 1 0.1 s after it ends (5 + 2 + 3 new, output 1).
    B1 is released before A1, so round-robin sends each second turn to the other replica."""
    a0, b0 = ids(100, 10), ids(200, 5)
    return Trace({}, [
        TraceRequest(10, 3, arrival_time=0.0, session_id="A", turn=0, prompt_token_ids=a0),
        TraceRequest(5, 2, arrival_time=0.015, session_id="B", turn=0, prompt_token_ids=b0),
        TraceRequest(17, 2, arrival_time=0.2, session_id="A", turn=1, think_time=0.5,
                     prompt_token_ids=a0 + ids(900, 3) + ids(300, 4)),
        TraceRequest(10, 1, arrival_time=0.3, session_id="B", turn=1, think_time=0.1,
                     prompt_token_ids=b0 + ids(950, 2) + ids(400, 3)),
    ])


def run_cluster(trace: Trace, replicas: int, router: str, params=None, fast: bool = True, **options):
    cfg = ReplayConfig(**{"rate": None, "num_requests": len(trace), "block_size": 4, **options})
    spec = ClusterSpec([ReplicaGroup("g", cfg, replicas)], router, params or {})
    cluster = Cluster(spec, trace, cost_models={"g": ConstantCostModel(STEP)}, fast_forward=fast)
    cluster.run()
    return {r.request_id: (r, k) for r, k in zip(cluster.records, cluster.record_replica)}


@pytest.mark.parametrize("fast", [True, False])
def test_session_affinity_keeps_a_sessions_turns_on_one_replica_by_hand(fast):
    # fallback round-robin: A0 -> 0, B0 -> 1; then each later turn follows its session.
    # replica 0: A0 prefill [0, .01] (first token), decode .02, .03: ends .03;
    #            A1 sent .03 + .5 = .53: prefill [.53, .54], decode [.54, .55]
    # replica 1: B0 prefill [.015, .025], decode [.025, .035]; B1 sent .035 + .1 = .135: [.135, .145]
    records = run_cluster(two_sessions(), 2, "session-affinity", {"fallback": "round-robin"}, fast,
                          prefix_caching=True)
    expected = {0: (0, 0.0, 0.01, 0.03), 1: (1, 0.015, 0.025, 0.035), 2: (0, 0.53, 0.54, 0.55),
                3: (1, 0.135, 0.145, 0.145)}
    for rid, (replica, sent, first, end) in expected.items():
        r, k = records[rid]
        assert r.status == "finished" and k == replica, rid
        assert (r.arrival_time, r.first_token_time, r.finish_time) == pytest.approx((sent, first, end)), rid
    # the sent prompts: the previous turn's prompt and output, then the new tokens
    assert [records[i][0].prompt_len for i in range(4)] == [10, 5, 17, 10]
    # the later turns find their history cached where it is (block size 4: A0's 12 computed
    # tokens are 3 full blocks; B0's 6 are 1), as on one replica (tests/sim/test_sessions.py)
    assert [records[i][0].cached_prompt_tokens for i in range(4)] == [0, 0, 12, 4]
    assert [(records[i][0].session_id, records[i][0].turn) for i in range(4)] == [("A", 0), ("B", 0), ("A", 1),
                                                                                 ("B", 1)]


def test_round_robin_splits_the_sessions_and_misses_their_history():
    # released A0, B0, B1 (.135), A1 (.53): round-robin sends B1 to 0 and A1 to 1
    records = run_cluster(two_sessions(), 2, "round-robin", prefix_caching=True)
    assert [records[i][1] for i in range(4)] == [0, 1, 1, 0]
    assert [records[i][0].cached_prompt_tokens for i in range(4)] == [0, 0, 0, 0]


def many_sessions(seed: int, count: int = 24) -> Trace:
    """Sessions of 1-4 turns with long outputs and short or no think times: releases that one
    replica's finish creates land inside other replicas' runs of decode steps."""
    rng = random.Random(seed)
    records = []
    for s in range(count):
        at = rng.uniform(0, 0.3)
        prompt = rng.randint(4, 30)
        for turn in range(rng.randint(1, 4)):
            output = rng.randint(1, 40)
            think = rng.choice([0.0, 0.0, rng.uniform(0, 0.05)]) if turn else None
            records.append(TraceRequest(prompt, output, arrival_time=at + turn * 0.01, session_id=s, turn=turn,
                                        think_time=think))
            prompt += output + rng.randint(1, 10)
    return Trace({}, records)


def timeline(records: dict) -> dict:
    return {rid: (k, r.status, r.arrival_time, r.first_token_time, r.finish_time, r.cached_prompt_tokens)
            for rid, (r, k) in records.items()}


@pytest.mark.parametrize("router,replicas,seed", [("round-robin", 3, 1), ("session-affinity", 2, 2),
                                                  ("least-outstanding", 3, 3), ("random", 2, 4)])
def test_decode_runs_never_pass_a_release_from_another_replica(router, replicas, seed):
    # (routers that read no gauge mid-step: a router reading waiting/running/KV usage sees a
    # replica's state at the end of its step in progress with the fast path, at its start
    # without it, so those may route differently, with open-loop arrivals too)
    trace = many_sessions(seed)
    options = dict(prefix_caching=True, max_num_seqs=4)
    fast = run_cluster(trace, replicas, router, fast=True, **options)
    slow = run_cluster(trace, replicas, router, fast=False, **options)
    assert len(fast) == len(trace)  # every turn finished or was turned away, exactly once
    assert timeline(fast) == timeline(slow)


@pytest.mark.parametrize("fast", [True, False])
def test_closed_loop_clients_over_a_cluster(fast):
    # 3 clients over 2 replicas: at most 3 requests out at any instant, each client's next one
    # sent when its last ended (on either replica); the same outputs stepping one at a time
    trace = Trace({}, [TraceRequest(8 + i % 5, 5 + 7 * (i % 4), arrival_time=0.0) for i in range(12)])
    records = run_cluster(trace, 2, "least-outstanding", fast=fast, concurrency=3)
    assert len(records) == 12 and all(r.status == "finished" for r, _ in records.values())
    spans = sorted((r.arrival_time, r.finish_time) for r, _ in records.values())
    for at, _ in spans:
        assert sum(1 for a, f in spans if a <= at < f) <= 3
    assert {k for _, k in records.values()} == {0, 1}
    if fast:
        assert timeline(records) == timeline(run_cluster(trace, 2, "least-outstanding", fast=False, concurrency=3))

"""Sessions and closed-loop clients over P/D disaggregation (pagesim.cluster.cluster): a turn (or a
client's next request) is released when the one before it ends on its decode replica, plus the
think time. Against a timeline worked out by hand (constant cost model: every step STEP seconds;
OPT-13B's KV over InfiniBand NDR, as tests/cluster/test_pd.py prices it), and against the same
cluster stepping one step at a time (fast_forward=False), which cannot miss a release."""

from __future__ import annotations

import pytest

from pagesim.api import replay_config
from pagesim.cluster.cluster import Cluster
from pagesim.cluster.spec import ClusterSpec, LinkSpec, ReplicaGroup
from pagesim.workload.trace import Trace, TraceRequest
from tests.cluster.test_cluster_sessions import ids, two_sessions  # (the co-located tests' trace)

STEP = 0.01
OPT13B_KV_PER_TOKEN = 819_200  # 40 layers x 2 (K, V) x 5120 x 2 bytes
IB, IB_LATENCY = 50e9, 10e-6  # InfiniBand NDR per GPU, bytes/s; its latency


def transfer(prompt_len: int) -> float:
    return IB_LATENCY + prompt_len * OPT13B_KV_PER_TOKEN / IB


def pd_cluster(trace: Trace, prefill: int = 1, decode: int = 1, router: str = "round-robin", params=None,
               fast: bool = True, prefill_options=None, decode_options=None, **options) -> Cluster:
    base = dict(rate=None, num_requests=len(trace), cost_model="constant", model="opt-13b", gpu="a100-40gb",
                block_size=4, **options)
    spec = ClusterSpec([ReplicaGroup("P", replay_config(**base, **(prefill_options or {})), prefill, "prefill"),
                        ReplicaGroup("D", replay_config(**base, **(decode_options or {})), decode, "decode")],
                       router, params or {}, links=[LinkSpec("P", "D", "infiniband")])
    return Cluster(spec, trace, fast_forward=fast)


def by_id(result) -> dict:
    return {r.request_id: (r, k, d) for r, k, d in zip(result.requests, result.replica, result.decode_replica)}


def assert_all_blocks_free(cluster: Cluster) -> None:
    for replica in cluster.replicas:
        kv = replica.sim.scheduler.kv
        assert kv.num_free_blocks == kv.num_device_blocks, replica.index
        assert not replica.sim.scheduler.has_unfinished, replica.index


@pytest.mark.parametrize("fast", [True, False])
def test_two_sessions_over_pd_1_1_by_hand(fast):
    # P = replica 0, D = replica 1. Each request: a prefill step on P, its prompt's KV over the
    # link (one transfer at a time), then on D a first step (its last prompt token: the first
    # token) and one step per further token.
    # A0: P [0, .01]; link .01 + t(10); D's first step gives A0's first token at e = .01 + t(10) + .01,
    # its second step A0's second token at e + .01
    a0_first = 0.01 + transfer(10) + STEP
    # B0 arrives .015: P [.015, .025]; its link ends at .025 + t(5), during D's second step; D
    # admits it when that step ends, in a step of its own (an admission step runs no decodes, no
    # chunked prefill): B0's first token at e + .02; then one step decodes both: A0's third (last)
    # token and B0's second (last) at e + .03
    assert a0_first < 0.025 + transfer(5) < a0_first + STEP
    b0_first = a0_first + 2 * STEP
    a0_end = b0_end = a0_first + 3 * STEP
    # the second turns are sent when the first ones end on D, plus the think times
    b1_sent = b0_end + 0.1
    b1_end = b1_sent + STEP + transfer(10) + STEP  # output 1: D's first step ends it
    a1_sent = a0_end + 0.5
    a1_first = a1_sent + STEP + transfer(17) + STEP
    a1_end = a1_first + STEP
    cluster = pd_cluster(two_sessions(), fast=fast)
    result = cluster.run()
    records = by_id(result)
    expected = {0: (0.0, a0_first, a0_end), 1: (0.015, b0_first, b0_end), 2: (a1_sent, a1_first, a1_end),
                3: (b1_sent, b1_end, b1_end)}
    assert sorted(records) == [0, 1, 2, 3]
    for rid, (sent, first, end) in expected.items():
        r, prefill, decode = records[rid]
        assert r.status == "finished" and (prefill, decode) == (0, 1), rid
        assert (r.arrival_time, r.first_token_time, r.finish_time) == pytest.approx((sent, first, end), abs=1e-12), rid
    # the sent prompts: the previous turn's prompt and output, then the new tokens
    assert [records[i][0].prompt_len for i in range(4)] == [10, 5, 17, 10]
    assert [records[i][0].output_len for i in range(4)] == [3, 2, 2, 1]
    assert [(records[i][0].session_id, records[i][0].turn) for i in range(4)] == [("A", 0), ("B", 0), ("A", 1),
                                                                                 ("B", 1)]
    # each request prefilled once and decoded once, and every block free on both sides
    assert sorted(r.request_id for r in result.results[0].metrics.requests) == [0, 1, 2, 3]
    assert sorted(r.request_id for r in result.results[1].metrics.requests) == [0, 1, 2, 3]
    assert_all_blocks_free(cluster)


def test_requests_csv_keeps_the_session_columns_under_pd(tmp_path):
    import csv

    result = pd_cluster(two_sessions()).run()
    result.write(tmp_path, result.summary)
    with open(tmp_path / "requests.csv") as f:
        rows = {int(row["request_id"]): row for row in csv.DictReader(f)}
    assert [(rows[i]["session_id"], rows[i]["turn"], rows[i]["replica"], rows[i]["decode_replica"])
            for i in range(4)] == [("A", "0", "0", "1"), ("B", "0", "0", "1"), ("A", "1", "0", "1"),
                                   ("B", "1", "0", "1")]


@pytest.mark.parametrize("router,prefill_replicas,hits", [
    # fallback round-robin on both stages: A0 -> P0, B0 -> P1; later turns follow their session
    # to the prefill replica holding their history (block size 4: it computed A0's 10 prompt
    # tokens, 2 full blocks, and B0's 5, 1 block; the outputs were computed on the decode
    # replicas, so they are not cached there)
    ("session-affinity", [0, 1, 0, 1], [0, 0, 8, 4]),
    # released A0, B0, B1, A1: round-robin sends B1 to P0 and A1 to P1, away from their history
    ("round-robin", [0, 1, 1, 0], [0, 0, 0, 0]),
])
def test_session_affinity_keeps_a_sessions_prefills_on_one_replica(router, prefill_replicas, hits):
    params = {"fallback": "round-robin"} if router == "session-affinity" else {}
    cluster = pd_cluster(two_sessions(), 2, 2, router, params, prefill_options={"prefix_caching": True})
    records = by_id(cluster.run())
    assert [records[i][1] for i in range(4)] == prefill_replicas
    assert [records[i][0].cached_prompt_tokens for i in range(4)] == hits
    assert {records[i][2] for i in range(4)} <= {2, 3}
    assert_all_blocks_free(cluster)


def closed_loop_trace(count: int = 14) -> Trace:
    return Trace({}, [TraceRequest(8 + 9 * (i % 5), 3 + 7 * (i % 4), arrival_time=0.0) for i in range(count)])


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (2, 2)])
def test_closed_loop_clients_over_pd(shape, fast):
    # 3 clients: at most 3 requests out at any instant (sent to ended on the decode replica), and
    # no client idles with work left: every end but the last 3 sends the next request at once
    clients, trace = 3, closed_loop_trace()
    cluster = pd_cluster(trace, *shape, "least-outstanding", fast=fast, concurrency=clients)
    result = cluster.run()
    records = by_id(result)
    assert sorted(records) == list(range(len(trace)))  # each once
    assert all(r.status == "finished" and r.output_len == 3 + 7 * (i % 4) for i, (r, _, _) in records.items())
    spans = sorted((r.arrival_time, r.finish_time) for r, _, _ in records.values())
    for at, _ in spans:
        assert sum(1 for a, f in spans if a <= at < f) <= clients
    sent = sorted(a for a, _ in spans)
    ends = sorted(f for _, f in spans)
    assert sent[:clients] == [0.0] * clients
    assert sent[clients:] == pytest.approx(ends[:len(trace) - clients], abs=1e-12)
    left = {"prefill": 0, "decode": 0}  # requests each stage recorded
    for r, replica in zip(result.results, cluster.replicas):
        left[replica.role] += len(r.metrics.requests)
    assert left == {"prefill": len(trace), "decode": len(trace)}
    assert_all_blocks_free(cluster)
    if fast:
        slow = pd_cluster(trace, *shape, "least-outstanding", fast=False, concurrency=clients).run()
        assert timeline(records) == timeline(by_id(slow))


def timeline(records: dict) -> dict:
    return {rid: (k, d, r.status, r.arrival_time, r.first_token_time, r.finish_time)
            for rid, (r, k, d) in records.items()}


def test_a_turn_refused_at_prefill_ends_its_session():
    # B's first turn is longer than the prefill replicas' max_model_len: refused there, so B's
    # second turn is turned away with the reason; A runs through. Every request accounted for.
    a0, b0 = ids(100, 10), ids(200, 40)
    trace = Trace({}, [
        TraceRequest(10, 3, arrival_time=0.0, session_id="A", turn=0, prompt_token_ids=a0),
        TraceRequest(40, 2, arrival_time=0.0, session_id="B", turn=0, prompt_token_ids=b0),
        TraceRequest(15, 2, arrival_time=0.1, session_id="A", turn=1, think_time=0.1,
                     prompt_token_ids=a0 + ids(900, 3) + ids(300, 2)),
        TraceRequest(45, 2, arrival_time=0.1, session_id="B", turn=1, think_time=0.1,
                     prompt_token_ids=b0 + ids(950, 2) + ids(400, 3)),
    ])
    cluster = pd_cluster(trace, max_model_len=32)
    records = by_id(cluster.run())
    assert sorted(records) == [0, 1, 2, 3]
    assert [records[i][0].status for i in range(4)] == ["finished", "rejected", "finished", "rejected"]
    assert "session B ended: turn 0 (request 1) failed" in records[3][0].reject_reason
    assert [records[i][2] for i in range(4)] == [1, -1, 1, -1]  # refused ones never reached the decode replica
    assert_all_blocks_free(cluster)


def test_a_turn_refused_at_decode_ends_its_session():
    # the decode replica holds 4 blocks of 4 tokens: A0 (10 + 3 tokens) fits, B0 (20 + 2) never
    # can: refused on its decode replica after its prefill, which ends session B
    a0, b0 = ids(100, 10), ids(200, 20)
    trace = Trace({}, [
        TraceRequest(10, 3, arrival_time=0.0, session_id="A", turn=0, prompt_token_ids=a0),
        TraceRequest(20, 2, arrival_time=0.0, session_id="B", turn=0, prompt_token_ids=b0),
        TraceRequest(25, 2, arrival_time=0.1, session_id="B", turn=1, think_time=0.1,
                     prompt_token_ids=b0 + ids(950, 2) + ids(400, 3)),
    ])
    cluster = pd_cluster(trace, decode_options={"num_gpu_blocks": 4})
    result = cluster.run()
    records = by_id(result)
    assert sorted(records) == [0, 1, 2]
    assert [records[i][0].status for i in range(3)] == ["finished", "rejected", "rejected"]
    assert records[1][2] == 1  # B0 was prefilled, then refused on the decode replica
    assert "session B ended: turn 0 (request 1) failed" in records[2][0].reject_reason
    assert_all_blocks_free(cluster)


@pytest.mark.parametrize("router,shape,seed", [("round-robin", (1, 2), 1), ("session-affinity", (2, 2), 2),
                                               ("least-outstanding", (2, 1), 3)])
def test_decode_runs_never_pass_a_release_under_pd(router, shape, seed):
    # sessions of 1-4 turns with long outputs and short think times: a release that one decode
    # replica's finish creates lands inside other replicas' runs of decode steps
    from tests.cluster.test_cluster_sessions import many_sessions

    trace = many_sessions(seed)
    options = dict(prefix_caching=True, max_num_seqs=4)
    fast = by_id(pd_cluster(trace, *shape, router, fast=True, **options).run())
    slow = by_id(pd_cluster(trace, *shape, router, fast=False, **options).run())
    assert sorted(fast) == list(range(len(trace)))  # every turn finished or turned away, exactly once
    assert timeline(fast) == timeline(slow)

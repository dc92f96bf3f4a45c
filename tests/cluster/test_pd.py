"""P/D disaggregation against hand-computed cases: the scheduler's entry point for a request whose
prompt KV was moved in, the KV transfer time from the bytes and the link, the link's queue, back-
pressure from a decode pool that cannot admit, every request finished once, blocks freed on
both sides."""

from __future__ import annotations

import pytest

from pagesim.api import replay_config
from pagesim.cluster.cluster import Cluster
from pagesim.cluster.links import make_link
from pagesim.cluster.spec import ClusterSpec, LinkSpec, ReplicaGroup
from pagesim.core import Request, SamplingParams, SchedulerConfig, StepResult
from pagesim.core.paged import PagedKVManager
from pagesim.core.scheduler import Scheduler
from pagesim.workload.trace import Trace, TraceRequest

STEP = 0.01
OPT13B_KV_PER_TOKEN = 819_200  # 40 layers x 2 (K, V) x 5120 x 2 bytes (the paper's 800 KB)
IB = 50e9  # InfiniBand NDR per GPU, bytes/s
IB_LATENCY = 10e-6


def test_a_moved_prompt_is_admitted_with_its_blocks_and_computes_one_token():
    # prompt 40 tokens, blocks of 16: ceil(40 / 16) = 3 blocks at admission, 39 tokens counted
    # computed, the step computes the last one (a decode-shaped step) and gives the first token.
    kv = PagedKVManager(num_device_blocks=10, block_size=16, watermark=0.0)
    sched = Scheduler(SchedulerConfig(max_model_len=2560), kv)
    request = Request(0, 40, SamplingParams(max_tokens=3, ignore_eos=True), prompt_kv_moved=True)
    group = sched.add_request(request)
    out = sched.schedule(0.0)
    seq = group.seqs[0]
    assert len(seq.block_table) == 3 and kv.num_free_blocks == 7
    assert out.num_new_tokens == [1] and out.num_decode_seqs == 1 and out.num_prefill_tokens == 0
    assert group.num_cached_prompt_tokens == 0  # moved, not a prefix-cache hit
    sched.update(out, StepResult(default_token=0), 0.01)
    assert group.first_token_time == 0.01 and seq.num_output_tokens == 1
    for t in (0.02, 0.03):
        sched.update(sched.schedule(t), StepResult(default_token=0), t)
    assert group.is_finished and kv.num_free_blocks == 10


def test_a_moved_prompt_waits_when_its_blocks_are_not_free():
    kv = PagedKVManager(num_device_blocks=4, block_size=16, watermark=0.0)
    sched = Scheduler(SchedulerConfig(max_model_len=2560), kv)
    first = sched.add_request(Request(0, 40, SamplingParams(max_tokens=20, ignore_eos=True), prompt_kv_moved=True))
    second = sched.add_request(Request(1, 40, SamplingParams(max_tokens=2, ignore_eos=True), prompt_kv_moved=True))
    sched.schedule(0.0)
    assert first.seqs[0].block_table and list(sched.waiting) == [second]  # 3 of 4 blocks taken: it waits


def trace_of(*requests: tuple[float, int, int]) -> Trace:
    return Trace({}, [TraceRequest(prompt_len=p, output_len=o, arrival_time=t) for t, p, o in requests])


def pd_cluster(trace: Trace, prefill: int = 1, decode: int = 1, **decode_options) -> Cluster:
    base = dict(rate=0, num_requests=len(trace), cost_model="constant", model="opt-13b", gpu="a100-40gb")
    spec = ClusterSpec([ReplicaGroup("P", replay_config(**base), prefill, "prefill"),
                        ReplicaGroup("D", replay_config(**base, **decode_options), decode, "decode")],
                       links=[LinkSpec("P", "D", "infiniband")])
    return Cluster(spec, trace)


def test_transfer_time_by_hand():
    link = make_link("infiniband")
    assert link.transfer_time(100, OPT13B_KV_PER_TOKEN) == pytest.approx(IB_LATENCY + 100 * OPT13B_KV_PER_TOKEN / IB)
    # NVLink takes the GPU's own: A100 300 GB/s a direction
    assert make_link("nvlink", "a100-40gb").bandwidth == 300e9


def test_one_request_through_prefill_link_and_decode_by_hand():
    # arrival 0; prefill step [0, 0.01]; the KV of 100 tokens moves in 1e-5 + 100 * 819200 / 50e9
    # = 0.0016484 s; the decode replica (idle) starts its step then: first token at 0.0216484,
    # then one token a step: 5 tokens done at 0.0216484 + 4 * 0.01.
    transfer = IB_LATENCY + 100 * OPT13B_KV_PER_TOKEN / IB
    result = pd_cluster(trace_of((0.0, 100, 5))).run()
    (record,) = result.requests
    assert (result.replica[0], result.decode_replica[0]) == (0, 1)
    assert record.first_token_time == pytest.approx(0.01 + transfer + STEP)
    assert record.finish_time == pytest.approx(0.01 + transfer + 5 * STEP)
    assert record.first_scheduled_time == 0.0  # its prefill started at once
    split = result.summary["cluster"]["ttft_split"]
    assert split["queue_mean_s"] == 0.0
    assert split["prefill_mean_s"] == pytest.approx(STEP)
    assert split["transfer_mean_s"] == pytest.approx(transfer)
    assert split["link_wait_mean_s"] == 0.0 and split["decode_wait_mean_s"] == pytest.approx(0.0)
    assert split["first_step_mean_s"] == pytest.approx(STEP)


def test_transfers_from_one_prefill_replica_queue_on_its_link():
    # two prompts prefilled in one step end together at 0.01: the second transfer starts when the
    # first ends
    transfer = IB_LATENCY + 100 * OPT13B_KV_PER_TOKEN / IB
    cluster = pd_cluster(trace_of((0.0, 100, 2), (0.0, 100, 2)))
    cluster.run()
    starts = sorted(h.link_start for h in cluster.pd_done)
    ends = sorted(h.link_end for h in cluster.pd_done)
    assert starts == pytest.approx([0.01, 0.01 + transfer])
    assert ends == pytest.approx([0.01 + transfer, 0.01 + 2 * transfer])


def test_a_full_decode_pool_back_pressures_without_losing_requests():
    # The decode replica holds 8 blocks of 16: one request (prompt 100, 20 outputs: 8 blocks at
    # its longest) at a time. Six requests arrive together; each waits for the one before it to
    # finish on the decode replica. All finish, once, and every block is free at the end.
    requests = [(0.0, 100, 20)] * 6
    cluster = pd_cluster(trace_of(*requests), decode=1, num_gpu_blocks=8)
    result = cluster.run()
    assert sorted(r.request_id for r in result.requests) == list(range(6))
    assert all(r.status == "finished" and r.output_len == 20 for r in result.requests)
    finishes = sorted(r.finish_time for r in result.requests)
    assert all(b - a >= 20 * STEP - 1e-9 for a, b in zip(finishes, finishes[1:]))  # one after another
    assert result.summary["cluster"]["ttft_split"]["decode_wait_mean_s"] > 0.1
    for replica in cluster.replicas:
        kv = replica.sim.scheduler.kv
        assert kv.num_free_blocks == kv.num_device_blocks
        assert not replica.sim.scheduler.has_unfinished


def test_every_request_finishes_once_over_several_prefill_and_decode_replicas():
    from pathlib import Path

    from pagesim.workload.trace import load_trace

    trace = load_trace(Path(__file__).resolve().parents[2] / "traces" / "sharegpt.json")
    cfg = replay_config(rate=8.0, num_requests=300)
    spec = ClusterSpec([ReplicaGroup("P", cfg, 2, "prefill"), ReplicaGroup("D", cfg, 3, "decode")])
    cluster = Cluster(spec, trace)
    result = cluster.run()
    assert sorted(r.request_id for r in result.requests) == list(range(300))
    assert set(result.replica) == {0, 1} and set(result.decode_replica) == {2, 3, 4}
    assert sum(len(r.metrics.requests) for r in result.results[:2]) == 300  # each prefilled once
    assert sum(len(r.metrics.requests) for r in result.results[2:]) == 300  # and decoded once
    for replica in cluster.replicas:
        assert replica.sim.scheduler.kv.num_free_blocks == replica.sim.scheduler.kv.num_device_blocks

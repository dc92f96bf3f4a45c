"""The scheduler with both KV managers and a fake model (tests/core/driver.py).

Each driver step checks budgets, FCFS admission, resume-before-admit, the pools against the
block tables and (where enabled) simulated KV memory; at the end every request is finished or
rejected, the pools are empty, and every output is the exact token sequence the fake model's
deterministic function gives, so nothing was lost or duplicated across preemption.
"""

from __future__ import annotations

import random

import pytest

from pagesim.core import (
    PagedKVManager, Request, ReservationKVManager, Sample, SamplingParams, Scheduler, SchedulerConfig, SequenceStatus,
    StepResult,
)
from .driver import FakeEngine, make_scheduler, random_requests

MODES = ("recompute", "swap", "auto")


def req(rid, prompt_len, max_tokens, n=1, tokens=None):
    ids = tokens if tokens is not None else [(rid * 31 + i) % 97 for i in range(prompt_len)]
    return Request(rid, prompt_len, SamplingParams(n=n, max_tokens=max_tokens), prompt_token_ids=ids)


def paged_sched(num_blocks, bs=4, num_host=0, mode="recompute", chunked=False, max_num_seqs=8,
                max_tokens=64, max_model_len=64, caching=False):
    kv = PagedKVManager(num_blocks, bs, num_host, enable_prefix_caching=caching, watermark=0.0)
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens, max_model_len=max_model_len,
                          preemption_mode=mode, chunked_prefill=chunked)
    return Scheduler(cfg, kv)


# -- the 500-request driver loop ------------------------------------------------------------------

def _run_500(sched, *, seed=0, multi=0.2, caching=False, memory=False):
    rng = random.Random(seed)
    eng = FakeEngine(sched, check_memory=memory)
    reqs = random_requests(rng, 500, multi=multi, prefixes=3 if caching else 0, oversize=0.03,
                           max_model_len=sched.config.max_model_len)
    eng.run(reqs, rng)
    assert len(eng.groups) == 500
    rejected = [g for g in eng.groups if g.reject_reason is not None]
    finished = [g for g in eng.groups if g.reject_reason is None and g.is_finished]
    assert len(rejected) + len(finished) == 500
    assert rejected, "the workload includes requests that can never fit"
    eng.check_finished()
    eng.check_pool_empty()
    return eng


PAGED_MATRIX = [
    pytest.param(mode, chunked, id=f"{mode}-{'chunked' if chunked else 'whole'}")
    for mode in MODES for chunked in (False, True)
]


@pytest.mark.parametrize("mode,chunked", PAGED_MATRIX)
def test_driver_paged(mode, chunked):
    eng = _run_500(make_scheduler("paged", mode, chunked), multi=0.2)
    assert eng.sched.num_preemptions > 0, "the pool is meant to be small enough to force preemption"


@pytest.mark.parametrize("mode", MODES)
def test_driver_paged_chunked_single_sequence(mode):
    # single-sequence groups preempt more often (no forks to swap), so more recomputes
    eng = _run_500(make_scheduler("paged", mode, True), multi=0.0)
    assert eng.sched.num_preemptions > 0


@pytest.mark.parametrize("mode", MODES)
def test_driver_paged_prefix_caching(mode):
    eng = _run_500(make_scheduler("paged", mode, True, caching=True), multi=0.0, caching=True)
    assert eng.kv.prefix_hits > 0 and eng.sched.num_preemptions > 0


@pytest.mark.parametrize("mode", MODES)
def test_driver_static_batching(mode):
    _run_500(make_scheduler("paged", mode, batching="static"), multi=0.2)


@pytest.mark.parametrize("allocator", ["buddy", "first-fit"])
@pytest.mark.parametrize("estimate,mode,chunked", [("max", "recompute", False), ("pow2", "swap", True), ("oracle", "auto", False)])
def test_driver_reservation(estimate, mode, chunked, allocator):
    eng = _run_500(make_scheduler(estimate, mode, chunked, allocator=allocator), multi=0.2)
    assert eng.sched.num_preemptions == 0  # reservations never grow, so nothing is ever preempted


# -- preemption keeps every token (simulated KV memory on) -----------------------------------------

@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("mode", MODES)
def test_preemption_preserves_tokens_and_kv(mode, chunked):
    rng = random.Random(5)
    sched = make_scheduler("paged", mode, chunked, num_blocks=40, num_host=400)
    eng = FakeEngine(sched, check_memory=True)
    # n > 1 only where it avoids the two known bugs (recompute of forked groups; chunked + n > 1)
    multi = 0.2 if mode != "recompute" and not chunked else 0.0
    eng.run(random_requests(rng, 120, multi=multi), rng)
    eng.check_finished()
    eng.check_pool_empty()
    want = {"recompute": {"recompute"}, "swap": {"swap"}, "auto": {"recompute", "swap"} if multi else {"recompute"}}[mode]
    assert set(eng.preempt_modes) == want, eng.preempt_modes


@pytest.mark.parametrize("mode", MODES)
def test_preemption_with_prefix_caching_preserves_kv(mode):
    rng = random.Random(11)
    sched = make_scheduler("paged", mode, False, num_blocks=40, num_host=400, caching=True)
    eng = FakeEngine(sched, check_memory=True)
    eng.run(random_requests(rng, 120, multi=0.0 if mode == "recompute" else 0.2, prefixes=2), rng)
    eng.check_finished()
    eng.check_pool_empty()
    assert sched.num_preemptions > 0 and sched.kv.prefix_hits > 0


@pytest.mark.parametrize("estimate", ["max", "pow2", "oracle"])
def test_reservation_forks_copy_kv(estimate):
    rng = random.Random(3)
    sched = make_scheduler(estimate, "recompute", False, num_blocks=128)
    eng = FakeEngine(sched, check_memory=True)
    eng.run(random_requests(rng, 60, multi=0.5), rng)
    eng.check_finished()
    eng.check_pool_empty()


# -- FCFS --------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunked", [False, True])
def test_fcfs_admission_order(chunked):
    rng = random.Random(2)
    sched = make_scheduler("paged", "recompute", chunked, num_blocks=256, max_num_seqs=6)
    eng = FakeEngine(sched)
    eng.run(random_requests(rng, 150, multi=0.0), rng, per_step=2.0)
    assert sched.num_preemptions == 0
    groups = sorted(eng.groups, key=lambda g: g.arrival_order)
    times = [g.first_scheduled_time for g in groups]
    assert times == sorted(times)
    assert eng.admitted_order == [g.request_id for g in groups]
    # the queue really built up: requests waited past their arrival
    assert sum(g.first_scheduled_time > g.arrival_time for g in groups) > 50


# -- preemption picks the newest group, whole --------------------------------------------------

@pytest.mark.parametrize("mode,expect", [("recompute", "recompute"), ("swap", "swap"), ("auto", "recompute")])
def test_newest_running_group_is_preempted(mode, expect):
    # 4 blocks of 4 tokens. r0 and r1 fill one block each and need a second one at their first
    # decode; r2 (newest) has room in its block and needs nothing, but is the one preempted.
    sched = paged_sched(4, bs=4, num_host=4, mode=mode)
    groups = [sched.add_request(req(0, 4, 10)), sched.add_request(req(1, 4, 10)), sched.add_request(req(2, 2, 10))]
    assert all(g.reject_reason is None for g in groups)
    out = sched.schedule(0.0)
    assert out.groups == groups and sched.kv.num_free_blocks == 1
    sched.update(out, StepResult(default_token=1), 0.0)
    out = sched.schedule(1.0)
    assert [(g.request_id, m) for g, m in out.preempted] == [(2, expect)]
    assert out.groups == groups[:2]
    assert sched.running == groups[:2]
    want = SequenceStatus.SWAPPED if expect == "swap" else SequenceStatus.WAITING
    assert groups[2].seqs[0].status is want
    if expect == "swap":
        assert sched.swapped == [groups[2]] and len(out.blocks_to_swap_out) == 1
    else:
        assert sched.waiting[0] is groups[2] and groups[2].seqs[0].block_table == []


@pytest.mark.parametrize("mode", ["swap", "auto", "recompute"])
def test_group_is_evicted_whole_and_swapped_group_resumes_first(mode):
    # r0 (n=1) and r1 (n=3) outgrow an 18-block pool; r1 is newest, so it goes, all three
    # sequences at once. While it is out, r2 arrives and must wait for r1 to come back.
    sched = paged_sched(18, bs=4, num_host=18, mode=mode)
    eng = FakeEngine(sched, check_memory=True)
    r0 = eng.add(req(0, 4, 20))
    r1 = eng.add(req(1, 2, 20, n=3))
    while not eng.preempt_modes:
        eng.step()
        statuses = {s.status for s in r1.seqs}
        assert len(statuses) == 1, f"r1's sequences split: {r1.seqs}"
    assert len(r1.seqs) == 3 and r1.num_preemptions == 1 and r0.num_preemptions == 0
    kv = sched.kv
    if mode == "recompute":
        assert all(s.status is SequenceStatus.WAITING and s.block_table == [] for s in r1.seqs)
        assert sched.waiting[0] is r1
    else:
        assert all(s.status is SequenceStatus.SWAPPED for s in r1.seqs)
        # nothing of r1 is left on the device: device references are all r0's
        assert sum(kv.device.refcount) == len(r0.seqs[0].block_table)
        assert sum(kv.host.refcount) == sum(len(s.block_table) for s in r1.seqs)
        r2 = eng.add(req(2, 1, 2))
        assert kv.num_free_blocks >= 1  # r2 would fit now; it waits by policy
        while r2.first_scheduled_time is None:
            swapped_now = bool(sched.swapped)
            eng.step()
            if r2.first_scheduled_time is not None:
                assert not swapped_now and not sched.swapped
        assert r1.seqs[0].status is SequenceStatus.RUNNING or r1.is_finished
    while sched.has_unfinished:
        eng.step()
    eng.check_finished()
    eng.check_pool_empty()


# -- rejection ---------------------------------------------------------------------------------

def _reject_case(sched, bad, good):
    eng = FakeEngine(sched)
    groups = [eng.add(r) for r in bad]
    for g in groups:
        assert g.reject_reason, g
        assert g.seqs == [] and g.finished_seqs[0].status is SequenceStatus.REJECTED
    assert not sched.has_unfinished
    ok = [eng.add(r) for r in good]
    assert all(g.reject_reason is None for g in ok)
    seen = set()
    while sched.has_unfinished:
        out = sched.schedule(eng.now)
        seen |= {g.request_id for g in out.groups}
        eng.execute(out)
        sched.update(out, eng.result(out), eng.now)
    assert not seen & {r.request_id for r in bad}
    eng.check_finished()
    eng.check_pool_empty()


def test_never_fitting_requests_are_rejected_paged():
    sched = paged_sched(10, bs=4, num_host=20, mode="auto", max_num_seqs=4, max_model_len=64)
    bad = [req(0, 50, 15),  # prompt + max_tokens > max_model_len
           req(1, 30, 20),  # 50 tokens = 13 blocks > 10
           req(2, 4, 4, n=5),  # more sequences than max_num_seqs
           req(3, 8, 12, n=4),  # 2 shared + 4 x 3 own blocks > 10
           req(6, 6, 10, n=4)]  # 1 shared (the partial one is copied) + 4 x 3 own blocks > 10
    good = [req(4, 20, 20),  # 40 tokens, exactly the pool
            req(5, 8, 4, n=4)]  # 2 shared prompt blocks + 4 x 1
    _reject_case(sched, bad, good)


def test_never_fitting_requests_are_rejected_reservation():
    kv = ReservationKVManager(16, 4, estimate="pow2", max_model_len=64)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv)
    # pow2 of 40 = 64 -> min(10 + 64, 64) = 64 tokens = 16 blocks: fits; two of them do not
    bad = [req(0, 10, 40, n=2), req(1, 60, 5)]
    good = [req(2, 10, 40), req(3, 4, 4, n=2)]
    _reject_case(sched, bad, good)
    kv = ReservationKVManager(16, 4, estimate="max", max_model_len=128)
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=128), kv)
    _reject_case(sched, [req(0, 1, 1)], [])  # max reserves 128 tokens = 32 blocks > 16


# -- parallel sampling ---------------------------------------------------------------------------

@pytest.mark.parametrize("prompt_len,copies", [(6, 3), (8, 0), (1, 3), (4, 0)])
def test_parallel_sampling_forks_and_copies_on_write(prompt_len, copies):
    sched = paged_sched(32, bs=4)
    eng = FakeEngine(sched, check_memory=True)
    g = eng.add(req(0, prompt_len, 5, n=4))
    eng.step()  # prefill; the update forks three children
    assert len(g.seqs) == 4 and all(s.status is SequenceStatus.RUNNING for s in g.seqs)
    prompt_blocks = -(-prompt_len // 4)
    assert all(s.block_table == g.seqs[0].block_table for s in g.seqs)
    assert sched.kv.device.refcount[g.seqs[0].block_table[-1]] == 4
    out = sched.schedule(eng.now)
    assert len(out.blocks_to_copy) == copies
    last = g.seqs[-1].block_table  # the parent comes last and writes in place after the copies
    if copies:
        assert {src for src, _ in out.blocks_to_copy} == {last[prompt_blocks - 1]}
        assert len({dst for _, dst in out.blocks_to_copy}) == 3
    used = prompt_blocks + (3 if copies else 4)
    assert sched.kv.num_free_blocks == 32 - used
    eng.execute(out)
    eng.read_back(out)
    sched.update(out, eng.result(out), eng.now)
    while sched.has_unfinished:
        eng.step()
    eng.check_finished()
    eng.check_pool_empty()


# -- minimal reproductions of bugs found (and fixed) in the core ---------------------------------------------------------

def test_recomputed_forked_group_is_readmitted():
    # r1 (n=2, 40-token prompt) is newest and is preempted by recompute once the pool runs out;
    # readmitting it means prefilling 2 x ~45 tokens > max_num_batched_tokens = 64, forever.
    sched = paged_sched(24, bs=4, mode="recompute", max_tokens=64, max_model_len=64)
    eng = FakeEngine(sched, check_memory=True)
    eng.add(req(0, 4, 50))
    r1 = eng.add(req(1, 40, 20, n=2))
    while sched.has_unfinished:
        eng.step()
        assert eng.steps < 500
    assert r1.num_preemptions >= 1
    eng.check_finished()


def test_max_num_seqs_counts_unforked_groups():
    # r0 (n=4) prefills in chunks of 8 tokens; meanwhile r1..r3 are admitted because r0 still
    # has one sequence; once r0 forks, 4 + 3 sequences run with max_num_seqs = 4.
    sched = paged_sched(64, bs=4, mode="recompute", chunked=True, max_num_seqs=4, max_tokens=8, max_model_len=64)
    eng = FakeEngine(sched)
    eng.add(req(0, 30, 4, n=4))
    for rid in (1, 2, 3):
        eng.add(req(rid, 2, 8))
    while sched.has_unfinished:
        eng.step()  # asserts num_running_seqs <= max_num_seqs after every schedule()


@pytest.mark.parametrize("policy", ["paged", "oracle"])
def test_default_token_forks_parallel_samples(policy):
    sched = make_scheduler(policy, "recompute", num_blocks=64)
    g = sched.add_request(req(0, 6, 3, n=4))
    while sched.has_unfinished:
        out = sched.schedule(0.0)
        sched.update(out, StepResult(default_token=1), 0.0)
    assert len(g.finished_seqs) == 4


def test_reservation_length_mismatch_is_caught_up_front():
    kv = ReservationKVManager(64, 4, estimate="oracle", max_model_len=64)
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=128)
    try:
        sched = Scheduler(cfg, kv)
    except ValueError:
        return
    g = sched.add_request(req(0, 60, 20))
    if g.reject_reason is None:
        while sched.has_unfinished:
            out = sched.schedule(0.0)
            sched.update(out, StepResult(default_token=1), 0.0)


def test_samples_are_traced_to_the_sequences_they_went_into():
    # A beam-like step: 3 live sequences; parent a gets two samples (one forks), b one, c none
    # (dropped). sample_seq_ids must name, per sample, the sequence now ending in its token.
    sched = paged_sched(32, bs=4)
    g = sched.add_request(Request(0, 5, SamplingParams(beam_width=3, max_tokens=8, ignore_eos=True),
                                  prompt_token_ids=list(range(5))))
    out = sched.schedule(0.0)
    p = g.seqs[0].seq_id
    sched.update(out, StepResult(samples={0: [Sample(p, 10), Sample(p, 11), Sample(p, 12)]}), 1.0)
    assert sorted(g.sample_seq_ids) == sorted(s.seq_id for s in g.seqs) and g.sample_seq_ids[0] == p
    a, b, c = g.sample_seq_ids
    out = sched.schedule(1.0)
    samples = [Sample(b, 20), Sample(a, 21), Sample(b, 22)]  # b twice (forks), a once, c dropped
    sched.update(out, StepResult(samples={0: samples}), 2.0)
    by_id = {s.seq_id: s for s in g.seqs}
    assert set(by_id) == set(g.sample_seq_ids) and c not in by_id
    for sample, seq_id in zip(samples, g.sample_seq_ids):
        seq = by_id[seq_id]
        assert seq.token_ids[-1] == sample.token_id
        assert seq.token_ids[-2] == {a: 10, b: 11}[sample.parent_seq_id]  # descends from its parent
    assert g.sample_seq_ids[0] == b and g.sample_seq_ids[1] == a  # a parent keeps its first sample


def test_a_group_swapped_in_mid_prefill_takes_its_next_chunk_at_once():
    """Chunked prefill with swap: a group swapped out in the middle of its prefill and swapped back
    in while nothing else runs used to leave a step with nothing to compute (the waiting requests
    held back behind the swapped group), which the driver reports as a stall. It now takes its
    next chunk in the step that swaps it in; every request finishes with its exact tokens."""
    rng = random.Random("mla-False-True-swap")
    sched = make_scheduler("paged", "swap", True, num_blocks=28)
    FakeEngine(sched).run(random_requests(random.Random("mla-False-True-swap"), 150, multi=0.2, oversize=0.03,
                                          max_model_len=128), rng)


@pytest.mark.parametrize("mode, chunked", [("recompute", False), ("swap", True), ("auto", False)])
def test_default_token_steps_equal_the_explicit_samples_they_stand_for(mode, chunked):
    # update() appends the default token itself where samples_for + _apply_samples would only
    # append it: a twin scheduler given those very samples explicitly must end every step alike
    rng = random.Random(7)
    reqs = random_requests(rng, 120, multi=0.4, max_model_len=64)
    fast, slow = (paged_sched(40, num_host=40, mode=mode, chunked=chunked, max_tokens=64) for _ in range(2))
    default = StepResult(default_token=3)
    pending = {False: list(reqs), True: list(reqs)}
    groups = {False: [], True: []}
    now = 0.0
    while pending[False] or fast.has_unfinished:
        arrivals = rng.randint(0, 2)
        for explicit, sched in ((False, fast), (True, slow)):
            for _ in range(min(arrivals, len(pending[explicit]))):
                groups[explicit].append(sched.add_request(pending[explicit].pop(0)))
        out, twin = fast.schedule(now), slow.schedule(now)
        samples = {g.request_id: default.samples_for(g, due) for g, due in twin.due_by_group() if due}
        now += 1.0
        done = fast.update(out, default, now), slow.update(twin, StepResult(samples=samples), now)
        assert [g.request_id for g in done[0]] == [g.request_id for g in done[1]]
        for a, b in zip(groups[False], groups[True]):
            assert a.sample_seq_ids == b.sample_seq_ids
            assert [(s.seq_id, s.num_tokens, s.token_ids, s.status) for s in a.seqs + a.finished_seqs] == \
                [(s.seq_id, s.num_tokens, s.token_ids, s.status) for s in b.seqs + b.finished_seqs]
    assert sum(len(g.finished_seqs) for g in groups[False]) > 120  # parallel groups forked

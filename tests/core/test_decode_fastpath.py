"""decode_horizon / advance_decode (pagesim.core.decode_runs, the simulator's fast path) against single steps.

Two identical schedulers get the same requests at the same step indices. The reference always
calls schedule()/update(); the fast one takes runs of plain decode steps with advance_decode()
whenever decode_horizon() allows two or more (ending each run before the next arrival; a run
may end with the step in which sequences finish). After
every action the full core state must be identical: queues, every sequence's block table,
computed and total tokens, token ids, timestamps, the device free queue *order*, refcounts,
the prefix cache and the reservation allocator's chunks. While the fast one runs, the
reference checks that each of its single steps really is a plain decode of the same batch
(no preemption, admission, swap or copy; finishes only at the run's last step, and the same
ones), and after a run that the horizon ended without a finish, that the reference's next step
is *not* one (the horizon is tight, not just safe).
"""

from __future__ import annotations

import pytest

from pagesim.core import KVGroupSpec, Request, SamplingParams
from pagesim.core.decode_batch import DecodeBatch
from pagesim.core.decode_runs import decode_horizon
from tests.core.fastpath_support import LIMIT, Driver, drive, maker, step_result, workload

CASES = {
    # name: (scheduler maker, workload kwargs, what must have happened)
    "paged-recompute": (maker(preemption="recompute"), {}, ("preemptions",)),
    "paged-swap": (maker(preemption="swap"), {}, ("preemptions", "swapped_blocks")),
    # Multi-sequence groups get a pool and a token budget that hold a recompute of all their
    # sequences unshared: a group preempted by recompute re-prefills each sequence separately,
    # and one that no longer fits the pool or the budget would never restart.
    "paged-auto-parallel": (maker(preemption="auto", blocks=80, max_len=100, batched=300),
                            {"n_choices": (1, 2, 3), "max_prompt": 50, "max_output": 50}, ("preemptions", "swapped_blocks")),
    "paged-no-host-swap": (maker(preemption="swap", host=0), {}, ("preemptions",)),
    "paged-prefix-recompute": (maker(caching=True), {"token_ids": True}, ("preemptions", "prefix_hits")),
    "paged-prefix-swap": (maker(caching=True, preemption="auto", blocks=64, max_len=128, batched=256), {"token_ids": True, "n_choices": (1, 2)},
                          ("preemptions", "swapped_blocks", "prefix_hits")),
    "paged-roomy-bs16": (maker(blocks=200, bs=16, max_seqs=16), {"mean_gap": 1}, ()),
    "paged-chunked": (maker(chunked=True, batched=24, max_seqs=16), {}, ("preemptions",)),
    "paged-chunked-prefix-swap": (maker(chunked=True, batched=24, max_seqs=16, caching=True, preemption="auto", blocks=64,
                                        max_len=128),
                                  {"token_ids": True, "n_choices": (1, 2)}, ("preemptions", "prefix_hits")),
    "orca-max": (maker("orca-max", blocks=100, max_len=128), {"max_prompt": 60, "max_output": 60}, ()),
    "orca-pow2": (maker("orca-pow2", blocks=100, max_len=128), {"max_prompt": 60, "max_output": 60, "n_choices": (1, 2)}, ()),
    "orca-oracle-first-fit": (maker("orca-oracle", blocks=60, max_len=128, allocator="first-fit"),
                              {"max_prompt": 60, "max_output": 60}, ()),
    "static": (maker("static", blocks=100, max_len=128), {"max_prompt": 60, "max_output": 60}, ()),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_matches_single_steps(name, seed):
    make, kwargs, must = CASES[name]
    max_len = make().config.max_model_len
    stats = drive(make, workload(seed, 60, max_len=max_len, **kwargs))
    # runs are taken, and long ones (the roomy case has arrivals every 3 steps)
    assert stats["runs"] >= 15 and stats["run_steps"] >= 3 * stats["runs"], stats
    # runs the horizon ended either finished sequences at their last step or were checked tight
    assert stats["tight_checks"] + stats.get("run_finishes", 0) >= 10, stats
    assert stats["finished"] == 60, stats
    # plans made on a DecodeBatch kept from earlier runs, admissions and decode steps (each checked
    # against a fresh one)
    assert stats["kept_batch_plans"] >= 5 and stats["batch_kept_through_steps"] >= 5, stats
    for key in must:
        assert stats[key] > 0, (key, stats)


@pytest.mark.parametrize("name", ["paged-prefix-swap", "paged-auto-parallel", "orca-pow2"])
def test_runs_taken_without_their_plan_match_single_steps(name):
    """advance_decode without a plan finds the batch itself (and drops the kept DecodeBatch)."""
    make, kwargs, must = CASES[name]
    stats = drive(make, workload(5, 60, max_len=make().config.max_model_len, **kwargs), with_plan=False)
    assert stats["runs"] >= 15 and stats["finished"] == 60, stats


def test_small_run_limit_matches_single_steps():
    stats = drive(maker(preemption="swap"), workload(3, 40, max_len=160), limit=3)
    assert stats["runs"] > 10


@pytest.mark.parametrize("name", ["paged-swap", "paged-prefix-swap", "paged-chunked", "orca-pow2"])
def test_runs_of_one_step_match_single_steps(name):
    make, kwargs, must = CASES[name]
    stats = drive(make, workload(4, 60, max_len=make().config.max_model_len, **kwargs), min_run=1)
    assert stats["runs"] >= 15 and stats["finished"] == 60, stats
    for key in must:
        assert stats[key] > 0, (key, stats)


# -- decode_horizon in named situations ---------------------------------------------------------
def req(rid, prompt, output, n=1, ids=None):
    return Request(rid, prompt, SamplingParams(n=n, max_tokens=output, ignore_eos=True), 0.0, ids)


def steps(sched, k, t0=0):
    outs = []
    for i in range(k):
        out = sched.schedule(float(t0 + i))
        outs.append((out, sched.update(out, step_result(out), float(t0 + i + 1))))
    return outs


def test_horizon_ends_with_the_finishing_step():
    s = maker(blocks=40)()
    s.add_request(req(0, 5, 6))
    steps(s, 1)  # prefill: 6 tokens, the first output appended
    # outputs 2..5 are plain decodes; the step producing output 6 finishes the request and ends the run
    assert decode_horizon(s, LIMIT) == 5
    outs = steps(s, 5, t0=1)
    assert all(not done for _, done in outs[:4])
    assert [g.request_id for g in outs[4][1]] == [0]


def test_horizon_is_the_shortest_remaining_output():
    s = maker(blocks=40)()
    s.add_request(req(0, 5, 30))
    s.add_request(req(1, 9, 4))
    steps(s, 1)
    assert decode_horizon(s, LIMIT) == 3  # request 1 finishes at its third decode step
    assert decode_horizon(s, 1) == 1


def test_horizon_zero_while_a_waiting_request_could_be_admitted():
    s = maker(blocks=40)()
    s.add_request(req(0, 8, 30))
    steps(s, 1)
    assert decode_horizon(s, LIMIT) >= 2
    s.add_request(req(1, 8, 5))
    assert decode_horizon(s, LIMIT) == 0
    out, _ = steps(s, 1, t0=1)[0]
    assert [g.request_id for g in out.groups] == [1]  # the slow path admits it indeed


@pytest.mark.parametrize("blocker", ["memory", "max_num_seqs"])
def test_horizon_runs_while_the_waiting_head_cannot_start(blocker):
    s = maker(blocks=8, max_seqs=1 if blocker == "max_num_seqs" else 8)()
    s.add_request(req(0, 17, 12))  # 5 blocks after its prefill; 12 tokens more fit in 8 blocks
    steps(s, 1)
    s.add_request(req(1, 16 if blocker == "memory" else 1, 4))  # 4 blocks: only 3 are free
    h = decode_horizon(s, LIMIT)
    assert h == 11  # to the step that finishes request 0
    outs = steps(s, h, t0=1)
    for out, done in outs:
        assert [g.request_id for g in out.groups] == [0]
    assert all(not done for _, done in outs[:-1]) and [g.request_id for g in outs[-1][1]] == [0]


@pytest.mark.parametrize("prompt, expect_copy", [(10, True), (8, False)])
def test_horizon_zero_when_a_forked_last_block_is_shared(prompt, expect_copy):
    s = maker(blocks=40, preemption="auto")()
    s.add_request(req(0, prompt, 20, n=2))
    steps(s, 1)  # prefill, then both samples share every prompt block
    seqs = s.running[0].seqs
    assert len(seqs) == 2 and seqs[0].block_table == seqs[1].block_table
    h = decode_horizon(s, LIMIT)
    out, _ = steps(s, 1, t0=1)[0]
    if expect_copy:  # the last block is partly filled and shared: the next step copies it
        assert h == 0 and len(out.blocks_to_copy) == 1
    else:  # the prompt fills its blocks exactly: each sample opens a block of its own
        assert h >= 2 and not out.blocks_to_copy
        assert decode_horizon(s, LIMIT) >= 2  # after the copy, runs are possible again


def test_horizon_ends_exactly_where_a_preemption_starts():
    # 12 blocks of 4: two requests of 9 prompt tokens hold 3 blocks each after the prefill
    s = maker(blocks=12, preemption="recompute")()
    s.add_request(req(0, 9, 30))
    s.add_request(req(1, 9, 30))
    steps(s, 1)
    assert s.kv.num_free_blocks == 6
    # decode step j writes position 9 + j; each sequence opens a block at positions 12, 16, 20
    # (steps 3, 7, 11), which takes the 6 free blocks; the next opens at 24, step 15
    h = decode_horizon(s, LIMIT)
    assert h == 15
    outs = steps(s, h + 1, t0=1)
    assert all(not out.preempted and not done for out, done in outs[:h])
    assert [(g.request_id, mode) for g, mode in outs[h][0].preempted] == [(1, "recompute")]


def test_horizon_zero_when_a_swapped_group_can_come_back():
    # A and C decode long, B short; C (the newest) is swapped out when the blocks run out, and
    # can come back once B has finished and freed its blocks
    s = maker(blocks=12, preemption="swap")()
    s.add_request(req(0, 9, 30))
    s.add_request(req(1, 9, 14))
    s.add_request(req(2, 9, 30))
    steps(s, 1)
    seen_blocked = False
    for t in range(1, 40):
        if s.swapped and s.running:
            if s.kv.can_swap_in(s.swapped[0]):
                break
            seen_blocked = seen_blocked or decode_horizon(s, LIMIT) >= 2  # swapped, but cannot come back yet
        steps(s, 1, t0=t)
    else:
        pytest.fail("no state with a swapped group that can come back")
    assert seen_blocked
    assert [g.request_id for g in s.swapped] == [2]
    assert decode_horizon(s, LIMIT) == 0
    out, _ = steps(s, 1, t0=100)[0]
    assert out.blocks_to_swap_in


def test_horizon_zero_at_the_last_one_token_prefill_chunk():
    # chunked prefill of 25 tokens with a budget of 24: the last chunk is a single token, which
    # looks like a decode but produces the request's *first* token (first_token_time is set)
    s = maker(chunked=True, batched=24)()
    s.add_request(req(0, 25, 10))
    steps(s, 1)
    seq = s.running[0].seqs[0]
    assert (seq.num_computed_tokens, seq.num_tokens) == (24, 25)
    assert decode_horizon(s, LIMIT) == 0
    steps(s, 1, t0=1)
    assert s.running[0].first_token_time == 2.0
    assert decode_horizon(s, LIMIT) == 9


def test_prefix_blocks_registered_during_a_run_are_visible_after_it():
    """A and B share a prompt and are prefilled together, so only A's blocks enter the prefix
    cache. A finishes; while B decodes, B's new blocks evict A's cached block of the prompt's
    second block; single steps then register B's copy of it (on_computed after every step). C,
    with the same prompt, arrives right after: it must hit both blocks with the fast path too."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    reqs = [(0, req(0, 9, 2, ids=prompt)), (0, req(1, 9, 40, ids=prompt)),
            (0, req(2, 8, 3, ids=[50 + i for i in range(8)])), (38, req(3, 9, 5, ids=prompt))]
    make = maker(blocks=16, caching=True)
    stats = drive(make, reqs)
    assert stats["runs"] >= 1
    ref = Driver(make(), reqs)
    while ref.pending or ref.s.has_unfinished:
        ref.add_arrivals()
        ref.step()
    c = next(g for g in ref.finished if g.request_id == 3)
    assert c.num_cached_prompt_tokens == 8  # the premise: B's block was registered in time


# KV cache groups: a full table and two sliding tables of different windows (one smaller than a
# block), so that windows free blocks during runs, in the order single steps free them.
HYBRID = (KVGroupSpec("full", 1), KVGroupSpec("sliding", 1, 3), KVGroupSpec("sliding", 1, 11))
HYBRID_CASES = {
    "hybrid-recompute": (maker(blocks=110, kv_groups=HYBRID), {}, ("preemptions",)),
    "hybrid-swap-parallel": (maker(preemption="auto", blocks=200, max_len=100, batched=300,
                                   kv_groups=(KVGroupSpec("full", 1), KVGroupSpec("sliding", 2, 30))),
                             {"n_choices": (1, 2, 3), "max_prompt": 50, "max_output": 50}, ("preemptions", "swapped_blocks")),
    "hybrid-prefix": (maker(caching=True, blocks=110, kv_groups=HYBRID), {"token_ids": True}, ("preemptions", "prefix_hits")),
    "hybrid-chunked-prefix": (maker(chunked=True, batched=24, max_seqs=16, caching=True, preemption="auto", blocks=150,
                                    max_len=128, kv_groups=HYBRID),
                              {"token_ids": True, "n_choices": (1, 2)}, ("preemptions", "prefix_hits")),
    "sliding-only": (maker(blocks=40, kv_groups=(KVGroupSpec("sliding", 2, 21),)), {}, ("preemptions",)),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(HYBRID_CASES))
def test_fast_path_matches_single_steps_with_kv_groups(name, seed):
    make, kwargs, must = HYBRID_CASES[name]
    assert make().kv.num_tables == (1 if name == "sliding-only" else 3)
    stats = drive(make, workload(seed, 60, max_len=make().config.max_model_len, **kwargs), tight=False)
    # (runs end where a window frees a block while a group waits, so they are shorter)
    assert stats["runs"] >= 10 and stats["run_steps"] >= 40, stats
    assert stats["finished"] == 60 and stats["kept_batch_plans"] >= 5, stats
    for key in must:
        assert stats[key] > 0, (key, stats)


@pytest.mark.parametrize("name", ["paged-chunked", "paged-chunked-prefix-swap", "paged-roomy-bs16", "paged-swap"])
@pytest.mark.spies_on_core  # (counts DecodeBatch's calls)
def test_steps_that_schedule_the_kept_batch_whole_match_single_steps(name, monkeypatch):
    """A step after which the kept DecodeBatch decodes schedules it in one go where none of it can
    be preempted (DecodeBatch.scheduled_whole), and update() takes its tokens in one go
    (updated_whole); drive() holds each such step's output (with the groups' sample_seq_ids) and the
    core state to the reference's, whose scheduler keeps no batch and goes group by group."""
    answers = []
    whole = DecodeBatch.scheduled_whole

    def counted(self, *args):
        answers.append(whole(self, *args))
        return answers[-1]

    monkeypatch.setattr(DecodeBatch, "scheduled_whole", counted)
    updated = []
    update_whole = DecodeBatch.updated_whole

    def counted_update(self, *args):
        updated.append(update_whole(self, *args))
        return updated[-1]

    monkeypatch.setattr(DecodeBatch, "updated_whole", counted_update)  # (with prefix caching too)
    make, kwargs, _ = CASES[name]
    stats = drive(make, workload(6, 60, max_len=make().config.max_model_len, **kwargs), min_run=3)
    assert stats["finished"] == 60, stats
    assert sum(answers) >= 10, (sum(answers), len(answers))  # batches taken whole
    assert sum(map(bool, updated)) >= 10, (updated.count(0), len(updated))  # and updated whole

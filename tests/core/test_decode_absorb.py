"""Decode runs that go on past finishes (plan_decode's absorb_finishes, advance_decode's stretches)
against single steps.

As in test_decode_fastpath.py, two identical schedulers get the same requests at the same step
indices; the reference always steps. The fast one plans with absorb_finishes up to the next
arrival, so where nothing is queued its runs go on past the steps in which groups finish. Each
of the reference's steps must then be a plain decode of the batch still running (one token per
sequence, nothing admitted, swapped or preempted), its finishes those the run says finished at
that step, at that step's end; the blocks in use after each step, and after the run the whole
core state (queues, block tables, tokens, times, the free queue's order, refcounts), the same.
"""

from __future__ import annotations

import pytest

from pagesim.core import KVGroupSpec, Request, SamplingParams
from pagesim.core import decode_runs
from pagesim.core.decode_runs import advance_decode, plan_decode
from pagesim.core.paged import PagedKVManager
from tests.core.fastpath_support import LIMIT, Driver, _copy, at_work, core_state, group_state, maker, step_result, workload


def is_decode_of(out, batch: list[int]) -> bool:
    return (not out.preempted and not out.blocks_to_swap_in and not out.blocks_to_swap_out and not out.blocks_to_copy
            and out.num_prefill_tokens == 0 and [s.seq_id for s in out.seqs] == batch
            and all(n == 1 for n in out.num_new_tokens))


def drive_absorbing(make, requests) -> dict:
    fast = Driver(make(), [(t, _copy(r)) for t, r in requests])
    ref = Driver(make(), [(t, _copy(r)) for t, r in requests])
    stats = {"runs": 0, "past_finishes": 0, "steps": 0}
    while fast.pending or fast.s.has_unfinished:
        if not at_work(fast, ref):
            continue
        to_arrival = LIMIT if fast.next_arrival is None else fast.next_arrival - fast.t
        plan = plan_decode(fast.s, LIMIT, absorb_finishes=to_arrival)
        steps = min(plan.num_steps, to_arrival) if plan else 0
        if steps < 2:
            out_f, done_f = fast.step()
            out_r, done_r = ref.step()
            assert [g.request_id for g in done_f] == [g.request_id for g in done_r]
            stats["steps"] += 1
            continue
        if plan.stretches is not None:  # the stretches' sizes and contexts, as the reference will decode them
            assert plan.stretches[-1][0] == plan.num_steps
        ends = [float(fast.t + j + 1) for j in range(steps)]
        run = advance_decode(fast.s, steps, 7, ends[-1], plan, ends)
        fast.t += steps
        fast.finished.extend(run.finished)
        left = run.left_at or [steps] * len(run.finished)
        for j in range(steps):
            batch = ref.batch()
            context = sum(s.num_tokens for g in ref.s.running for s in g.seqs)
            out, done = ref.step()
            assert is_decode_of(out, batch), f"t={ref.t - 1}: step {j} of a run of {steps} is not a plain decode"
            if plan.stretches is not None:  # the durations of the step come from these
                start, num_seqs, stretch_context = next(s for s in enumerate_stretches(plan) if s[0] > j)[1:]
                assert (len(batch), context) == (num_seqs, stretch_context + (j - start) * num_seqs)
            assert [g.request_id for g in done] == [g.request_id for g, at in zip(run.finished, left) if at == j + 1]
            assert run.kv_blocks_used[j] == ref.s.kv.num_used_blocks
        assert run.num_seqs == len(batch)
        stats["runs"] += 1
        stats["past_finishes"] += sum(1 for at in left if at < steps)
        assert fast.t == ref.t
        assert core_state(fast.s) == core_state(ref.s)
    assert [group_state(g) for g in fast.finished] == [group_state(g) for g in ref.finished]
    stats["finished"] = sum(1 for g in ref.finished if not g.reject_reason)
    stats["preemptions"] = ref.s.num_preemptions
    return stats


def enumerate_stretches(plan):
    """(end, start, sequences, context at the start) of each stretch: step j (from 0) of the run is
    in the first whose end is past j, and reads context + (j - start) * sequences tokens."""
    start = 0
    for end, num_seqs, context in plan.stretches:
        yield end, start, num_seqs, context
        start = end


# sparse arrivals (a request every ~25 steps), so that batches often run with nobody waiting and
# several of their groups finish before the next arrival
CASES = {
    "paged-recompute": (maker(), {}),
    "paged-swap": (maker(preemption="swap", blocks=40), {}),
    "paged-bs16": (maker(blocks=60, bs=16, max_seqs=16), {}),
    "paged-chunked": (maker(chunked=True, batched=24, max_seqs=16), {}),
    "two-tables": (maker(blocks=110, kv_groups=(KVGroupSpec("full", 1), KVGroupSpec("full", 1))), {}),
    "orca-max": (maker("orca-max", blocks=100, max_len=128), {"max_prompt": 60, "max_output": 60}),
    # parallel samples: absorbed only while no group of the batch has forked
    "parallel": (maker(preemption="auto", blocks=80, max_len=100, batched=300),
                 {"n_choices": (1, 2, 3), "max_prompt": 50, "max_output": 50}),
    # prefix caching: its registrations at each stretch's end, as separate runs make them
    "prefix": (maker(caching=True), {"token_ids": True}),
    # never absorbed (a sliding window frees sequence by sequence)
    "sliding": (maker(blocks=110, kv_groups=(KVGroupSpec("full", 1), KVGroupSpec("sliding", 1, 11))), {}),
}
NEVER_ABSORBED = ("sliding",)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(CASES))
def test_runs_past_finishes_match_single_steps(name, seed):
    make, kwargs = CASES[name]
    stats = drive_absorbing(make, workload(seed, 50, max_len=make().config.max_model_len, mean_gap=25, **kwargs))
    assert stats["finished"] == 50 and stats["runs"] >= 10, stats
    if name in NEVER_ABSORBED:
        assert stats["past_finishes"] == 0, stats
    else:
        assert stats["past_finishes"] >= (2 if name == "parallel" else 15), stats


def test_a_run_past_finishes_stops_for_a_waiting_group():
    """Nothing is absorbed while a group waits: a finish could let it start."""
    sched = maker(blocks=40, max_seqs=2)()
    for rid, (prompt, output) in enumerate([(9, 6), (9, 30), (9, 10)]):
        sched.add_request(Request(rid, prompt, SamplingParams(max_tokens=output, ignore_eos=True), 0.0))
    out = sched.schedule(0.0)  # two admitted (max_num_seqs 2), the third waits
    sched.update(out, step_result(out), 1.0)
    assert len(sched.running) == 2 and len(sched.waiting) == 1
    plan = plan_decode(sched, LIMIT, absorb_finishes=LIMIT)
    assert plan.stretches is None and plan.num_steps == plan.steps_to_first_finish == 5
    sched.waiting.clear()  # (the same batch with nobody waiting goes on past the finish)
    plan = plan_decode(sched, LIMIT, absorb_finishes=LIMIT)
    assert plan.num_steps == 29 and plan.stretches == [(5, 2, 20), (29, 1, 10 + 5)]


@pytest.mark.spies_on_core  # (counts PagedKVManager.on_decode_run and _advance_past_finishes)
def test_prefix_retries_register_inside_runs_past_finishes(monkeypatch):
    """A prompt block whose key another block held gets it once that block is evicted: runs past
    finishes register such retries at the end of a stretch, before the finished groups offer
    their blocks, as separate runs would; the whole cache (keys, blocks, evictions) then matches
    single steps (drive_absorbing compares it). Seed 3 makes such retries inside those runs."""
    registered, inside = [], []
    retry, past_finishes = PagedKVManager.on_decode_run, decode_runs._advance_past_finishes

    def counting(kv, seqs, num_steps, last_step=True):
        before = {s.seq_id: kv._unregistered.get(s.seq_id) for s in seqs}
        retry(kv, seqs, num_steps, last_step)
        registered.extend(i for i, r in before.items() if inside and r and kv._unregistered.get(i) != r)

    def marked(*args):
        inside.append(True)
        try:
            return past_finishes(*args)
        finally:
            inside.pop()

    monkeypatch.setattr(PagedKVManager, "on_decode_run", counting)
    monkeypatch.setattr(decode_runs, "_advance_past_finishes", marked)
    make, kwargs = CASES["prefix"]
    stats = drive_absorbing(make, workload(3, 50, max_len=make().config.max_model_len, mean_gap=25, **kwargs))
    assert stats["finished"] == 50 and stats["past_finishes"] >= 15 and registered, (stats, registered)

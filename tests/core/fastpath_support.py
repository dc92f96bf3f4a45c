"""What the decode fast-path tests share: state snapshots of a scheduler and its KV manager, a
driver that feeds requests at step indices, random workloads and scheduler makers
(tests/core/test_decode_fastpath.py, test_decode_absorb.py)."""

from __future__ import annotations

import random

from pagesim.core import (
    PagedKVManager, PoolConfig, Request, Sample, SamplingParams, SchedulerConfig, StepResult, make_scheduler,
)
from pagesim.core.decode_batch import INF
from pagesim.core.decode_runs import advance_decode, decode_horizon, plan_decode

TOKEN = 7  # the token every sequence appends (what the simulator does)
LIMIT = 10_000


def step_result(out) -> StepResult:
    """Like the simulator: one token per due sequence; parallel samples fork at their first."""
    samples = {}
    for g in out.groups:
        if g.sampling.n > 1 and len(g.seqs) == 1 and g.seqs[0].num_output_tokens == 0:
            samples[g.request_id] = [Sample(g.seqs[0].seq_id, TOKEN)] * g.sampling.n
    return StepResult(samples, default_token=TOKEN)


# -- state snapshots -------------------------------------------------------------------------
def seq_state(s):
    return (s.seq_id, s.status, tuple(s.block_table), s.num_computed_tokens, s.num_tokens, tuple(s.token_ids))


def group_state(g):
    return (g.request_id, g.first_scheduled_time, g.first_token_time, g.finish_time, g.num_preemptions,
            g.num_swaps, g.num_cached_prompt_tokens, tuple(seq_state(s) for s in g.seqs),
            tuple(seq_state(s) for s in g.finished_seqs))


def core_state(sched) -> dict:
    kv = sched.kv
    state = {
        "running": [group_state(g) for g in sched.running],
        "waiting": [group_state(g) for g in sched.waiting],
        "swapped": [group_state(g) for g in sched.swapped],
        "num_preemptions": sched.num_preemptions,
        "num_swapped_blocks": sched.num_swapped_blocks,
        "pending_copies": list(kv.pending_copies),
        "num_free": kv.num_free_blocks,
    }
    if hasattr(kv, "_tables"):  # KV cache groups: every table of every sequence
        state["tables"] = {seq_id: [tuple(t) for t in tables] for seq_id, tables in kv._tables.items()}
    if isinstance(kv, PagedKVManager):
        state.update(
            device_free_queue=list(kv.device.free_queue), device_refcount=list(kv.device.refcount),
            host_free_queue=list(kv.host.free_queue), host_refcount=list(kv.host.refcount),
            cached=dict(kv.device.cached), block_hash=list(kv.device.block_hash),
            evictions=kv.device.num_evictions, prefix=(kv.prefix_queries, kv.prefix_hits),
        )
    else:
        state.update(free_chunks=kv.allocator.free_chunks(), allocated_chunks=kv.allocator.allocated_chunks(),
                     reservations=sorted((k, vars(v)) for k, v in kv._reservation.items()))
    return state


def out_state(out, finished) -> tuple:
    return ([g.request_id for g in out.groups], [(s.seq_id, n) for s, n in zip(out.seqs, out.num_new_tokens)],
            out.num_prefill_tokens, out.num_prefill_seqs, out.prefill_attn_pairs, out.num_decode_seqs,
            out.decode_context_tokens, out.blocks_to_swap_in, out.blocks_to_swap_out,
            out.blocks_to_copy, [(g.request_id, mode) for g, mode in out.preempted], [g.request_id for g in finished],
            [list(g.sample_seq_ids) for g in out.groups])


def is_plain_decode(out, finished, batch: list[int], batch_after: list[int]) -> bool:
    """A step that only decodes the given sequences, one token each, and changes nothing else:
    no sequence finishes (batch_after, the running sequences after it, is the same batch)."""
    return (not out.preempted and not out.blocks_to_swap_in and not out.blocks_to_swap_out and not out.blocks_to_copy
            and not finished and out.num_prefill_tokens == 0 and [s.seq_id for s in out.seqs] == batch
            and all(n == 1 for n in out.num_new_tokens) and batch_after == batch)


# -- drivers ---------------------------------------------------------------------------------
class Driver:
    def __init__(self, sched, requests: list[tuple[int, Request]]):
        self.s = sched
        self.pending = list(requests)  # (arrival step, request), in order
        self.t = 0
        self.finished = []

    def add_arrivals(self) -> None:
        while self.pending and self.pending[0][0] <= self.t:
            _, req = self.pending.pop(0)
            g = self.s.add_request(req)
            if g.reject_reason:
                self.finished.append(g)

    @property
    def next_arrival(self) -> int | None:
        return self.pending[0][0] if self.pending else None

    def step(self):
        out = self.s.schedule(float(self.t))
        assert not out.is_empty, f"t={self.t}: requests are queued but nothing can run"
        done = self.s.update(out, step_result(out), float(self.t + 1))
        self.t += 1
        self.finished.extend(done)
        return out, done

    def batch(self) -> list[int]:
        return [s.seq_id for g in self.s.running for s in g.seqs]


def plan_view(sched, plan) -> tuple | None:
    """What a plan says, with the rooms spelled out (a plan on a kept DecodeBatch leaves them to it)."""
    if plan is None:
        return None
    rooms = plan.rooms if plan.rooms is not None else batch_rooms(plan.batch)
    return (plan.num_steps, plan.num_seqs, plan.context_tokens, plan.steps_to_first_finish,
            [s.seq_id for s in plan.seqs], list(plan.request_ids), list(rooms))


def batch_rooms(batch) -> list:
    """Each of the batch's sequences' steps until its next block, as the batch's own phases
    (DecodeBatch.due) say: filed under phase p, (p - clock) mod block_size; filed nowhere, INF."""
    rooms = {id(seq): (phase - batch.clock) % batch.block_size for phase, seqs in enumerate(batch.due) for seq in seqs}
    return [rooms.get(id(seq), INF) for seq in batch.seqs]


def fresh_plan(sched, limit: int):
    """plan_decode from the queues alone: the scheduler's DecodeBatch set aside, then put back."""
    kept = sched.decode_batch
    sched.decode_batch = None
    try:
        return plan_decode(sched, limit)
    finally:
        sched.decode_batch = kept


def drive(make, requests: list[tuple[int, Request]], limit: int = LIMIT, min_run: int = 2, tight: bool = True,
          with_plan: bool = True) -> dict:
    """Run the fast and the reference scheduler side by side, checking as described above
    (runs of min_run steps or more; the simulator takes runs of one step too). tight=False: a
    run may end early (a sliding window frees blocks during a run, which the horizon does not
    count on), so only its safety is checked. with_plan: hand advance_decode the plan (as the
    simulator does, keeping the scheduler's DecodeBatch from run to run), each plan checked
    against one made afresh from the queues; False: advance_decode finds the batch itself.
    Returns counts of what happened (runs, steps skipped, preemptions, ...)."""
    fast = Driver(make(), [(t, _copy(r)) for t, r in requests])
    ref = Driver(make(), [(t, _copy(r)) for t, r in requests])
    stats = {"runs": 0, "run_steps": 0, "steps": 0, "tight_checks": 0, "kept_batch_plans": 0,
             "batch_kept_through_steps": 0}
    expect_not_plain = False
    while fast.pending or fast.s.has_unfinished:
        if not at_work(fast, ref):
            expect_not_plain = False
            continue
        kept = fast.s.decode_batch is not None
        plan = plan_decode(fast.s, limit)
        assert plan_view(fast.s, plan) == plan_view(fast.s, fresh_plan(fast.s, limit))
        stats["kept_batch_plans"] += kept and plan is not None
        horizon = plan.num_steps if plan else 0
        assert horizon == decode_horizon(fast.s, limit) and 0 <= horizon <= limit
        to_arrival = None if fast.next_arrival is None else fast.next_arrival - fast.t
        steps = horizon if to_arrival is None else min(horizon, to_arrival)
        # a run the horizon itself ends (not the next arrival, not the limit)
        by_horizon = horizon < limit and (to_arrival is None or horizon < to_arrival)
        if steps >= min_run:
            assert not (expect_not_plain and tight), f"t={fast.t}: a run right after a run the horizon ended: not tight"
            batch = fast.batch()
            run = advance_decode(fast.s, steps, TOKEN, float(fast.t + steps), plan if with_plan else None)
            fast.t += steps
            fast.finished.extend(run.finished)
            assert run.num_steps == steps and run.num_seqs == len(batch)
            for j in range(steps):
                out, done = ref.step()
                if j == steps - 1:  # the last step may finish sequences: the same ones
                    assert [g.request_id for g in done] == [g.request_id for g in run.finished]
                    # (the batch after it may shrink by the finished ones; core_state compares it)
                    assert is_plain_decode(out, [], batch, batch), f"t={ref.t - 1}: the last step of a run is not a plain decode"
                else:
                    assert is_plain_decode(out, done, batch, ref.batch()), f"t={ref.t - 1}: step {j} of a run of {steps} is not a plain decode"
                assert run.kv_blocks_used[j] == ref.s.kv.num_used_blocks
            stats["runs"] += 1
            stats["run_steps"] += steps
            stats["run_finishes"] = stats.get("run_finishes", 0) + len(run.finished)
            # the run stopped at the horizon (not at an arrival, the limit or a finish): the next
            # step must differ
            expect_not_plain = by_horizon and not run.finished
        else:
            batch = ref.batch()
            kept_before = fast.s.decode_batch
            out_f, done_f = fast.step()
            # a step that decoded the kept batch by one token each keeps it (its clock moved on)
            stats["batch_kept_through_steps"] += kept_before is not None and fast.s.decode_batch is kept_before
            out_r, done_r = ref.step()
            assert out_state(out_f, done_f) == out_state(out_r, done_r)
            if expect_not_plain and tight:
                assert not is_plain_decode(out_r, done_r, batch, ref.batch()), f"t={ref.t - 1}: the horizon stopped a run early"
                stats["tight_checks"] += 1
            expect_not_plain = False
            stats["steps"] += 1
        assert fast.t == ref.t
        assert core_state(fast.s) == core_state(ref.s)
    assert [group_state(g) for g in fast.finished] == [group_state(g) for g in ref.finished]
    stats["preemptions"] = ref.s.num_preemptions
    stats["swapped_blocks"] = ref.s.num_swapped_blocks
    stats["finished"] = sum(1 for g in ref.finished if not g.reject_reason)
    if isinstance(ref.s.kv, PagedKVManager):
        stats["prefix_hits"] = ref.s.kv.prefix_hits
    return stats


def at_work(fast: Driver, ref: Driver) -> bool:
    """Both drivers take the arrivals due and must then hold the same core state; where neither
    has work, both jump to the next arrival (False: nothing to step at this point)."""
    fast.add_arrivals()
    ref.add_arrivals()
    assert core_state(fast.s) == core_state(ref.s)
    if not fast.s.has_unfinished:
        fast.t = ref.t = fast.next_arrival
        return False
    return True


def _copy(r: Request) -> Request:
    return Request(r.request_id, r.prompt_len, r.sampling, r.arrival_time,
                   None if r.prompt_token_ids is None else list(r.prompt_token_ids))


# -- random workloads ------------------------------------------------------------------------
TEMPLATES = [[(7 * i + j) % 50 + 1 for j in range(96)] for i in range(3)]


def workload(seed: int, num: int, *, max_len: int, n_choices=(1,), token_ids=False, mean_gap=3,
             max_prompt=70, max_output=70) -> list[tuple[int, Request]]:
    rng = random.Random(seed)
    t = 0
    out = []
    for i in range(num):
        t += rng.randint(0, 2 * mean_gap)
        prompt = rng.randint(1, max_prompt)
        output = rng.randint(1, min(max_output, max_len - prompt))
        ids = None
        if token_ids:  # shared prefixes of a few templates, then a private tail
            shared = min(prompt, rng.choice([0, 8, 17, 40, 96]))
            ids = TEMPLATES[rng.randrange(3)][:shared] + [rng.randint(60, 99) for _ in range(prompt - shared)]
        sampling = SamplingParams(n=rng.choice(n_choices), max_tokens=output, ignore_eos=True)
        out.append((t, Request(i, prompt, sampling, float(t), ids)))
    return out


def maker(policy="paged", *, blocks=48, host=64, bs=4, caching=False, preemption="recompute", chunked=False,
          max_len=160, batched=None, max_seqs=8, allocator="buddy", kv_groups=None):
    batched = batched or max_len
    pool = PoolConfig(blocks, host, bs, caching, allocator, kv_groups=kv_groups)
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=batched, max_model_len=max_len,
                          preemption_mode=preemption, chunked_prefill=chunked)
    return lambda: make_scheduler(policy, pool, cfg)



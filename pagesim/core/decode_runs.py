"""Runs of plain decode steps, taken in one go: the simulator's fast path.

Between two events that change the batch (an admission, a swap, a preemption, a copy, a finish)
a serving engine repeats the same step: every running sequence computes one token and appends
one. Where a driver's tokens cannot stop a sequence early (no EOS: the simulator), the core can
say in advance how many such steps follow (`plan_decode`) and take them at once
(`advance_decode`), leaving exactly the state that one `schedule()`/`update()` per step would
leave: the same block ids in the same order, the same prefix-cache registrations, the same
finishes. tests/core/test_decode_fastpath.py holds it to that, step by step.

It asks the KV manager one question, `steps_until_new_block(seq)` (for a whole batch at once:
`steps_until_new_blocks`), and takes a run's new blocks in one `append_blocks(seqs)`; the
scheduler's own rules decide whether a queued group could start.
The executor never runs this: it samples real tokens, which may be EOS.
"""

from __future__ import annotations

import math
from itertools import accumulate
from dataclasses import dataclass, field

from pagesim.core.decode_batch import (INF, DecodeBatch, decode_steps, drop_finished, drop_positions, no_phases,
                                       stopped_positions)
from pagesim.core.kv_manager import KVCacheManager
from pagesim.core.native import Number
from pagesim.core.request import Sequence, SequenceGroup
from pagesim.core.scheduler import Scheduler


# (one of each per event: init=False and an __init__ of its own, which mypyc compiles, not the
# one dataclasses would write; see pagesim.core.step.BatchShape. The parameters are the fields,
# in order, with their defaults.)
@dataclass(slots=True, init=False)
class DecodePlan:
    """The next num_steps steps are plain decode steps of num_seqs sequences; the first reads
    context_tokens tokens of context, and each step one more per sequence."""

    num_steps: int
    num_seqs: int
    context_tokens: int
    # the running sequences in batch order, and the steps until each needs a new block (as
    # steps_until_new_block said when planned; None where the batch keeps them): advance_decode
    # takes them from here
    seqs: list = field(repr=False, compare=False)
    rooms: list | None = field(repr=False, compare=False)
    # steps until the first sequence stops (a run shorter than that finishes nobody), and the
    # running requests' ids in order
    steps_to_first_finish: Number = field(repr=False, compare=False)
    request_ids: list = field(repr=False, compare=False)
    batch: "DecodeBatch | None" = field(repr=False, compare=False)
    # a run that goes on past finishes (plan_decode's absorb_finishes): (step count at its end,
    # sequences decoding, context tokens at its first step) for each stretch between finishes,
    # the last ending at num_steps; None for a run of one batch throughout
    stretches: list | None = field(repr=False, compare=False)

    def __init__(self, num_steps: int, num_seqs: int, context_tokens: int, seqs: list | None = None,
                 rooms: list | None = None, steps_to_first_finish: Number = INF, request_ids: list | None = None,
                 batch: "DecodeBatch | None" = None, stretches: list | None = None) -> None:
        self.num_steps = num_steps
        self.num_seqs = num_seqs
        self.context_tokens = context_tokens
        self.seqs = [] if seqs is None else seqs
        self.rooms = rooms
        self.steps_to_first_finish = steps_to_first_finish
        self.request_ids = [] if request_ids is None else request_ids
        self.batch = batch
        self.stretches = stretches


@dataclass(slots=True, init=False)
class DecodeRun:
    """What advance_decode() did: num_steps decode steps (what they read is the DecodePlan's)."""

    num_steps: int
    num_seqs: int  # sequences decoded at its last step
    kv_blocks_used: list[int]  # after each step
    finished: list[SequenceGroup]  # groups that finished, in the order they did
    # for a run that went on past finishes: (steps taken when groups left, sequences decoding
    # until then, running groups and logical less used blocks just after) for each such step
    # before the last, and for each finished group the steps taken when it left
    finishes: list | None
    left_at: list | None

    def __init__(self, num_steps: int, num_seqs: int, kv_blocks_used: list[int], finished: list[SequenceGroup],
                 finishes: list | None = None, left_at: list | None = None) -> None:
        self.num_steps = num_steps
        self.num_seqs = num_seqs
        self.kv_blocks_used = kv_blocks_used
        self.finished = finished
        self.finishes = finishes
        self.left_at = left_at


def decode_horizon(sched: Scheduler, limit: int) -> int:
    """How many of the next steps (at most limit) are certain to be plain decode steps of
    today's running batch: every running sequence computes exactly one token, and nothing is
    admitted, swapped in, preempted or copied; sequences may finish only at the last of them."""
    plan = plan_decode(sched, limit)
    return plan.num_steps if plan else 0


def plan_decode(sched: Scheduler, limit: int, absorb_finishes: int = 0) -> DecodePlan | None:
    """decode_horizon() with the batch it would decode (None where the horizon is 0).
    absorb_finishes: where nothing is queued, plan past the steps in which groups finish (their
    blocks freed could start nobody), up to that many steps in all, for a driver whose only
    reader of a finish in mid-run is the run's own record (the simulator without per-finish
    hooks, which knows about how many steps its run will take): the plan's stretches say how
    the batch shrinks. Not where the KV manager frees blocks per sequence as it decodes (a sliding
    window) or where groups have forked; prefix caching's registrations are made at the end of
    each stretch, as a run of its own would make them."""
    if not sched.running or limit < 1:
        return None
    kv = sched.kv
    if kv.pending_copies:
        return None  # fork copies (reservation managers) go out with the next step
    batch = _current_batch(sched)
    if batch is None:
        return None
    seqs, clock = batch.seqs, batch.clock
    num_seqs = len(seqs)  # (every group has forked: this is sched.num_running_seqs)
    if (sched.waiting or sched.swapped) and _queued_group_could_start(sched, num_seqs):
        return None
    first_stop, last_stop = _first_and_last(batch.finish_at)
    to_finish = first_stop - clock
    horizon = min(limit, to_finish)  # a run may end with the step in which sequences finish, not go past it
    absorbs = (to_finish < min(limit, absorb_finishes) and not (sched.waiting or sched.swapped) and not batch.forked
               and batch.due is not None and not kv.frees_while_decoding)
    if absorbs:
        # (blocks are counted below as if nobody left: on the safe side)
        horizon = min(limit, absorb_finishes, last_stop - clock)
    if kv.frees_while_decoding and (sched.waiting or sched.swapped):
        # a sliding window's freed block could let a queued group start: end with the step that frees one
        frees = kv.steps_until_window_frees(seqs)  # (inf where none will)
        if frees < horizon:
            horizon = int(frees)
    due = batch.due
    rooms = kv.steps_until_new_blocks(seqs) if due is None else None
    bs = kv.block_size
    if batch.forked:
        tables = kv.num_token_tables  # a new block of a sequence is one per token table
        taking_now = due[clock % bs] if due is not None else ()  # (room 0: a block at the next step)
        for i in batch.forked:
            takes = rooms[i] == 0 if rooms is not None else seqs[i] in taking_now
            if kv.blocks_needed(seqs[i], 1) > takes * tables:
                return None  # a shared last block must be copied first
    # The longest run whose new blocks all fit: past it, some step would preempt.
    free = kv.num_free_blocks // kv.num_token_tables  # (blocks a sliding window frees meanwhile are not counted on)
    # (each sequence opens at most horizon // bs + 1 blocks: often that settles it unsummed)
    if num_seqs * (horizon // bs + 1) <= free:
        return _plan(batch, horizon, rooms, to_finish, absorbs)
    # the steps (from 0) at which sequences take their first new block, each with how many do
    opens = [(room, 1) for room in rooms if room != INF] if rooms is not None else batch.first_blocks()

    def blocks_for(steps: int) -> int:
        return sum(((steps - 1 - first) // bs + 1) * count for first, count in opens if first < steps)

    if blocks_for(horizon) <= free:
        return _plan(batch, horizon, rooms, to_finish, absorbs)
    lo, hi = 0, horizon
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if blocks_for(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return _plan(batch, lo, rooms, to_finish, absorbs) if lo else None


def _plan(batch: DecodeBatch, horizon: int, rooms: list | None, to_finish: int, absorbs: bool) -> DecodePlan:
    plan = DecodePlan(horizon, len(batch.seqs), batch.context, batch.seqs, rooms, to_finish, batch.request_ids, batch)
    if absorbs and to_finish < horizon:
        plan.stretches = _stretches(batch, horizon)
    return plan


def _stretches(batch: DecodeBatch, horizon: int) -> list[tuple[int, int, int]]:
    """DecodePlan.stretches of a run of horizon steps: the batch shrinks after each step in which
    groups finish (each of one sequence: the batch has no forks), by those sequences and the
    tokens they hold by then."""
    clock = batch.clock
    leaving: dict[int, list[int]] = {}  # steps until they stop -> [sequences, their tokens now]
    for stop, seq in zip(batch.finish_at, batch.seqs):
        if stop - clock < horizon:
            counts = leaving.setdefault(stop - clock, [0, 0])
            counts[0] = counts[0] + 1
            counts[1] = counts[1] + seq.num_tokens
    stretches = []
    start, num_seqs, context = 0, len(batch.seqs), batch.context
    for at in sorted(leaving):
        stretches.append((at, num_seqs, context))
        gone, tokens = leaving[at]
        context += (at - start) * num_seqs - tokens - at * gone  # (each has at tokens more by then)
        num_seqs -= gone
        start = at
    stretches.append((horizon, num_seqs, context))
    return stretches


def _current_batch(sched: Scheduler) -> DecodeBatch | None:
    """The scheduler's DecodeBatch brought up to the running queue (built afresh where it was
    dropped, or where groups left or came in ahead of its end), or None if some running group
    is not a plain decode."""
    running, batch = sched.running, sched.decode_batch
    if batch is None or running[:len(batch.groups)] != batch.groups:
        sched.decode_batch = None
        added = _plain_decodes(sched, running, 0)
        if added is None:
            return None
        seqs, request_ids, forked, context, to_finish = added
        kv = sched.kv
        batch = DecodeBatch(list(running), seqs, request_ids, forked, context, 0, to_finish,
                            no_phases(kv.block_size) if kv.rooms_follow_appends else None, kv.block_size)
        if batch.due is not None:
            batch.file_due(seqs, kv.steps_until_new_blocks(seqs))
        sched.decode_batch = batch
        return batch
    if len(running) == len(batch.groups):
        return batch
    new = running[len(batch.groups):]
    added = _plain_decodes(sched, new, len(batch.seqs))
    if added is None:
        return None
    seqs, request_ids, forked, context, to_finish = added
    clock = batch.clock
    # (new lists, not appends: the plan of the run before may still be read)
    batch.groups = batch.groups + new
    batch.seqs = batch.seqs + seqs
    batch.request_ids = batch.request_ids + request_ids
    batch.forked = batch.forked + forked
    batch.context += context
    batch.finish_at = batch.finish_at + [clock + steps for steps in to_finish]
    if batch.due is not None:
        batch.file_due(seqs, sched.kv.steps_until_new_blocks(seqs))
    sched.decode_batch = batch
    return batch


def _plain_decodes(sched: Scheduler, groups: list[SequenceGroup], first_position: int) -> tuple | None:
    """For running groups that are all plain decodes (every sequence computes exactly its one
    new token, and nothing can stop it early): their sequences, request ids, positions of
    sequences of groups of several (from first_position), tokens, and steps until each group
    stops. None if one is not."""
    check_eos = sched.config.eos_token_id is not None
    context = 0
    seqs: list[Sequence] = []
    request_ids: list[int] = []
    to_finish: list[int] = []
    forked: list[int] = []  # only forks share a partly filled last block
    for group in groups:
        request = group.request
        sampling = request.sampling
        if (check_eos and not sampling.ignore_eos) or sampling.beam_width > 1 or group.first_token_time is None:
            # EOS could stop a sequence early; beams fork and drop every step; parallel samples
            # fork at their first token, and a last prefill chunk of one token looks like a
            # decode but produces the first token
            return None
        request_ids.append(request.request_id)
        group_seqs = group.seqs
        if len(group_seqs) == 1:  # (most groups: the loop below, unrolled)
            seq = group_seqs[0]
            num_tokens = seq.num_tokens
            if num_tokens - seq.num_computed_tokens != 1:
                return None  # still in prefill
            context += num_tokens
            to_finish.append(group.stop_len - num_tokens)
            seqs.append(seq)
            continue
        position = first_position + len(seqs)
        forked.extend(range(position, position + len(group_seqs)))
        longest = 0
        for seq in group_seqs:
            num_tokens = seq.num_tokens
            if num_tokens - seq.num_computed_tokens != 1:
                return None  # still in prefill
            context += num_tokens
            longest = max(longest, num_tokens)
            seqs.append(seq)
        to_finish.append(group.stop_len - longest)
    return seqs, request_ids, forked, context, to_finish


def _queued_group_could_start(sched: Scheduler, num_seqs: int) -> bool:
    """Could the head of the swapped or waiting queue start at the next step, beside the
    num_seqs running sequences? Admission and swap-in only get harder while decoding takes
    memory: if they cannot start now, they cannot start during a run either."""
    cfg = sched.config
    may_admit = sched.waiting and not sched.swapped and cfg.batching == "iteration"
    if not (sched.swapped or may_admit):
        return False
    budget = cfg.max_num_batched_tokens - num_seqs
    if sched.swapped and sched.can_swap_in(sched.swapped[0], num_seqs, budget if cfg.chunked_prefill else math.inf):
        return True
    if not may_admit:
        return False
    if not cfg.chunked_prefill:
        # schedule() starts from this answer (Scheduler.last_admission), asked here once
        return sched.admission(sched.waiting[0], cfg.max_num_batched_tokens, num_seqs) is not None
    # (a chunked step drops it: its running groups take their blocks first)
    group = sched.waiting[0]
    return surely_admits(sched, group, budget, num_seqs) or sched.admission(group, budget, num_seqs) is not None


def surely_admits(sched: Scheduler, group: SequenceGroup, budget: Number, num_seqs: int) -> bool:
    """A cheap test that is never wrong when it says yes: sched.admission() would start the
    group. (The head of the queue mostly can start, and schedule() asks admission() right
    after: no need to ask it twice.)"""
    if group.request.prompt_kv_moved or num_seqs + group.max_num_seqs > sched.config.max_num_seqs:
        return False  # (a P/D hand-off: admission's own rule)
    if not sched.config.chunked_prefill and sum(seq.num_tokens for seq in group.seqs) > budget:
        return False  # (prefix hits only lower the tokens to compute)
    return sched.kv.surely_admits(group)


def advance_decode(sched: Scheduler, num_steps: int, token_id: int, now: Number, plan: DecodePlan | None = None,
                   step_ends: list | None = None) -> DecodeRun:
    """Take num_steps plain decode steps (num_steps <= decode_horizon()) in one go, every
    sequence appending token_id each step; now is when the last step ends. New blocks are taken
    in the order single steps would take them (step by step, in running order), so block ids
    come out the same; sequences that stop at the last step finish as update() would finish them.
    plan: plan_decode()'s answer for the state as it is now, if the caller has it (saves asking
    again, and keeps the scheduler's DecodeBatch for the next plan). A plan with stretches that
    this run goes past the first finish of needs step_ends, when each step ends (a group that
    finishes in mid-run finishes then)."""
    if plan is not None and plan.stretches is not None and num_steps > plan.steps_to_first_finish:
        assert step_ends is not None
        return _advance_past_finishes(sched, num_steps, token_id, plan, step_ends)
    seqs: list
    rooms: list | None
    to_finish: Number
    batch: DecodeBatch | None
    kv = sched.kv
    bs = kv.block_size
    sched.last_admission = None  # the run takes blocks and frees the finished groups'
    if plan is None:
        sched.decode_batch = None  # (not kept by a run taken without its plan)
        batch = None
        seqs = [seq for group in sched.running for seq in group.seqs]
        rooms = kv.steps_until_new_blocks(seqs)
        to_finish = 0  # unknown: look for finished groups
    else:
        seqs, rooms, to_finish, batch = plan.seqs, plan.rooms, plan.steps_to_first_finish, plan.batch
    used = kv.num_used_blocks
    num_seqs = len(seqs)
    # the sequences that take a block, in the order single steps take them (step by step, in
    # running order), and how many take one at each step
    if rooms is None:  # (the batch files them by phase)
        assert batch is not None
        taking, opened = batch.blocks_taken(num_steps)
    else:
        # each new block as step * num_seqs + position in the batch: sorted, that is the order
        opens: list[int] = []
        stop = num_steps * num_seqs
        stride = bs * num_seqs
        for order, first in enumerate(rooms):
            if first < num_steps:
                opens.extend(range(first * num_seqs + order, stop, stride))
        opens.sort()
        opened = [0] * num_steps
        for at in opens:
            opened[at // num_seqs] += 1
        taking = [seqs[at % num_seqs] for at in opens]
    if batch is not None:
        batch.move_on(num_steps)
    decode_steps(seqs, num_steps, token_id)
    blocks_used = _take_blocks(kv, taking, opened, used)
    finishing = num_steps >= to_finish
    # A window's frees at the last step go group by group between the finishes, as update() does
    # (needless while every sequence is still inside the first block of its windows)
    last_apart = finishing and kv.frees_while_decoding and kv.windows_passed(seqs)
    if kv.tracks_computed:
        # update() calls on_computed after every step: a prompt block whose cached twin was
        # evicted during the run gets registered, and a sliding window frees what it left
        # behind, as single steps would have done
        freed = kv.on_decode_run(seqs, num_steps, last_step=not last_apart)
        if freed:
            for step, total in enumerate(accumulate(freed)):
                blocks_used[step] -= total
    finished: list[SequenceGroup] = []
    if finishing:
        if last_apart:
            stopping = list(sched.running)
        elif batch is not None:  # (the batch knows when each group stops: batch.groups is sched.running)
            clock = batch.clock
            gone = stopped_positions(batch.finish_at, clock)
            stopping = [batch.groups[i] for i in gone]
        else:  # (sequences of a group grow in step: its first says whether it stops)
            stopping = [g for g in sched.running if g.seqs[0].num_tokens >= g.stop_len]
        for group in stopping:
            if last_apart:
                for seq in group.seqs:
                    kv.on_computed(seq)
            if group.seqs[0].num_tokens >= group.stop_len:
                sched.retire_stopped(group)
                sched.finish_if_done(group, now, finished)
        if finished and batch is not None:
            if last_apart or batch.forked or len(finished) != len(gone):
                drop_finished(sched, batch)
            else:
                drop_positions(batch, gone)
    blocks_used[-1] = kv.num_used_blocks  # after the last step's frees
    return DecodeRun(num_steps, num_seqs, blocks_used, finished)




def _advance_past_finishes(sched: Scheduler, num_steps: int, token_id: int, plan: DecodePlan,
                           step_ends: list) -> DecodeRun:
    """advance_decode() of a run that goes on past steps in which groups finish (an absorbing
    plan): stretch by stretch, each as a run of its own would go, the groups that stop at its last
    step leaving at its end. The free blocks are taken from the head of the free queue and the
    finished groups' return to its tail, so the blocks taken after a finish are the ones that
    separate runs would take. Sequences that decode to the run's end are brought up to it once,
    at the end; each that leaves, as it leaves (a manager that tracks computed tokens only
    retries prompt blocks while they decode, which reads no count that lags)."""
    kv, batch = sched.kv, plan.batch
    assert batch is not None  # (an absorbing plan keeps its batch)
    sched.last_admission = None  # the run takes blocks and frees the finished groups'
    tracks_computed = kv.tracks_computed
    blocks_used: list = []
    finished: list[SequenceGroup] = []
    left_at: list = []
    finishes: list = []
    used, taken = kv.num_used_blocks, 0
    while True:
        steps = min(_first_and_last(batch.finish_at)[0] - batch.clock, num_steps - taken)
        num_seqs = len(batch.seqs)
        taking, opened = batch.blocks_taken(steps)
        batch.move_on(steps)
        blocks_used += _take_blocks(kv, taking, opened, used)
        taken += steps
        gone = stopped_positions(batch.finish_at, batch.clock)
        if taken == num_steps:
            break
        decode_steps([batch.seqs[i] for i in gone], taken, token_id)
        if tracks_computed:  # (a retried prompt block registers before the finished offer theirs)
            kv.on_decode_run(batch.seqs, steps)
        _finish(sched, batch, gone, step_ends[taken - 1], finished)
        left_at += [taken] * len(gone)
        used = blocks_used[-1] = kv.num_used_blocks
        finishes.append((taken, num_seqs, len(sched.running), kv.num_logical_blocks - used))
    decode_steps(batch.seqs, num_steps, token_id)
    if tracks_computed:
        kv.on_decode_run(batch.seqs, steps)
    if gone:
        _finish(sched, batch, gone, step_ends[-1], finished)
        left_at += [num_steps] * len(gone)
    blocks_used[-1] = kv.num_used_blocks  # after the last step's frees
    return DecodeRun(num_steps, num_seqs, blocks_used, finished, finishes, left_at)


def _first_and_last(clocks: list[int]) -> tuple[int, int]:
    """min(clocks) and max(clocks) in one pass (native ints, compiled: min() and max() are generic
    calls). clocks is not empty (a batch's finish clocks)."""
    first = last = clocks[0]
    for clock in clocks:
        if clock < first:
            first = clock
        elif clock > last:
            last = clock
    return first, last


def _take_blocks(kv: KVCacheManager, taking: list[Sequence], opened: list[int], used: int) -> list[int]:
    """Give each sequence of taking a new block (in that order: the order single steps take them);
    opened: how many open at each step. Returns the blocks in use after each step."""
    tables = 1
    if taking:
        kv.append_blocks(taking)
        tables = kv.num_token_tables  # a new block of a sequence is one per token table
    blocks_used: list[int] = []
    for n in opened:  # (the running sum: native ints, compiled)
        used += n * tables
        blocks_used.append(used)
    return blocks_used


def _finish(sched: Scheduler, batch: DecodeBatch, gone: list[int], now: Number, finished: list) -> None:
    """The batch's groups at positions gone, each of one sequence that reached its stop_len,
    finish at now and leave the batch."""
    for i in gone:
        group = batch.groups[i]
        sched.retire_stopped(group)
        sched.finish_if_done(group, now, finished)
    drop_positions(batch, gone)

"""The running batch that decode runs keep between them (DecodeBatch): the lazy per-batch
decode clock of pagesim.core.decode_runs, and the batch operations both use."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, not_
from typing import TYPE_CHECKING

from pagesim.core.native import Number
from pagesim.core.request import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from pagesim.core.scheduler import Scheduler

INF = float("inf")  # what steps_until_new_block says for a manager that reserved everything


@dataclass(slots=True)
class DecodeBatch:
    """The lazy per-batch decode clock: the running batch as plan_decode last checked it, kept
    by the decode runs taken since, so that planning the next run walks only the groups admitted
    after it (prefill steps only add groups at its end) instead of the whole batch.

    Every group in it is a plain decode (see plan_decode); a run of n steps moves the clock n
    on and leaves every value below true without touching it, except for the groups that
    finish (they leave). A sequence that has r < block_size steps of room takes a block at
    every step whose clock is congruent to clock + r modulo block_size: it is filed under that
    phase (due), so a run finds the blocks it takes by phase, not by sequence.
    A single step that decodes each of its sequences by one token (a chunked prefill's mixed
    step, a decode step between runs) moves the clock on by one, as a run of one step would
    (decoded_by, stepped). The scheduler drops it (Scheduler.decode_batch = None) whenever
    anything else changes its sequences: a step that schedules them otherwise, a preemption or
    swap, an abort."""

    groups: list[SequenceGroup]  # the running groups, in batch order (the head of sched.running)
    seqs: list[Sequence]  # their sequences, in batch order
    request_ids: list[int]
    forked: list[int]  # positions in seqs of the sequences of groups of several
    context: int  # num_tokens of all of seqs, now
    clock: int = 0  # decode steps taken since it was built
    finish_at: list[int] = field(default_factory=list)  # per group: the clock at which its sequences stop
    # per phase (clock modulo block_size, the index): the sequences, in batch order, that take a
    # block at the steps of that phase (one that never does, INF, is in none); None where the KV
    # manager's rooms do not follow its appends (steps_until_new_blocks is asked every run)
    due: list[list[Sequence]] | None = None
    block_size: int = 0  # (the KV manager's)

    def decoded_by(self, out) -> bool:
        """Does the step out decode every sequence of the batch by exactly one token (the
        scheduler asks before it takes the step)?"""
        num_seqs = len(self.seqs)
        return out.seqs[:num_seqs] == self.seqs and out.num_new_tokens[:num_seqs] == [1] * num_seqs

    def scheduled_whole(self, kv, running: list, out, budget: Number) -> bool:
        """Schedule every sequence of the batch for its one decode token into out, as
        Scheduler._schedule_running's loop would where it can preempt none of them: the batch
        heads the running queue, no fork shares a last block, the blocks its sequences take at
        this step fit and the budget has a token for each. False (nothing done) otherwise."""
        groups, seqs = self.groups, self.seqs
        if self.forked or self.due is None or budget < len(seqs) or running[:len(groups)] != groups:
            return False
        taking = self.due[self.clock % self.block_size]  # (the others write into blocks they own)
        if taking:
            if sum([kv.blocks_needed(seq, 1) for seq in taking]) > kv.num_free_blocks:
                return False  # (the loop preempts)
            for seq in taking:
                kv.allocate_slots(seq, 1)
        out.add_decodes(groups, seqs, self.context)
        return True

    def updated_whole(self, sched: Scheduler, token_id: int, now: Number, finished: list) -> int:
        """Scheduler.update() for the batch's groups, where the step decoded each of its sequences
        by one token (decoded_by) and they all take token_id: how many of the step's sequences
        that was (0: a batch of forks, left to update() group by group). Not for a manager that
        frees while decoding (a sliding window's frees go group by group between the finishes)."""
        if self.forked:
            return 0
        decode_steps(self.seqs, 1, token_id)
        for group, seq in zip(self.groups, self.seqs):
            group.sample_seq_ids = [seq.seq_id]
        if sched.kv.tracks_computed:  # (on_computed for each, as a run of one step gives it: advance_decode)
            sched.kv.on_decode_run(self.seqs, 1)
        groups = self.groups
        for i in stopped_positions(self.finish_at, self.clock + 1):  # (no EOS: they stop at their stop_len)
            sched.retire_stopped(groups[i])
            sched.finish_if_done(groups[i], now, finished)
        return len(self.seqs)

    def stepped(self) -> "DecodeBatch | None":
        """The step decoded_by() said yes to was taken: the batch with its clock moved on by it
        (the groups it finished gone), or None where it must be built afresh."""
        self.move_on(1)
        end = self.clock
        gone = stopped_positions(self.finish_at, end)
        if not gone:
            return self
        if self.forked or any(self.groups[i].seqs for i in gone):
            return None
        drop_positions(self, gone)
        return self

    def move_on(self, num_steps: int) -> None:
        """Move the clock num_steps decode steps on."""
        self.clock += num_steps
        self.context += num_steps * len(self.seqs)

    def blocks_taken(self, num_steps: int) -> tuple[list[Sequence], list[int]]:
        """The sequences that take a block in the next num_steps steps, in the order single steps
        take them (step by step, in batch order), and how many take one at each step (needs due).
        The steps of one phase recur every block_size steps: the first block_size steps say all."""
        due, bs = self.due, self.block_size
        assert due is not None
        period = min(num_steps, bs)
        # the phases of the next period steps, in step order (native loops, compiled)
        taking: list[Sequence] = []
        counts: list[int] = []
        for step in range(self.clock, self.clock + period):
            seqs = due[step % bs]
            taking.extend(seqs)
            counts.append(len(seqs))
        if num_steps <= bs:
            return taking, counts
        cycles, rest = divmod(num_steps, bs)
        return taking * cycles + taking[:sum(counts[:rest])], counts * cycles + counts[:rest]

    def first_blocks(self) -> list[tuple[int, int]]:
        """(steps until its sequences take their next block, how many) for each phase (needs due)."""
        clock, bs, due = self.clock, self.block_size, self.due
        assert due is not None
        return [((phase - clock) % bs, len(seqs)) for phase, seqs in enumerate(due) if seqs]

    def file_due(self, seqs: list, rooms: list) -> None:
        """File seqs (the batch's last ones, in order) under their phases, given their rooms; a
        room of block_size or more has no phase yet: the batch keeps none (due = None)."""
        due, bs, clock = self.due, self.block_size, self.clock
        assert due is not None
        for seq, room in zip(seqs, rooms):
            if room != INF:
                if room >= bs:
                    self.due = None
                    return
                due[(clock + room) % bs].append(seq)

    def drop_due(self, gone) -> None:
        """Take the sequences gone (that left the batch) out of due."""
        due = self.due
        assert due is not None
        for seq in gone:
            for seqs in due:
                if seq in seqs:
                    seqs.remove(seq)
                    break


def decode_steps(seqs: list[Sequence], num_steps: int, token_id: int) -> None:
    """Each sequence computes num_steps decode tokens and takes token_id at each (as update() and
    Sequence.append_token do step by step, less a logprob of 0)."""
    new_tokens = [token_id] * num_steps
    for seq in seqs:
        seq.num_computed_tokens += num_steps
        seq.token_ids.extend(new_tokens)
        seq.num_tokens += num_steps


def no_phases(block_size: int) -> list[list[Sequence]]:
    """DecodeBatch.due with nothing filed."""
    return [[] for _ in range(block_size)]


def stopped_positions(finish_at: list[int], clock: int) -> list[int]:
    """Positions of the groups that stop by clock (a pass over the whole batch: native ints, compiled)."""
    return [i for i in range(len(finish_at)) if finish_at[i] <= clock]


def drop_positions(batch: DecodeBatch, gone: list[int]) -> None:
    """The batch without the finished groups at positions gone, each of one sequence (so also
    their sequences' positions). The run's plan still reads its lists: those are copied first."""
    groups, finish_at = batch.groups, batch.finish_at
    batch.seqs = seqs = batch.seqs[:]
    batch.request_ids = request_ids = batch.request_ids[:]
    if batch.due is not None:
        batch.drop_due([seqs[i] for i in gone])
    for i in reversed(gone):
        batch.context -= seqs[i].num_tokens
        del groups[i], seqs[i], request_ids[i], finish_at[i]


def drop_finished(sched: Scheduler, batch: DecodeBatch) -> None:
    """The batch without the groups that finished (new lists: the run's plan is still read)."""
    live = [bool(group.seqs) for group in batch.groups]
    groups = list(compress(batch.groups, live))
    seqs = [seq for group in groups for seq in group.seqs]
    kept = [seq.status is SequenceStatus.RUNNING for seq in batch.seqs]
    if len(seqs) != sum(kept):  # (a group lost some of its sequences only: build it afresh)
        sched.decode_batch = None
        return
    if batch.due is not None:
        batch.drop_due(list(compress(batch.seqs, map(not_, kept))))
    batch.groups, batch.seqs = groups, seqs
    batch.request_ids = list(compress(batch.request_ids, live))
    batch.finish_at = list(compress(batch.finish_at, live))
    batch.context = sum(map(attrgetter("num_tokens"), seqs))
    if batch.forked:
        forked: list[int] = []
        batch.forked = forked
        position = 0
        for group in groups:
            if len(group.seqs) > 1:
                forked.extend(range(position, position + len(group.seqs)))
            position += len(group.seqs)

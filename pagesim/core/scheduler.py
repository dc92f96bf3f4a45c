"""Iteration-level scheduling (continuous batching) over a KV cache manager.

Drivers loop:  out = scheduler.schedule(now);  run the step;  scheduler.update(out, result, now).

Policy (the paper's, from its artifact):
- FCFS. A step either prefills newly admitted groups or decodes the running ones; prefills go
  first, but only while nothing is swapped out (swapped groups resume before new admissions).
- When a decode step cannot get the blocks it needs, the most recently arrived running group
  is preempted whole: by recompute (free everything, prefill prompt + outputs again later) or
  by swap (blocks to the host pool). `auto` recomputes single-sequence groups and swaps the rest.
- Options: chunked prefill (decodes first, then prompt chunks fill the token budget, mixed in
  one step) and `static` request-level batching (a new batch only when the last one is done).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagesim.core.kv_manager import KVCacheManager
from pagesim.core.native import Number
from pagesim.core.request import Request, Sequence, SequenceGroup, SequenceStatus
from pagesim.core.samples import apply_samples
from pagesim.core.scheduler_config import BATCHING, PREEMPTION_MODES, SchedulerConfig  # noqa: F401 (re-exported)
from pagesim.core.step import Sample, SchedulerOutput, StepResult

if TYPE_CHECKING:
    from pagesim.core.decode_batch import DecodeBatch


@dataclass(slots=True, init=False)
class AdmissionAnswer:
    """What admission() last said about a group: kept until the scheduler's state changes, so
    that the step that follows the decode fast path's question (could the waiting head start
    now?) does not work the answer out again."""

    group: SequenceGroup
    budget: Number
    num_seqs: int  # running sequences when asked
    counts: list[int] | None

    def __init__(self, group: SequenceGroup, budget: Number, num_seqs: int, counts: list[int] | None) -> None:
        # (an __init__ of its own, compiled: see pagesim.core.step.BatchShape)
        self.group, self.budget, self.num_seqs, self.counts = group, budget, num_seqs, counts


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        if kv.max_model_len is not None and kv.max_model_len != config.max_model_len:
            raise ValueError(f"the KV manager reserves for max_model_len {kv.max_model_len}, the scheduler "
                             f"runs {config.max_model_len}: build both with the same length")
        # a chunked first sequence may not finish its prompt in the step its siblings start
        kv.share_on_readmission = not config.chunked_prefill
        kv.prefill_chunk = config.max_num_batched_tokens if config.chunked_prefill else None
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # kept in arrival order: preemption takes the last
        self.swapped: list[SequenceGroup] = []  # arrival order: the oldest comes back first
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self.num_preemptions = 0
        self.num_swapped_blocks = 0  # blocks moved either way
        self.last_admission: AdmissionAnswer | None = None  # dropped by every change of state
        # the running batch the decode runs keep (pagesim.core.decode_batch.DecodeBatch, which says when)
        self.decode_batch: DecodeBatch | None = None
        self._stepping_batch: DecodeBatch | None = None  # one the step being taken decodes (update() moves its clock on)

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request: Request) -> SequenceGroup:
        """Queue a request, or reject it (group.reject_reason) if it can never be served."""
        seq = Sequence(next(self._seq_ids), request.prompt_len, request.prompt_token_ids, request.hashed_prompt)
        group = SequenceGroup(request, [seq], arrival_order=next(self._arrivals),
                              stop_len=min(request.prompt_len + request.sampling.max_tokens, self.config.max_model_len))
        total = request.prompt_len + request.sampling.max_tokens
        reason: str | None
        if total > self.config.max_model_len:
            reason = f"prompt {request.prompt_len} + max_tokens {request.sampling.max_tokens} exceeds max_model_len {self.config.max_model_len}"
        elif request.sampling.num_seqs > self.config.max_num_seqs:
            reason = f"{request.sampling.num_seqs} sequences exceed max_num_seqs {self.config.max_num_seqs}"
        else:
            reason = self.kv.never_fits(group, self.config.max_model_len)
        if reason is not None:
            return self._rejected(group, reason)
        self.waiting.append(group)
        return group

    def reject(self, request: Request, reason: str) -> SequenceGroup:
        """A request a driver turns away before it is queued (e.g. a session's turn after an
        earlier turn failed): a group that left rejected with this reason."""
        seq = Sequence(next(self._seq_ids), request.prompt_len, request.prompt_token_ids)
        return self._rejected(SequenceGroup(request, [seq], arrival_order=next(self._arrivals)), reason)

    @staticmethod
    def _rejected(group: SequenceGroup, reason: str) -> SequenceGroup:
        group.reject_reason = reason
        for seq in group.seqs:
            seq.status = SequenceStatus.REJECTED
        group.finished_seqs.extend(group.seqs)
        group.seqs = []
        return group

    def abort(self, group: SequenceGroup, now: Number) -> bool:
        """Stop a group wherever it is (waiting, running or swapped) and free all of its blocks;
        its live sequences end ABORTED. Call between steps. False if it had already left."""
        self.last_admission = None
        self.decode_batch = None
        for queue in (self.running, self.swapped, self.waiting):
            if group in queue:
                queue.remove(group)
                break
        else:
            return False
        for seq in group.seqs:
            self.kv.free(seq)  # before the status changes: a swapped sequence frees host blocks
            seq.status = SequenceStatus.ABORTED
            group.finished_seqs.append(seq)
        group.seqs = []
        self.kv.release(group)
        group.finish_time = now
        return True

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_running_seqs(self) -> int:
        """Sequences the running groups hold, counting a group that has yet to fork into its
        n samples (or beams) as all of them, so max_num_seqs holds after the fork too."""
        # (a list, not a generator: sum() reads it faster, and it is asked before every decode run)
        return sum([len(g.seqs) if g.first_token_time is not None else g.max_num_seqs for g in self.running])

    # -- one iteration ---------------------------------------------------------------------
    def schedule(self, now: Number) -> SchedulerOutput:
        self._stepping_batch = None
        out = SchedulerOutput(block_size=self.kv.block_size)
        may_admit = not self.swapped and (self.config.batching == "iteration" or not self.running)
        if not self.config.chunked_prefill:
            if may_admit:
                # static batching prefills its whole batch at once, as FasterTransformer does
                budget = self.config.max_num_batched_tokens if self.config.batching == "iteration" else math.inf
                self._admit_waiting(out, now, budget)
                if out.groups:
                    return self._finish(out)
            self._schedule_running(out)
            if not out.preempted:
                self._swap_in(out)
        else:
            self.last_admission = None  # the running groups take their blocks first
            budget = self._schedule_running(out)
            if not out.preempted:
                budget = self._swap_in(out, budget)
                if may_admit and not self.swapped:
                    self._admit_waiting(out, now, budget)
        return self._finish(out)

    def _finish(self, out: SchedulerOutput) -> SchedulerOutput:
        self.last_admission = None
        if self.kv.pending_copies:
            out.blocks_to_copy = self.kv.pending_copies
            self.kv.pending_copies = []
        return out

    def admission(self, group: SequenceGroup, budget: Number, num_seqs: int) -> list[int] | None:
        """Tokens each sequence of a waiting group would compute if it started now, or None if
        it cannot start (token budget, sequence limit or memory)."""
        last = self.last_admission
        if last is not None and last.group is group and last.budget == budget and last.num_seqs == num_seqs:
            return last.counts
        self.last_admission = AdmissionAnswer(group, budget, num_seqs, self._admission(group, budget, num_seqs))
        return self.last_admission.counts

    def _admission(self, group: SequenceGroup, budget: Number, num_seqs: int) -> list[int] | None:
        counts = [seq.num_tokens - hit for seq, hit in zip(group.seqs, self.kv.admission_hits(group))]
        if _prompt_kv_moved(group):
            # blocks for the whole prompt, but one token of the step's budget (see _admit_waiting)
            if budget < 1 or num_seqs + group.max_num_seqs > self.config.max_num_seqs or \
                    not self.kv.can_admit(group, counts):
                return None
            return counts
        if self.config.chunked_prefill:
            counts = _cap(counts, budget)
        elif sum(counts) > budget and not (len(group.seqs) > 1 and budget == self.config.max_num_batched_tokens):
            # (A forked group re-admitted after a recompute re-prefills every sequence's own
            # outputs and may need more than one step's budget: it gets a step to itself.)
            return None
        if num_seqs + group.max_num_seqs > self.config.max_num_seqs or not self.kv.can_admit(group, counts):
            return None
        return counts

    def _admit_waiting(self, out: SchedulerOutput, now: Number, budget: Number) -> Number:
        if not self.waiting:
            return budget
        last = self.last_admission  # (if there is one, nothing has changed since it was given)
        num_seqs = last.num_seqs if last is not None and last.group is self.waiting[0] else self.num_running_seqs
        while self.waiting and budget > 0:
            group = self.waiting[0]
            counts = self.admission(group, budget, num_seqs)
            if counts is None:
                break  # FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.kv.admit(group, counts)
            for seq in group.seqs:
                seq.status = SequenceStatus.RUNNING
            group.num_cached_prompt_tokens = max(group.num_cached_prompt_tokens, group.seqs[0].num_computed_tokens)
            if _prompt_kv_moved(group):  # its KV is in the blocks just allocated: only the last token is computed
                group.seqs[0].num_computed_tokens = group.prompt_len - 1
                counts = [1]
            if group.first_scheduled_time is None:
                group.first_scheduled_time = now
            _file(self.running, group)
            num_seqs += group.max_num_seqs
            budget -= sum(counts)
            out.add(group, counts)
        return budget

    def _schedule_running(self, out: SchedulerOutput) -> int:
        """Give every running group its next tokens, preempting from the newest end when the
        blocks run out. Returns the token budget left."""
        batch, self.decode_batch = self.decode_batch, None  # (kept through a step decoding each by one token)
        budget = self.config.max_num_batched_tokens
        kv = self.kv
        chunked = self.config.chunked_prefill
        blocks_needed, running = kv.blocks_needed, self.running
        i = 0
        if batch is not None and batch.scheduled_whole(kv, running, out, budget):  # (the kept batch in one go)
            i = len(batch.groups)
            budget -= len(batch.seqs)
        while i < len(running):
            group = running[i]
            seqs = group.seqs
            if len(seqs) == 1:  # (most groups: the general case below for one sequence)
                seq = seqs[0]
                n = seq.num_tokens - seq.num_computed_tokens
                if chunked:
                    n = min(n, budget)
                    if not n:
                        i += 1
                        continue
                need = blocks_needed(seq, n)
                counts = None
            else:
                counts = [seq.num_uncomputed_tokens for seq in seqs]
                if chunked:
                    counts = _cap(counts, budget)
                    if not any(counts):
                        i += 1
                        continue
                need = 0
                for seq, n in zip(seqs, counts):
                    need += blocks_needed(seq, n)
            if need:  # most decode steps write into a block the sequence already owns
                while need > kv.num_free_blocks:
                    victim = running[-1]
                    self._preempt(victim, out)
                    if victim is group:
                        break
                if seqs[0].status is not SequenceStatus.RUNNING:
                    break  # the group preempted itself: it was the newest
                if counts is None:
                    kv.allocate_slots(seq, n)
                else:
                    for seq, n in zip(seqs, counts):
                        kv.allocate_slots(seq, n)
            if counts is None:
                budget -= n
                out.add_one(group, seq, n)
            else:
                budget -= sum(counts)
                out.add(group, counts)
            i += 1
        if batch is not None and not out.preempted and batch.decoded_by(out):
            self._stepping_batch = batch  # update() moves its clock on by the step
        return budget

    def can_swap_in(self, group: SequenceGroup, num_seqs: int, budget: Number) -> bool:
        return (num_seqs + len(group.seqs) <= self.config.max_num_seqs and budget >= len(group.seqs)
                and self.kv.can_swap_in(group))

    def _swap_in(self, out: SchedulerOutput, budget: Number = math.inf) -> Number:
        if not self.swapped:
            return budget
        num_seqs = self.num_running_seqs
        while self.swapped:
            group = self.swapped[0]
            if not self.can_swap_in(group, num_seqs, budget):
                break
            self.swapped.pop(0)
            self._move(group, self.kv.swap_in, out.blocks_to_swap_in, SequenceStatus.RUNNING, self.running)
            num_seqs += len(group.seqs)
            # A decoding group decodes now, in the block per sequence can_swap_in kept free.
            if all(seq.num_uncomputed_tokens == 1 for seq in group.seqs):
                for seq in group.seqs:
                    self.kv.allocate_slots(seq, 1)
                budget -= len(group.seqs)
                out.add(group, [1] * len(group.seqs))
            elif len(group.seqs) == 1:
                # One swapped out in the middle of a chunked prefill takes its next chunk now too, as
                # much as the budget and the free blocks allow: left for the next step, it could be
                # this step's only work, a step that computes nothing while new requests wait.
                seq = group.seqs[0]
                n = int(min(seq.num_uncomputed_tokens, budget))
                while n > 1 and self.kv.blocks_needed(seq, n) > self.kv.num_free_blocks:
                    n //= 2
                if n >= 1 and self.kv.blocks_needed(seq, n) <= self.kv.num_free_blocks:
                    self.kv.allocate_slots(seq, n)
                    budget -= n
                    out.add(group, [n])
        return budget

    def _move(self, group: SequenceGroup, swap, moves: list, status: SequenceStatus, queue: list) -> None:
        """Swap a group's blocks out or in (swap: kv.swap_out / kv.swap_in): record the block moves
        for the executor, set its sequences' status and file it in arrival order."""
        mapping = swap(group)
        moves.extend(mapping)
        self.num_swapped_blocks += len(mapping)
        for seq in group.seqs:
            seq.status = status
        _file(queue, group)

    def _preemption_mode(self, group: SequenceGroup) -> str:
        mode = self.config.preemption_mode
        if mode == "auto":
            mode = "swap" if group.max_num_seqs > 1 else "recompute"
        if mode == "swap" and not (self.kv.supports_swap and self.kv.can_swap_out(group)):
            mode = "recompute"  # no swap space left (or none at all): recompute instead
        return mode

    def _preempt(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        self.running.remove(group)
        mode = self._preemption_mode(group)
        if mode == "swap":
            self._move(group, self.kv.swap_out, out.blocks_to_swap_out, SequenceStatus.SWAPPED, self.swapped)
            group.num_swaps += 1
        else:
            for seq in group.seqs:
                self.kv.free(seq)
                seq.status = SequenceStatus.WAITING
            self.kv.release(group)
            self.waiting.appendleft(group)  # first in line, ahead of newer arrivals
        group.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append((group, mode))

    # -- after the step --------------------------------------------------------------------
    def update(self, out: SchedulerOutput, result: StepResult, now: Number) -> list[SequenceGroup]:
        """Record what the step computed and produced; returns the groups that finished."""
        self.last_admission = None
        kv = self.kv
        track_computed = kv.tracks_computed
        new_tokens = out.num_new_tokens
        samples_for, apply_samples, retire, finish = (result.samples_for, self._apply_samples, self.retire_stopped,
                                                      self.finish_if_done)
        # the simulator's step: every due sequence takes the default token (see _takes_default)
        default = result.default_token if not result.samples else None
        eos = self.config.eos_token_id
        finished: list[SequenceGroup] = []
        pos = 0
        stepping = self._stepping_batch
        if stepping is not None and default is not None and not kv.frees_while_decoding:
            pos = stepping.updated_whole(self, default, now, finished)  # (the kept batch in one go)
        for group in out.groups[len(stepping.groups) if stepping is not None and pos else 0:]:
            seqs = group.seqs
            if len(seqs) == 1:  # (most groups: the general case below for one sequence)
                seq = seqs[0]
                seq.num_computed_tokens += new_tokens[pos]
                pos += 1
                if track_computed:
                    kv.on_computed(seq)
                if seq.num_computed_tokens != seq.num_tokens:
                    continue  # a prefill chunk that did not reach the end of the prompt
                if group.first_token_time is None:
                    group.first_token_time = now
                if default is not None and _takes_default(group, (seq,)):
                    seq.append_token(default)
                    group.sample_seq_ids = [seq.seq_id]
                    # (retire_stopped's test, asked here: most steps stop nothing)
                    if not _stops(seq, group.stop_len, None if group.request.sampling.ignore_eos else eos):
                        continue
                else:
                    apply_samples(group, [seq], samples_for(group, [seq]))
                retire(group)
                finish(group, now, finished)
                continue
            due = []
            for seq in seqs:
                seq.num_computed_tokens += new_tokens[pos]
                pos += 1
                if track_computed:
                    kv.on_computed(seq)
                if seq.num_computed_tokens == seq.num_tokens:
                    due.append(seq)
            if not due:
                continue  # a prefill chunk that did not reach the end of the prompt
            if group.first_token_time is None:
                group.first_token_time = now
            if default is not None and _takes_default(group, due):
                for seq in due:
                    seq.append_token(default)
                group.sample_seq_ids = [seq.seq_id for seq in due]
            else:
                apply_samples(group, due, samples_for(group, due))
            retire(group)
            finish(group, now, finished)
        if stepping is not None:
            self.decode_batch, self._stepping_batch = stepping.stepped(), None
        return finished

    def finish_if_done(self, group: SequenceGroup, now: Number, finished: list[SequenceGroup]) -> None:
        if not group.seqs:
            group.finish_time = now
            self.kv.release(group)
            self.running.remove(group)
            finished.append(group)

    def _apply_samples(self, group: SequenceGroup, due: list[Sequence], samples: list[Sample]) -> None:
        apply_samples(self.kv, self._seq_ids, group, due, samples)

    def retire_stopped(self, group: SequenceGroup) -> None:
        """Finish the sequences that hit max_tokens, max_model_len or (unless ignored) EOS."""
        limit = group.stop_len
        eos = None if group.request.sampling.ignore_eos else self.config.eos_token_id
        for seq in group.seqs:
            if _stops(seq, limit, eos):
                break
        else:
            return  # (most steps: nothing stops)
        live = []
        for seq in group.seqs:
            if _stops(seq, limit, eos):
                seq.status = SequenceStatus.FINISHED
                self.kv.free(seq)
                group.finished_seqs.append(seq)
            else:
                live.append(seq)
        if len(live) != len(group.seqs):
            group.seqs = live


def _prompt_kv_moved(group: SequenceGroup) -> bool:
    """A P/D hand-off at its first admission (once preempted, by recompute or swap, it is an
    ordinary group: a recompute computes its prompt again here)."""
    return group.request.prompt_kv_moved and group.num_preemptions == 0


def _stops(seq: Sequence, limit: int, eos: int | None) -> bool:
    """Whether seq is done: at its group's stop length (max_tokens or max_model_len) or ending
    in eos (None: EOS ignored or unknown)."""
    return seq.num_tokens >= limit or (eos is not None and seq.token_ids[-1] == eos)


def _takes_default(group: SequenceGroup, due) -> bool:
    """Whether a group without explicit samples just appends the default token to each due
    sequence: what StepResult.samples_for and _apply_samples do together, except at a parallel
    group's first token (where it forks, or beam search wants samples)."""
    if len(due) > 1 or len(group.seqs) > 1:
        return True
    first = due[0]
    return first.num_tokens != first.prompt_len or group.request.sampling.num_seqs == 1


def _arrival(group: SequenceGroup) -> int:
    return group.arrival_order


def _file(queue: list, group: SequenceGroup) -> None:
    """Put group into queue in arrival order (after any of the same rank, as bisect.insort does)."""
    if not queue or queue[-1].arrival_order <= group.arrival_order:
        queue.append(group)  # (mostly the newest: no bisection, no key calls)
    else:
        bisect.insort(queue, group, key=_arrival)


def _cap(counts: list[int], budget: Number) -> list:
    """Split a token budget over a group's sequences in order."""
    capped = []
    for n in counts:
        take = min(n, budget)
        capped.append(take)
        budget -= take
    return capped

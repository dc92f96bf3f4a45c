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
from dataclasses import dataclass, field
from typing import Iterator

from pagesim.core.kv_manager import KVCacheManager
from pagesim.core.request import Request, Sequence, SequenceGroup, SequenceStatus

PREEMPTION_MODES = ("recompute", "swap", "auto")
BATCHING = ("iteration", "static")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2560
    max_model_len: int = 2048
    preemption_mode: str = "auto"
    chunked_prefill: bool = False
    batching: str = "iteration"
    eos_token_id: int | None = None

    def __post_init__(self):
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (one decode token per sequence)")
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError("without chunked prefill, max_num_batched_tokens must be >= max_model_len, "
                             "or a long prompt could never be scheduled")


@dataclass
class SchedulerOutput:
    """One iteration's work. seqs and num_new_tokens are parallel lists; a sequence computes
    num_new_tokens tokens starting at its num_computed_tokens (a whole prompt, a prefill chunk,
    a recompute, or 1 for decode). The executor performs the swaps and copies first."""

    groups: list[SequenceGroup] = field(default_factory=list)
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens of sequences computing more than one token
    num_decode_seqs: int = 0
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) on the device
    preempted: list[tuple[SequenceGroup, str]] = field(default_factory=list)  # (group, "recompute" | "swap")

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    def due_by_group(self) -> Iterator[tuple[SequenceGroup, list[Sequence]]]:
        """Each scheduled group with those of its sequences that reach their end this step, and
        so are due a token, in batch order. Read it before update(), which advances the counts."""
        pos = 0
        for group in self.groups:
            seqs = group.seqs
            counts = self.num_new_tokens[pos:pos + len(seqs)]
            pos += len(seqs)
            yield group, [seq for seq, n in zip(seqs, counts) if seq.num_computed_tokens + n == seq.num_tokens]


@dataclass(frozen=True)
class DecodePlan:
    """The next num_steps steps are plain decode steps of num_seqs sequences; the first reads
    context_tokens tokens of context, and each step one more per sequence."""

    num_steps: int
    num_seqs: int
    context_tokens: int


@dataclass
class DecodeRun:
    """What advance_decode() did: num_steps decode steps of the same batch (what they read is
    the DecodePlan's)."""

    num_steps: int
    num_seqs: int
    kv_blocks_used: list[int]  # after each step
    finished: list[SequenceGroup]  # groups that finished at the last step


@dataclass(frozen=True, slots=True)
class Sample:
    """A token appended to a sequence. When several samples name one parent, the parent is
    forked; in beam search a live sequence that no sample names is dropped."""

    parent_seq_id: int
    token_id: int
    logprob: float = 0.0


@dataclass
class StepResult:
    """What a step produced. samples maps request_id to the group's samples; a group that is due
    tokens and is absent gets default_token for each sequence (the simulator's choice, where
    token ids do not matter). The executor gives every group its samples."""

    samples: dict[int, list[Sample]] = field(default_factory=dict)
    default_token: int | None = None


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        if getattr(kv, "max_model_len", config.max_model_len) != config.max_model_len:
            raise ValueError(f"the KV manager reserves for max_model_len {kv.max_model_len}, the scheduler "
                             f"runs {config.max_model_len}: build both with the same length")
        if hasattr(kv, "share_on_readmission"):
            # a chunked first sequence may not finish its prompt in the step its siblings start
            kv.share_on_readmission = not config.chunked_prefill
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # kept in arrival order: preemption takes the last
        self.swapped: list[SequenceGroup] = []  # arrival order: the oldest comes back first
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self.num_preemptions = 0
        self.num_swapped_blocks = 0  # blocks moved either way

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request: Request) -> SequenceGroup:
        """Queue a request, or reject it (group.reject_reason) if it can never be served."""
        seq = Sequence(next(self._seq_ids), request.prompt_len, request.prompt_token_ids)
        group = SequenceGroup(request, [seq], arrival_order=next(self._arrivals),
                              stop_len=min(request.prompt_len + request.sampling.max_tokens, self.config.max_model_len))
        total = request.prompt_len + request.sampling.max_tokens
        if total > self.config.max_model_len:
            reason = f"prompt {request.prompt_len} + max_tokens {request.sampling.max_tokens} exceeds max_model_len {self.config.max_model_len}"
        elif request.sampling.num_seqs > self.config.max_num_seqs:
            reason = f"{request.sampling.num_seqs} sequences exceed max_num_seqs {self.config.max_num_seqs}"
        else:
            reason = self.kv.never_fits(group, self.config.max_model_len)
        if reason is not None:
            group.reject_reason = reason
            seq.status = SequenceStatus.REJECTED
            group.finished_seqs.append(seq)
            group.seqs = []
            return group
        self.waiting.append(group)
        return group

    def abort(self, group: SequenceGroup, now: float) -> bool:
        """Stop a group wherever it is (waiting, running or swapped) and free all of its blocks;
        its live sequences end ABORTED. Call between steps. False if it had already left."""
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
        return sum(len(g.seqs) if g.first_token_time is not None else g.max_num_seqs for g in self.running)

    # -- one iteration ---------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
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
            budget = self._schedule_running(out)
            if not out.preempted:
                budget = self._swap_in(out, budget)
                if may_admit and not self.swapped:
                    self._admit_waiting(out, now, budget)
        return self._finish(out)

    # -- runs of plain decode steps (the simulator's fast path) -----------------------------
    def decode_horizon(self, limit: int) -> int:
        """How many of the next steps (at most limit) are certain to be plain decode steps of
        today's running batch: every running sequence computes exactly one token, and nothing
        is admitted, swapped in, preempted or copied; sequences may finish only at the last of
        them. Such steps can be taken in one go by advance_decode() with the same outcome as one
        schedule()/update() at a time. Only for drivers whose tokens cannot stop a sequence
        early (no EOS)."""
        plan = self.plan_decode(limit)
        return plan.num_steps if plan else 0

    def plan_decode(self, limit: int) -> DecodePlan | None:
        """decode_horizon() with the batch it would decode (None where the horizon is 0)."""
        if not self.running or limit < 1:
            return None
        kv, cfg = self.kv, self.config
        if kv.pending_copies:
            return None  # fork copies (reservation managers) go out with the next step
        # Admission and swap-in only get harder while decoding takes memory: if the heads of the
        # queues cannot start now, they cannot start during the run either.
        may_admit = self.waiting and not self.swapped and cfg.batching == "iteration"
        if self.swapped or may_admit:
            num_seqs = self.num_running_seqs
            budget = cfg.max_num_batched_tokens - num_seqs
            if self.swapped and self._can_swap_in(self.swapped[0], num_seqs, budget if cfg.chunked_prefill else math.inf):
                return None
            if may_admit and self._admission(self.waiting[0], budget if cfg.chunked_prefill else cfg.max_num_batched_tokens, num_seqs) is not None:
                return None
        bs = kv.block_size
        on_demand = kv.allocates_on_demand
        check_eos = cfg.eos_token_id is not None
        horizon = limit
        num_seqs = context = 0
        opens_at = []  # per sequence: the step (from 0) at which it first needs a new block
        for group in self.running:
            sampling = group.request.sampling
            if (check_eos and not sampling.ignore_eos) or sampling.beam_width > 1 or group.first_token_time is None:
                # EOS could stop a sequence early; beams fork and drop every step; parallel samples
                # fork at their first token, and a last prefill chunk of one token looks like a
                # decode but produces the first token
                return None
            stop = group.stop_len
            seqs = group.seqs
            forked = len(seqs) > 1  # only forks share a partly filled last block
            for seq in seqs:
                computed = seq.num_computed_tokens
                if seq.num_tokens - computed != 1:
                    return None  # still in prefill
                num_seqs += 1
                context += computed + 1
                # a run may end with the step in which sequences finish, not go past it
                left = stop - seq.num_tokens
                if left < horizon:
                    horizon = left
                if on_demand:
                    capacity = len(seq.block_table) * bs
                    if forked and kv.blocks_needed(seq, 1) > (computed >= capacity):
                        return None  # a shared last block must be copied first
                    opens_at.append(capacity - computed)
        # The longest run whose new blocks all fit: past it, some step would preempt.
        free = kv.num_free_blocks

        def blocks_for(steps: int) -> int:
            return sum((steps - 1 - first) // bs + 1 for first in opens_at if first < steps)

        # (each sequence opens at most horizon // bs + 1 blocks: often that settles it unsummed)
        if len(opens_at) * (horizon // bs + 1) <= free or blocks_for(horizon) <= free:
            return DecodePlan(horizon, num_seqs, context)
        lo, hi = 0, horizon
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks_for(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return DecodePlan(lo, num_seqs, context) if lo else None

    def advance_decode(self, num_steps: int, token_id: int, now: float) -> DecodeRun:
        """Take num_steps plain decode steps (num_steps <= decode_horizon()) in one go, every
        sequence appending token_id each step; now is when the last step ends. New blocks are
        taken in the order single steps would take them (step by step, in running order), so
        block ids come out the same; sequences that stop at the last step finish as update()
        would finish them."""
        kv = self.kv
        bs = kv.block_size
        on_demand = kv.allocates_on_demand
        seqs = [seq for group in self.running for seq in group.seqs]
        used = kv.num_used_blocks
        starts = []  # (step, position in batch) of each step that opens a new block
        new_tokens = [token_id] * num_steps
        for order, seq in enumerate(seqs):
            computed = seq.num_computed_tokens
            if on_demand:
                pos = len(seq.block_table) * bs  # first token position without a block
                while pos < computed + num_steps:
                    starts.append((pos - computed, order))
                    pos += bs
            seq.num_computed_tokens = computed + num_steps
            seq.token_ids.extend(new_tokens)
            seq.num_tokens += num_steps
        new_blocks_at = [0] * num_steps
        starts.sort()
        append_block = kv.append_block
        for step, order in starts:
            append_block(seqs[order])
            new_blocks_at[step] += 1
        blocks_used = []
        for n in new_blocks_at:
            used += n
            blocks_used.append(used)
        if kv.tracks_computed:
            # update() calls on_computed after every step: a prompt block whose cached twin was
            # evicted during the run gets registered, as single steps would have done
            for seq in seqs:
                kv.on_computed(seq)
        finished = []
        for group in [g for g in self.running if g.seqs[0].num_tokens >= g.stop_len]:  # sequences of a group grow in step
            self._retire_stopped(group)
            self._finish_if_done(group, now, finished)
        blocks_used[-1] = kv.num_used_blocks  # after the last step's frees
        return DecodeRun(num_steps, len(seqs), blocks_used, finished)

    def _finish(self, out: SchedulerOutput) -> SchedulerOutput:
        if self.kv.pending_copies:
            out.blocks_to_copy = self.kv.pending_copies
            self.kv.pending_copies = []
        return out

    def _add(self, out: SchedulerOutput, group: SequenceGroup, counts: list[int]) -> None:
        out.groups.append(group)
        for seq, n in zip(group.seqs, counts):
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            if n == 1 and seq.num_computed_tokens + 1 == seq.num_tokens:
                out.num_decode_seqs += 1
            else:
                out.num_prefill_tokens += n

    def _admission(self, group: SequenceGroup, budget: float, num_seqs: int) -> list[int] | None:
        """Tokens each sequence of a waiting group would compute if it started now, or None if
        it cannot start (token budget, sequence limit or memory)."""
        counts = [seq.num_tokens - hit for seq, hit in zip(group.seqs, self.kv.admission_hits(group))]
        if self.config.chunked_prefill:
            counts = _cap(counts, budget)
        elif sum(counts) > budget and not (len(group.seqs) > 1 and budget == self.config.max_num_batched_tokens):
            # (A forked group re-admitted after a recompute re-prefills every sequence's own
            # outputs and may need more than one step's budget: it gets a step to itself.)
            return None
        if num_seqs + group.max_num_seqs > self.config.max_num_seqs or not self.kv.can_admit(group, counts):
            return None
        return counts

    def _admit_waiting(self, out: SchedulerOutput, now: float, budget: float) -> float:
        if not self.waiting:
            return budget
        num_seqs = self.num_running_seqs
        while self.waiting and budget > 0:
            group = self.waiting[0]
            counts = self._admission(group, budget, num_seqs)
            if counts is None:
                break  # FCFS: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.kv.admit(group, counts)
            for seq in group.seqs:
                seq.status = SequenceStatus.RUNNING
            group.num_cached_prompt_tokens = max(group.num_cached_prompt_tokens, group.seqs[0].num_computed_tokens)
            if group.first_scheduled_time is None:
                group.first_scheduled_time = now
            bisect.insort(self.running, group, key=_arrival)
            num_seqs += group.max_num_seqs
            budget -= sum(counts)
            self._add(out, group, counts)
        return budget

    def _schedule_running(self, out: SchedulerOutput) -> int:
        """Give every running group its next tokens, preempting from the newest end when the
        blocks run out. Returns the token budget left."""
        budget = self.config.max_num_batched_tokens
        kv = self.kv
        i = 0
        while i < len(self.running):
            group = self.running[i]
            counts = [seq.num_uncomputed_tokens for seq in group.seqs]
            if self.config.chunked_prefill:
                counts = _cap(counts, budget)
                if not any(counts):
                    i += 1
                    continue
            need = 0
            for seq, n in zip(group.seqs, counts):
                need += kv.blocks_needed(seq, n)
            if need:  # most decode steps write into a block the sequence already owns
                while need > kv.num_free_blocks:
                    victim = self.running[-1]
                    self._preempt(victim, out)
                    if victim is group:
                        break
                if group.seqs[0].status is not SequenceStatus.RUNNING:
                    break  # the group preempted itself: it was the newest
                for seq, n in zip(group.seqs, counts):
                    kv.allocate_slots(seq, n)
            budget -= sum(counts)
            self._add(out, group, counts)
            i += 1
        return budget

    def _can_swap_in(self, group: SequenceGroup, num_seqs: int, budget: float) -> bool:
        return (num_seqs + len(group.seqs) <= self.config.max_num_seqs and budget >= len(group.seqs)
                and self.kv.can_swap_in(group))

    def _swap_in(self, out: SchedulerOutput, budget: float = math.inf) -> float:
        if not self.swapped:
            return budget
        num_seqs = self.num_running_seqs
        while self.swapped:
            group = self.swapped[0]
            if not self._can_swap_in(group, num_seqs, budget):
                break
            self.swapped.pop(0)
            mapping = self.kv.swap_in(group)
            out.blocks_to_swap_in.extend(mapping)
            self.num_swapped_blocks += len(mapping)
            for seq in group.seqs:
                seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, group, key=_arrival)
            num_seqs += len(group.seqs)
            # A group swapped out in the middle of a chunked prefill continues next step; a
            # decoding one decodes now, in the block per sequence can_swap_in kept free.
            if all(seq.num_uncomputed_tokens == 1 for seq in group.seqs):
                for seq in group.seqs:
                    self.kv.allocate_slots(seq, 1)
                budget -= len(group.seqs)
                self._add(out, group, [1] * len(group.seqs))
        return budget

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
            mapping = self.kv.swap_out(group)
            out.blocks_to_swap_out.extend(mapping)
            self.num_swapped_blocks += len(mapping)
            for seq in group.seqs:
                seq.status = SequenceStatus.SWAPPED
            bisect.insort(self.swapped, group, key=_arrival)
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
    def update(self, out: SchedulerOutput, result: StepResult, now: float) -> list[SequenceGroup]:
        """Record what the step computed and produced; returns the groups that finished."""
        kv = self.kv
        track_computed = kv.tracks_computed
        new_tokens = out.num_new_tokens
        samples_of = result.samples
        default = result.default_token
        finished = []
        pos = 0
        for group in out.groups:
            due = []
            for seq in group.seqs:
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
            samples = samples_of.get(group.request.request_id) if samples_of else None
            if samples is not None:
                self._apply_samples(group, due, samples)
                self._retire_stopped(group)
            elif default is not None and group.request.sampling.num_seqs > 1 and len(group.seqs) == 1 and due[0].num_output_tokens == 0:
                # the first token of a parallel-sampling group: fork into its n samples
                if group.request.sampling.use_beam_search:
                    raise ValueError(f"request {group.request_id}: beam search needs explicit samples")
                self._apply_samples(group, due, [Sample(due[0].seq_id, default)] * group.request.sampling.n)
                self._retire_stopped(group)
            elif default is not None:
                # the simulator's path, once per sequence per step: retire only when one stops
                limit = group.stop_len
                stopped = default == self.config.eos_token_id and not group.request.sampling.ignore_eos
                for seq in due:
                    seq.token_ids.append(default)
                    seq.num_tokens += 1
                    if seq.num_tokens >= limit:
                        stopped = True
                if stopped:
                    self._retire_stopped(group)
            else:
                raise ValueError(f"no samples for request {group.request_id}")
            self._finish_if_done(group, now, finished)
        return finished

    def _finish_if_done(self, group: SequenceGroup, now: float, finished: list[SequenceGroup]) -> None:
        if not group.seqs:
            group.finish_time = now
            self.kv.release(group)
            self.running.remove(group)
            finished.append(group)

    def _apply_samples(self, group: SequenceGroup, due: list[Sequence], samples: list[Sample]) -> None:
        """Append each sample to its parent (the parent keeps its first sample, a further one
        forks a child), drop the due sequences no sample names, and record in
        group.sample_seq_ids the sequence each sample went into, so a driver can follow it."""
        by_parent: dict[int, list[int]] = {}  # parent seq id -> indices of its samples
        for i, sample in enumerate(samples):
            by_parent.setdefault(sample.parent_seq_id, []).append(i)
        # Beams that lost are freed before any fork: a manager that forks by copying (the
        # reservation baselines) hands the child the range a lost beam gives back.
        for seq in due:
            if seq.seq_id not in by_parent:
                seq.status = SequenceStatus.DROPPED
                self.kv.free(seq)
        placed = [0] * len(samples)
        new_seqs = []
        for seq in group.seqs:
            if seq not in due:
                new_seqs.append(seq)
                continue
            mine = by_parent.get(seq.seq_id)
            if not mine:  # a beam that lost (freed above)
                continue
            for i in mine[1:]:  # fork before the parent appends its own token
                child = seq.copy_as(next(self._seq_ids))
                self.kv.fork(seq, child)
                child.append_token(samples[i].token_id, samples[i].logprob)
                new_seqs.append(child)
                placed[i] = child.seq_id
            seq.append_token(samples[mine[0]].token_id, samples[mine[0]].logprob)
            new_seqs.append(seq)
            placed[mine[0]] = seq.seq_id
        group.seqs = new_seqs
        group.sample_seq_ids = placed

    def _retire_stopped(self, group: SequenceGroup) -> None:
        """Finish the sequences that hit max_tokens, max_model_len or (unless ignored) EOS."""
        limit = group.stop_len
        eos = None if group.request.sampling.ignore_eos else self.config.eos_token_id
        live = []
        for seq in group.seqs:
            if seq.num_tokens >= limit or (eos is not None and seq.token_ids[-1] == eos):
                seq.status = SequenceStatus.FINISHED
                self.kv.free(seq)
                group.finished_seqs.append(seq)
            else:
                live.append(seq)
        if len(live) != len(group.seqs):
            group.seqs = live


def _arrival(group: SequenceGroup) -> int:
    return group.arrival_order


def _cap(counts: list[int], budget: int) -> list[int]:
    """Split a token budget over a group's sequences in order."""
    capped = []
    for n in counts:
        take = min(n, budget)
        capped.append(take)
        budget -= take
    return capped

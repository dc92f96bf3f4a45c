"""The per-step contract between the core and a driver.

`Scheduler.schedule()` returns a SchedulerOutput (what to compute, which blocks to move first);
the driver runs it (a forward pass, or the cost model's duration for its BatchShape) and hands
back a StepResult (the tokens sampled) to `Scheduler.update()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from pagesim.core.native import Number
from pagesim.core.request import Sequence, SequenceGroup


def is_due(seq: Sequence, num_new_tokens: int) -> bool:
    """Does computing num_new_tokens reach the sequence's end, so that the step samples its next
    token? (Not for a prefill chunk short of the prompt's end.)"""
    return seq.num_computed_tokens + num_new_tokens == seq.num_tokens


def prefill_attn_pairs(new_tokens: int, context_before: int = 0) -> int:
    """(query, key) pairs under the causal mask for `new_tokens` appended after `context_before`."""
    return new_tokens * context_before + new_tokens * (new_tokens + 1) // 2


# (init=False and an __init__ of its own, here and in the other classes made once per step, run or
# request: mypyc compiles it, where the one dataclasses writes runs in the interpreter, 3-11k
# instructions a call; mypyc/mypyc#817. Its parameters are the fields, in order, with their defaults.)
@dataclass(slots=True, unsafe_hash=True, init=False)
class BatchShape:
    """What one iteration computes and moves: all a cost model looks at. A value: equal and
    hashed by its fields, never changed once made (not frozen: a frozen dataclass's __init__ sets
    each field through object.__setattr__, a generic call even compiled)."""

    num_prefill_tokens: int         # new tokens computed this step for sequences in prefill
    num_prefill_seqs: int           # (a whole prompt, a chunk, or a recompute)
    prefill_attn_pairs: int         # sum over prefill seqs of new*ctx_before + new*(new+1)//2
    num_decode_seqs: int
    decode_context_tokens: int      # sum over decode seqs of their context length (KV read)
    num_swap_blocks: int            # blocks moved host<->device this step (in + out)
    num_copy_blocks: int            # copy-on-write block copies this step
    block_size: int

    def __init__(self, num_prefill_tokens: int = 0, num_prefill_seqs: int = 0, prefill_attn_pairs: int = 0,
                 num_decode_seqs: int = 0, decode_context_tokens: int = 0, num_swap_blocks: int = 0,
                 num_copy_blocks: int = 0, block_size: int = 16) -> None:
        self.num_prefill_tokens = num_prefill_tokens
        self.num_prefill_seqs = num_prefill_seqs
        self.prefill_attn_pairs = prefill_attn_pairs
        self.num_decode_seqs = num_decode_seqs
        self.decode_context_tokens = decode_context_tokens
        self.num_swap_blocks = num_swap_blocks
        self.num_copy_blocks = num_copy_blocks
        self.block_size = block_size

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    @property
    def kind(self) -> str:
        """The one kind (STEP_KINDS) a step counts under where errors are split by kind: a step
        that swaps is "with swap" whatever else it computes, else one that copies blocks "with
        copy", else "mixed" (prefill and decode in one step), "prefill", "decode", or "idle"."""
        if self.num_swap_blocks:
            return "with swap"
        if self.num_copy_blocks:
            return "with copy"
        if self.num_prefill_tokens:
            return "mixed" if self.num_decode_seqs else "prefill"
        return "decode" if self.num_decode_seqs else "idle"


STEP_KINDS = ("prefill", "decode", "mixed", "with swap", "with copy")  # BatchShape.kind, less "idle"


@dataclass(init=False)
class SchedulerOutput:
    """One iteration's work. seqs and num_new_tokens are parallel lists; a sequence computes
    num_new_tokens tokens starting at its num_computed_tokens (a whole prompt, a prefill chunk,
    a recompute, or 1 for decode). The executor performs the swaps and copies first."""

    groups: list[SequenceGroup]
    seqs: list[Sequence]
    num_new_tokens: list[int]
    # The batch's shape, counted as sequences are added (see add: the one prefill-or-decode rule)
    num_prefill_tokens: int  # new tokens of sequences in prefill
    num_prefill_seqs: int
    prefill_attn_pairs: int  # causal (query, key) pairs of the prefill tokens
    num_decode_seqs: int
    decode_context_tokens: int  # context the decoding sequences read
    blocks_to_swap_in: list[tuple[int, int]]  # (host, device)
    blocks_to_swap_out: list[tuple[int, int]]  # (device, host)
    blocks_to_copy: list[tuple[int, int]]  # (src, dst) on the device
    preempted: list[tuple[SequenceGroup, str]]  # (group, "recompute" | "swap")
    block_size: int  # of the KV manager that scheduled it

    def __init__(self, groups: list[SequenceGroup] | None = None, seqs: list[Sequence] | None = None,
                 num_new_tokens: list[int] | None = None, num_prefill_tokens: int = 0, num_prefill_seqs: int = 0,
                 prefill_attn_pairs: int = 0, num_decode_seqs: int = 0, decode_context_tokens: int = 0,
                 blocks_to_swap_in: list[tuple[int, int]] | None = None,
                 blocks_to_swap_out: list[tuple[int, int]] | None = None,
                 blocks_to_copy: list[tuple[int, int]] | None = None,
                 preempted: list[tuple[SequenceGroup, str]] | None = None, block_size: int = 16) -> None:
        # (None: a new empty list, as the fields' default factories gave)
        self.groups = [] if groups is None else groups
        self.seqs = [] if seqs is None else seqs
        self.num_new_tokens = [] if num_new_tokens is None else num_new_tokens
        self.num_prefill_tokens = num_prefill_tokens
        self.num_prefill_seqs = num_prefill_seqs
        self.prefill_attn_pairs = prefill_attn_pairs
        self.num_decode_seqs = num_decode_seqs
        self.decode_context_tokens = decode_context_tokens
        self.blocks_to_swap_in = [] if blocks_to_swap_in is None else blocks_to_swap_in
        self.blocks_to_swap_out = [] if blocks_to_swap_out is None else blocks_to_swap_out
        self.blocks_to_copy = [] if blocks_to_copy is None else blocks_to_copy
        self.preempted = [] if preempted is None else preempted
        self.block_size = block_size

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    def add(self, group: SequenceGroup, counts: list[int]) -> None:
        """Schedule counts[i] new tokens for the group's i-th sequence, counting each into the
        batch's shape by the one rule for prefill or decode: a sequence decodes when it computes
        exactly its last token; a whole prompt, a prefill chunk or a recompute is prefill, even a
        one-token chunk."""
        self.groups.append(group)
        for seq, n in zip(group.seqs, counts):
            self._count(seq, n)

    def add_one(self, group: SequenceGroup, seq: Sequence, n: int) -> None:
        """add() for a group of one sequence: add(group, [n])."""
        self.groups.append(group)
        self._count(seq, n)

    def add_decodes(self, groups: list[SequenceGroup], seqs: list[Sequence], context_tokens: int) -> None:
        """add() for groups whose sequences (seqs, in order) all decode, reading context_tokens
        in all (the caller knows: pagesim.core.decode_batch.DecodeBatch), counted in one go."""
        self.groups += groups
        self.seqs += seqs
        self.num_new_tokens += [1] * len(seqs)
        self.num_decode_seqs += len(seqs)
        self.decode_context_tokens += context_tokens

    def _count(self, seq: Sequence, n: int) -> None:
        """Count n new tokens of seq into the batch and its shape (add's one rule)."""
        self.seqs.append(seq)
        self.num_new_tokens.append(n)
        before = seq.num_computed_tokens
        if n == 1 and before + 1 == seq.num_tokens:
            self.num_decode_seqs += 1
            self.decode_context_tokens += before + 1
        else:
            self.num_prefill_tokens += n
            self.num_prefill_seqs += 1
            self.prefill_attn_pairs += prefill_attn_pairs(n, before)

    def batch_shape(self) -> BatchShape:
        """The step as a cost model sees it."""
        return BatchShape(self.num_prefill_tokens, self.num_prefill_seqs, self.prefill_attn_pairs, self.num_decode_seqs,
                          self.decode_context_tokens, len(self.blocks_to_swap_in) + len(self.blocks_to_swap_out),
                          len(self.blocks_to_copy), self.block_size)

    def due_by_group(self) -> Iterator[tuple[SequenceGroup, list[Sequence]]]:
        """Each scheduled group with those of its sequences that reach their end this step, and
        so are due a token, in batch order. Read it before update(), which advances the counts."""
        pos = 0
        for group in self.groups:
            seqs = group.seqs
            counts = self.num_new_tokens[pos:pos + len(seqs)]
            pos += len(seqs)
            yield group, [seq for seq, n in zip(seqs, counts) if is_due(seq, n)]


class Sample(NamedTuple):
    """A token appended to a sequence. When several samples name one parent, the parent is
    forked; in beam search a live sequence that no sample names is dropped. (A named tuple: the
    simulator makes one per sequence per step, and a frozen dataclass costs 4x more to build.)"""

    parent_seq_id: int
    token_id: int
    logprob: Number = 0.0


@dataclass
class StepResult:
    """What a step produced. samples maps request_id to the group's samples. A group that is due
    tokens and is absent gets default_token once per due sequence, and a parallel-sampling group
    at its first token gets it n times (forking): the simulator's choice, where token ids do not
    matter. The executor gives every group its samples."""

    samples: dict[int, list[Sample]] = field(default_factory=dict)
    default_token: int | None = None

    def samples_for(self, group: SequenceGroup, due: list[Sequence]) -> list[Sample]:
        """The samples the group's due sequences take this step."""
        samples = self.samples.get(group.request_id) if self.samples else None
        if samples is not None:
            return samples
        token = self.default_token
        if token is None:
            raise ValueError(f"no samples for request {group.request_id}")
        first = due[0]
        if len(due) == 1:  # (the common case, and the only one where a group forks)
            sampling = group.request.sampling
            if first.num_tokens == first.prompt_len and len(group.seqs) == 1 and sampling.num_seqs > 1:
                if sampling.use_beam_search:
                    raise ValueError(f"request {group.request_id}: beam search needs explicit samples")
                return [Sample(first.seq_id, token)] * sampling.n
            return [Sample(first.seq_id, token)]
        return [Sample(seq.seq_id, token) for seq in due]

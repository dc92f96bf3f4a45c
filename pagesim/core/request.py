"""Requests as the core sees them: a request becomes a SequenceGroup of one or more Sequences.

A group starts with a single sequence holding the prompt. Parallel sampling (n > 1) and beam
search (beam_width > 1) fork it after the prompt, so the prompt's KV blocks are shared.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pagesim.core.hashed_prompt import HashedPrompt
from pagesim.core.native import Number


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int = 1  # parallel samples
    beam_width: int = 1  # > 1: beam search (exclusive with n > 1)
    max_tokens: int = 16  # output tokens per sequence (the trace's output_len in the simulator)
    ignore_eos: bool = False
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got {self.beam_width}")
        if self.n > 1 and self.beam_width > 1:
            raise ValueError("n > 1 and beam_width > 1 cannot be combined")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"bad sampling values: temperature={self.temperature} top_p={self.top_p} top_k={self.top_k}")

    @property
    def num_seqs(self) -> int:
        """How many sequences the group runs at once after the prompt."""
        return max(self.n, self.beam_width)

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1


@dataclass(slots=True)
class Request:
    """What a driver submits. prompt_token_ids may be None in the simulator (lengths only);
    hashed_prompt, when given instead, says which prompts share which blocks without the ids
    (drivers that need real ids take HashedPrompt.vocab_ids)."""

    request_id: int
    prompt_len: int
    sampling: SamplingParams
    arrival_time: Number = 0.0
    prompt_token_ids: list[int] | None = None
    hashed_prompt: HashedPrompt | None = None
    # P/D disaggregation: the prompt's KV was computed on a prefill replica and moved here (vLLM's
    # kv_transfer_params): admission allocates blocks for the whole prompt and computes only its
    # last token, which gives the first output token (Scheduler._admission)
    prompt_kv_moved: bool = False

    def __post_init__(self):
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt_len must be >= 1")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.prompt_len:
            raise ValueError(f"request {self.request_id}: {len(self.prompt_token_ids)} prompt ids, prompt_len {self.prompt_len}")
        if self.hashed_prompt is not None and len(self.hashed_prompt) != self.prompt_len:
            raise ValueError(f"request {self.request_id}: hashed prompt of {len(self.hashed_prompt)} tokens, "
                             f"prompt_len {self.prompt_len}")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not admitted yet, or preempted by recompute
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted by swap; its blocks are in the host pool
    FINISHED = "finished"  # stop condition met
    DROPPED = "dropped"  # a beam that lost; never finishes on its own
    REJECTED = "rejected"  # can never fit; see SequenceGroup.reject_reason
    ABORTED = "aborted"  # its client went away, or a driver stopped it (e.g. a stop string)


class Sequence:
    """One token stream. Its KV block table is owned (mutated) by the KV manager."""

    __slots__ = ("seq_id", "prompt_len", "token_ids", "num_tokens", "num_computed_tokens",
                 "block_table", "status", "cumulative_logprob", "hashed_prompt", "prompt_ids")

    def __init__(self, seq_id: int, prompt_len: int, prompt_token_ids: list[int] | None,
                 hashed_prompt: HashedPrompt | None = None):
        self.seq_id = seq_id
        self.prompt_len = prompt_len
        # Prompt ids (when known) followed by output ids. Without prompt ids only outputs are kept
        # (a hashed prompt stays compact: its blocks are keyed from the hash ids).
        self.token_ids: list[int] = list(prompt_token_ids) if prompt_token_ids is not None else []
        self.hashed_prompt = hashed_prompt
        # The ids as submitted, not copied (a request's prompt is never mutated): what is worked out
        # from the prompt alone is kept for that list, which a replay cycling its trace submits again.
        self.prompt_ids = prompt_token_ids
        self.num_tokens = prompt_len  # prompt + outputs
        self.num_computed_tokens = 0  # tokens whose K/V is in the cache
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.cumulative_logprob = 0.0

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def has_token_ids(self) -> bool:
        return len(self.token_ids) == self.num_tokens

    @property
    def prompt_is_known(self) -> bool:
        """Whether the prompt's content is known (by its ids or its block hashes): the prefix
        cache can key its blocks."""
        return self.hashed_prompt is not None or len(self.token_ids) == self.num_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_output_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def append_token(self, token_id: int, logprob: Number = 0.0) -> None:
        self.token_ids.append(token_id)
        self.num_tokens += 1
        self.cumulative_logprob += logprob

    def copy_as(self, seq_id: int) -> "Sequence":
        """A fork's token state (the block table is shared by the KV manager, not here)."""
        child = Sequence(seq_id, self.prompt_len, None)
        child.token_ids = list(self.token_ids)
        child.num_tokens = self.num_tokens
        child.num_computed_tokens = self.num_computed_tokens
        child.block_table = []
        child.status = self.status
        child.cumulative_logprob = self.cumulative_logprob
        child.hashed_prompt = self.hashed_prompt
        child.prompt_ids = self.prompt_ids
        return child

    def __repr__(self) -> str:
        return f"Sequence(id={self.seq_id}, tokens={self.num_tokens}, computed={self.num_computed_tokens}, {self.status.value})"


# (init=False and an __init__ of its own: mypyc compiles it, not the one dataclasses would write;
# see pagesim.core.step.BatchShape. Its parameters are the fields, in order, with their defaults.)
@dataclass(eq=False, init=False)
class SequenceGroup:
    """A request in flight: its live sequences, its sampling parameters and its timeline."""

    request: Request
    seqs: list[Sequence]
    arrival_order: int  # FCFS rank; the scheduler preempts the highest first
    stop_len: int  # tokens (prompt + output) at which its sequences stop, EOS aside
    first_scheduled_time: Number | None
    first_token_time: Number | None
    finish_time: Number | None
    num_preemptions: int
    num_swaps: int
    num_cached_prompt_tokens: int  # prompt tokens served from the prefix cache
    reject_reason: str | None
    finished_seqs: list[Sequence]  # outputs, in finishing order
    # after a step with explicit samples: the sequence each sample went into, in sample order
    # (the parent's id for its first sample, a new child's for the others)
    sample_seq_ids: list[int]

    def __init__(self, request: Request, seqs: list[Sequence], arrival_order: int, stop_len: int = 0,
                 first_scheduled_time: Number | None = None, first_token_time: Number | None = None,
                 finish_time: Number | None = None, num_preemptions: int = 0, num_swaps: int = 0,
                 num_cached_prompt_tokens: int = 0, reject_reason: str | None = None,
                 finished_seqs: list[Sequence] | None = None, sample_seq_ids: list[int] | None = None) -> None:
        self.request = request
        self.seqs = seqs
        self.arrival_order = arrival_order
        self.stop_len = stop_len
        self.first_scheduled_time = first_scheduled_time
        self.first_token_time = first_token_time
        self.finish_time = finish_time
        self.num_preemptions = num_preemptions
        self.num_swaps = num_swaps
        self.num_cached_prompt_tokens = num_cached_prompt_tokens
        self.reject_reason = reject_reason
        self.finished_seqs = [] if finished_seqs is None else finished_seqs
        self.sample_seq_ids = [] if sample_seq_ids is None else sample_seq_ids

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    @property
    def arrival_time(self) -> Number:
        return self.request.arrival_time

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def max_num_seqs(self) -> int:
        return self.request.sampling.num_seqs

    @property
    def is_finished(self) -> bool:
        return not self.seqs

    @property
    def output_len(self) -> int:
        """Output tokens of the longest finished sequence (what latency metrics divide by)."""
        return max((s.num_output_tokens for s in self.finished_seqs), default=0)

    def __repr__(self) -> str:
        return f"SequenceGroup(request={self.request_id}, seqs={self.seqs})"

"""What the scheduler needs from a KV cache manager, and the memory breakdown both report.

Two implementations: PagedKVManager (vLLM) and ReservationKVManager (the Orca baselines). The
scheduler never looks inside either; it asks how many blocks a step needs, and moves groups
between running, swapped and waiting.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from pagesim.core.native import Number, shallow_copy
from pagesim.core.request import Sequence, SequenceGroup


@dataclass(frozen=True)
class WasteBreakdown:
    """KV slots (token positions) of the device pool by what they hold right now; the five
    fields add up to the pool. This is the paper's Fig. 2 taken from the allocator's state."""

    token_states: int  # slots holding a computed token's K/V
    reserved: int  # reserved for tokens the request will still produce
    internal_fragmentation: int  # inside allocations, never to be used
    external_fragmentation: int  # lost to the allocator (buddy rounding)
    free: int  # not allocated at all

    @property
    def total(self) -> int:
        return self.token_states + self.reserved + self.internal_fragmentation + self.external_fragmentation + self.free


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: scripts/compile.py; the reservation managers extend it)
class KVCacheManager(ABC):
    block_size: int
    num_device_blocks: int
    supports_swap: bool = False
    tracks_computed: bool = False  # wants on_computed() after every step
    max_model_len: int | None = None  # the length a manager that reserves ahead sizes for
    # A forked group re-admitted after a recompute: its later sequences share the first one's
    # prompt blocks, computed in the same step. The scheduler turns this off under chunked
    # prefill, where the first sequence may not finish its prompt in that step.
    share_on_readmission: bool = True
    # The most tokens one step computes for a sequence when the scheduler chunks prefills (it sets
    # this; None: a prompt or a recompute is computed whole). A sliding window's peak depends on it.
    prefill_chunk: int | None = None
    # Block tables per sequence (KV cache groups): a sequence's next block takes one in each.
    num_tables: int = 1
    # Of those, the tables that take a block when a sequence opens a new one (a state table,
    # pagesim.core.kv_groups, keeps its one block whatever the sequence's length).
    num_token_tables: int = 1
    # A sliding window frees blocks as sequences decode (see steps_until_window_frees).
    frees_while_decoding: bool = False
    # steps_until_new_block changes only as decode steps and appended blocks change it: after a
    # decode run of n steps that appended k blocks it is n less, plus k * block_size (math.inf
    # stays math.inf), so pagesim.core.decode_runs keeps it per sequence instead of asking again.
    rooms_follow_appends: bool = False

    def __copy__(self) -> KVCacheManager:
        return shallow_copy(self)  # (pagesim.core.native: a compiled manager's copy.copy shares its __dict__)

    def __init__(self) -> None:
        # Copy-on-write and fork copies the scheduler hands to the executor, drained every step.
        self.pending_copies: list[tuple[int, int]] = []

    # -- admission -------------------------------------------------------------------------
    @abstractmethod
    def never_fits(self, group: SequenceGroup, max_model_len: int) -> str | None:
        """Why this group can never be served by this pool, or None."""

    @abstractmethod
    def match_prefix(self, seq: Sequence) -> int:
        """For a sequence about to be prefilled: tokens that a cache already holds (0 without
        prefix caching). Sets nothing; admit() takes the hit."""

    def admission_hits(self, group: SequenceGroup) -> list[int]:
        """Tokens of each sequence of a waiting group that need no computing when it starts."""
        return [self.match_prefix(seq) for seq in group.seqs]

    @abstractmethod
    def can_admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> bool:
        """Can the waiting group start, computing num_new_tokens[i] for its i-th sequence?"""

    def surely_admits(self, group: SequenceGroup) -> bool:
        """A cheap test that is never wrong when it says yes: can_admit holds for the waiting
        group whatever its prefix hits and however a token budget caps its new tokens. False
        means: ask can_admit."""
        return False

    @abstractmethod
    def admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> None:
        """Take the prefix hits and allocate what the first step of a waiting group needs."""

    # -- running ---------------------------------------------------------------------------
    @abstractmethod
    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks an append of num_new_tokens to seq would take (new blocks and copies)."""

    @property
    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make the block table cover num_computed_tokens + num_new_tokens. Callers check
        blocks_needed first; running out here is a bug."""

    @abstractmethod
    def steps_until_new_block(self, seq: Sequence) -> Number:
        """Decode steps (one token each) seq can take in the blocks it holds: at the next one
        it needs a new block. math.inf for a manager that reserved everything at admission."""

    def steps_until_new_blocks(self, seqs: list[Sequence]) -> list:
        """steps_until_new_block for each of seqs (one call per decode run; a manager may answer faster)."""
        return [self.steps_until_new_block(seq) for seq in seqs]

    def steps_until_window_frees(self, seqs: list[Sequence]) -> Number:
        """Decode steps until the first of seqs frees a block that left its window (the step
        that frees it counts); math.inf for a manager that frees nothing while decoding."""
        return math.inf

    def windows_passed(self, seqs: list[Sequence]) -> bool:
        """Whether any of seqs has blocks wholly outside a sliding window (something a step
        could free); False for a manager that frees nothing while decoding."""
        return False

    def append_block(self, seq: Sequence) -> None:
        """Give seq one more block at the end of its table (when steps_until_new_block says)."""
        raise NotImplementedError(f"{type(self).__name__} does not allocate on demand")

    def append_blocks(self, seqs: list[Sequence]) -> None:
        """append_block for each of seqs in turn (a sequence may appear more than once): one call
        per decode run; a manager may take the blocks at once."""
        for seq in seqs:
            self.append_block(seq)

    @abstractmethod
    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child continues from parent's tokens (parallel sampling, beam search)."""

    @abstractmethod
    def free(self, seq: Sequence) -> None: ...

    def release(self, group: SequenceGroup) -> None:
        """Called once all of a group's sequences are freed (it finished or was preempted)."""

    def on_computed(self, seq: Sequence) -> None:
        """Hook after a step computed tokens of seq (prefix caching registers full blocks)."""

    def on_decode_run(self, seqs: list[Sequence], num_steps: int, last_step: bool = True) -> list[int] | None:
        """on_computed after num_steps decode steps of seqs taken at once (pagesim.core.decode_runs),
        leaving the state single steps would. Returns the blocks freed at each step where the
        manager frees any while decoding (a sliding window), else None. last_step=False: leave
        the last step's frees to on_computed calls (the caller interleaves them with finishes)."""
        for seq in seqs:
            self.on_computed(seq)
        return None

    # -- swapping (paged only) --------------------------------------------------------------
    def can_swap_out(self, group: SequenceGroup) -> bool:
        return False

    def swap_out(self, group: SequenceGroup) -> list[tuple[int, int]]:
        raise NotImplementedError(f"{type(self).__name__} does not swap")

    def can_swap_in(self, group: SequenceGroup) -> bool:
        return False

    def swap_in(self, group: SequenceGroup) -> list[tuple[int, int]]:
        raise NotImplementedError(f"{type(self).__name__} does not swap")

    # -- accounting ------------------------------------------------------------------------
    @property
    def num_used_blocks(self) -> int:
        return self.num_device_blocks - self.num_free_blocks

    @property
    def num_logical_blocks(self) -> int:
        """Device blocks the live sequences would hold if nothing were shared (each sequence
        its own copy of every block in its table). Managers without sharing (the reservation
        baselines copy on fork) report their used blocks: a memory saving of 0."""
        return self.num_used_blocks

    @abstractmethod
    def waste(self, running: list[SequenceGroup]) -> WasteBreakdown: ...

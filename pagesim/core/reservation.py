"""The Orca baselines as the paper's artifact built them: each sequence gets one contiguous range
of the KV pool at admission, sized for its prompt plus an estimate of its output.

  max     estimates the model's maximum length (2048 tokens for OPT)
  pow2    the next power of two at or above the true output length
  oracle  the true output length

The range is ceil(min(prompt + estimate, max_model_len) / block_size) blocks, taken from a real
contiguous allocator (buddy by default, which rounds to a power of two; first-fit optional).
Nothing is ever allocated after admission, so these baselines never preempt or swap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagesim.core.allocators import BuddyAllocator, FirstFitAllocator, round_up_pow2
from pagesim.core.errors import CoreError, OutOfBlocks
from pagesim.core.kv_manager import KVCacheManager, WasteBreakdown
from pagesim.core.request import Sequence, SequenceGroup

ESTIMATES = ("max", "pow2", "oracle")
ALLOCATORS = {"buddy": BuddyAllocator, "first-fit": FirstFitAllocator}


@dataclass
class Reservation:
    start: int
    num_blocks: int  # what the allocator handed out
    requested_blocks: int  # what the estimate asked for
    final_len: int  # tokens the sequence will really hold at its end


class ReservationKVManager(KVCacheManager):
    def __init__(self, num_device_blocks: int, block_size: int = 16, estimate: str = "max",
                 max_model_len: int = 2048, allocator: str = "buddy"):
        super().__init__()
        # (set here, not as a class attribute: KVCacheManager may be compiled, and its compiled
        # methods read the instance's value, never a subclass's class attribute)
        self.rooms_follow_appends = True  # (math.inf: every block is reserved at admission)
        if estimate not in ESTIMATES:
            raise ValueError(f"unknown reservation estimate {estimate!r}; choose from {ESTIMATES}")
        if allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {allocator!r}; choose from {tuple(ALLOCATORS)}")
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.estimate = estimate
        self.max_model_len = max_model_len
        self._make_allocator = lambda: ALLOCATORS[allocator](num_device_blocks, round_up_pow2(-(-max_model_len // block_size)))
        self.allocator = self._make_allocator()
        self._reservation: dict[int, Reservation] = {}  # seq_id -> its range
        self._owner: dict[int, int] = {}  # seq_id -> request_id
        self._spare: dict[int, list[Reservation]] = {}  # request_id -> ranges no sequence holds now
        self._fits_cache: dict[tuple[int, int], bool] = {}

    # -- sizing ----------------------------------------------------------------------------
    def reserved_tokens(self, group: SequenceGroup) -> int:
        output = group.sampling.max_tokens
        guess = {"max": self.max_model_len, "pow2": round_up_pow2(output), "oracle": output}[self.estimate]
        return min(group.prompt_len + guess, self.max_model_len)

    def _requested_blocks(self, group: SequenceGroup) -> int:
        return -(-self.reserved_tokens(group) // self.block_size)

    def never_fits(self, group: SequenceGroup, max_model_len: int) -> str | None:
        blocks, count = self._requested_blocks(group), group.max_num_seqs
        key = (blocks, count)
        if key not in self._fits_cache:
            empty = self._make_allocator()
            try:
                for _ in range(count):
                    empty.allocate(blocks)
                self._fits_cache[key] = True
            except OutOfBlocks:
                self._fits_cache[key] = False
        if not self._fits_cache[key]:
            return f"{count} reservation(s) of {blocks} blocks do not fit in an empty pool of {self.num_device_blocks}"
        return None

    # -- admission -------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> int:
        return 0

    def can_admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> bool:
        blocks = self._requested_blocks(group)
        taken = []
        try:
            for _ in range(group.max_num_seqs):
                taken.append(self.allocator.allocate(blocks)[0])
            return True
        except OutOfBlocks:
            return False
        finally:
            for start in taken:
                self.allocator.free(start)

    def admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> None:
        blocks = self._requested_blocks(group)
        final_len = min(group.prompt_len + group.sampling.max_tokens, self.max_model_len)
        ranges = []
        for _ in range(group.max_num_seqs):
            start, size = self.allocator.allocate(blocks)
            ranges.append(Reservation(start, size, blocks, final_len))
        self._spare[group.request_id] = ranges
        for seq in group.seqs:
            self._take(seq, group.request_id)

    def _take(self, seq: Sequence, request_id: int) -> None:
        res = self._spare[request_id].pop(0)
        self._reservation[seq.seq_id] = res
        self._owner[seq.seq_id] = request_id
        seq.block_table = list(range(res.start, res.start + res.requested_blocks))
        seq.num_computed_tokens = 0

    # -- running ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        if seq.num_computed_tokens + num_new_tokens > len(seq.block_table) * self.block_size:
            raise CoreError(f"sequence {seq.seq_id} outgrew its reservation of {len(seq.block_table)} blocks")
        return 0

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        self.blocks_needed(seq, num_new_tokens)

    def steps_until_new_block(self, seq: Sequence) -> float:
        return math.inf  # the reservation covers every token the sequence will hold

    def fork(self, parent: Sequence, child: Sequence) -> None:
        # The child gets a range of its own and a copy of everything the parent has computed.
        computed = child.num_computed_tokens
        self._take(child, self._owner[parent.seq_id])
        child.num_computed_tokens = computed
        used = -(-parent.num_computed_tokens // self.block_size)
        self.pending_copies.extend(zip(parent.block_table[:used], child.block_table[:used]))

    def free(self, seq: Sequence) -> None:
        """The range goes back to the request (a later fork may reuse it); release() returns
        all of them to the allocator when the request leaves the device."""
        res = self._reservation.pop(seq.seq_id, None)
        if res is not None:
            self._spare[self._owner.pop(seq.seq_id)].append(res)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def release(self, group: SequenceGroup) -> None:
        for res in self._spare.pop(group.request_id, []):
            self.allocator.free(res.start)

    # -- accounting ------------------------------------------------------------------------
    def waste(self, running: list[SequenceGroup]) -> WasteBreakdown:
        bs = self.block_size
        token_states = reserved = internal = external = 0
        for group in running:
            holders = [(self._reservation[s.seq_id], s.num_computed_tokens) for s in group.seqs]
            holders += [(res, 0) for res in self._spare.get(group.request_id, [])]
            for res, computed in holders:
                requested = res.requested_blocks * bs
                will_use = min(res.final_len, requested)
                token_states += computed
                reserved += will_use - computed
                internal += requested - will_use
                external += (res.num_blocks - res.requested_blocks) * bs
        return WasteBreakdown(token_states, reserved, internal, external, self.allocator.num_free_blocks * bs)

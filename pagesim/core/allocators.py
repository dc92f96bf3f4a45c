"""Contiguous allocators over a pool of KV blocks, for the Orca-style reservation baselines.

Both hand out [start, start + size) ranges of block ids. Because ranges must be contiguous, free
space can be split into holes too small for the next request: external fragmentation happens
for real here rather than by formula.
"""

from __future__ import annotations

import bisect

from pagesim.core.errors import DoubleFree, OutOfBlocks

__all__ = ["BuddyAllocator", "FirstFitAllocator", "OutOfBlocks", "round_up_pow2"]


def round_up_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


class _ContiguousAllocator:
    """What both allocators keep alike: the live ranges, the count of free blocks and the
    largest range one request may get."""

    def __init__(self, num_blocks: int, max_chunk: int):
        self.num_blocks = num_blocks
        self.max_chunk = max_chunk
        self._allocated: dict[int, int] = {}  # start -> size of an allocated range
        self.num_free_blocks = num_blocks

    def _check_size(self, num_blocks: int) -> None:
        if num_blocks > self.max_chunk:
            raise ValueError(f"{num_blocks} blocks exceed the largest chunk of {self.max_chunk}")

    def _hand_out(self, start: int, size: int) -> tuple[int, int]:
        self._allocated[start] = size
        self.num_free_blocks -= size
        return start, size

    def _take_back(self, start: int) -> int:
        """The size of the range that starts at start, now free again."""
        try:
            size = self._allocated.pop(start)
        except KeyError:
            raise DoubleFree(f"no allocated range starts at block {start} (freed twice, or never allocated)") from None
        self.num_free_blocks += size
        return size

    def allocated_chunks(self) -> list[tuple[int, int]]:
        return sorted(self._allocated.items())


class BuddyAllocator(_ContiguousAllocator):
    """Binary buddy allocator. A request of n blocks takes a chunk of round_up_pow2(n) blocks
    (the rounding is what the paper's artifact did, and is external fragmentation in Fig. 2).
    Chunks are at most max_chunk blocks; a pool that is not a power of two is cut into aligned
    power-of-two pieces that never coalesce across their edges."""

    def __init__(self, num_blocks: int, max_chunk: int):
        if max_chunk & (max_chunk - 1):
            raise ValueError(f"max_chunk must be a power of two, got {max_chunk}")
        super().__init__(num_blocks, max_chunk)
        self._free: dict[int, set[int]] = {}  # chunk size -> start addresses of free chunks of that size
        self._free_size_at: dict[int, int] = {}  # start -> size of the free chunk starting there
        start = 0
        size = max_chunk
        while size:
            while start + size <= num_blocks and (start % size == 0):
                self._insert_free(start, size)
                start += size
            size //= 2

    def chunk_size(self, num_blocks: int) -> int:
        self._check_size(num_blocks)
        return round_up_pow2(num_blocks)

    def _insert_free(self, start: int, size: int) -> None:
        self._free.setdefault(size, set()).add(start)
        self._free_size_at[start] = size

    def _remove_free(self, start: int, size: int) -> None:
        self._free[size].discard(start)
        del self._free_size_at[start]

    def can_allocate(self, num_blocks: int) -> bool:
        need = self.chunk_size(num_blocks)
        return any(self._free.get(size) for size in _sizes_from(need, self.max_chunk))

    def allocate(self, num_blocks: int) -> tuple[int, int]:
        """Returns (start, chunk size). Lowest address among the smallest fitting chunks, so
        runs are deterministic."""
        need = self.chunk_size(num_blocks)
        for size in _sizes_from(need, self.max_chunk):
            if self._free.get(size):
                start = min(self._free[size])
                self._remove_free(start, size)
                while size > need:  # split, keeping the lower half
                    size //= 2
                    self._insert_free(start + size, size)
                return self._hand_out(start, need)
        raise OutOfBlocks(f"no free chunk of {need} blocks")

    def free(self, start: int) -> None:
        size = self._take_back(start)
        while size < self.max_chunk:
            buddy = start ^ size
            if self._free_size_at.get(buddy) != size:
                break
            self._remove_free(buddy, size)
            start, size = min(start, buddy), size * 2
        self._insert_free(start, size)

    def free_chunks(self) -> list[tuple[int, int]]:
        return sorted(self._free_size_at.items())


def _sizes_from(need: int, max_chunk: int):
    size = need
    while size <= max_chunk:
        yield size
        size *= 2


class FirstFitAllocator(_ContiguousAllocator):
    """Exact-size contiguous ranges at the lowest address that fits; neighbours merge on free."""

    def __init__(self, num_blocks: int, max_chunk: int | None = None):
        super().__init__(num_blocks, max_chunk if max_chunk is not None else num_blocks)
        self._starts: list[int] = [0] if num_blocks else []  # sorted starts of free extents
        self._length: dict[int, int] = {0: num_blocks} if num_blocks else {}

    def chunk_size(self, num_blocks: int) -> int:
        self._check_size(num_blocks)
        return num_blocks

    def can_allocate(self, num_blocks: int) -> bool:
        self.chunk_size(num_blocks)
        return any(self._length[s] >= num_blocks for s in self._starts)

    def allocate(self, num_blocks: int) -> tuple[int, int]:
        self.chunk_size(num_blocks)
        for i, start in enumerate(self._starts):
            length = self._length[start]
            if length >= num_blocks:
                del self._length[start]
                if length == num_blocks:
                    self._starts.pop(i)
                else:
                    self._starts[i] = start + num_blocks
                    self._length[start + num_blocks] = length - num_blocks
                return self._hand_out(start, num_blocks)
        raise OutOfBlocks(f"no free extent of {num_blocks} blocks")

    def free(self, start: int) -> None:
        size = self._take_back(start)
        i = bisect.bisect_left(self._starts, start)
        # merge with the following extent
        if i < len(self._starts) and self._starts[i] == start + size:
            size += self._length.pop(self._starts.pop(i))
        # merge with the preceding extent
        if i > 0 and self._starts[i - 1] + self._length[self._starts[i - 1]] == start:
            self._length[self._starts[i - 1]] += size
        else:
            self._starts.insert(i, start)
            self._length[start] = size

    def free_chunks(self) -> list[tuple[int, int]]:
        return [(s, self._length[s]) for s in self._starts]

"""Physical blocks of one memory (device or host): reference counts and a free queue whose
order is the eviction order (vLLM v1's block_pool.py), shared by every paged KV manager."""

from __future__ import annotations

from itertools import compress, repeat
from operator import add, eq, itemgetter, ne
from typing import Hashable, Iterable

from pagesim.core.errors import NegativeRefcount, OutOfBlocks
from pagesim.core.native import shallow_copy


# Batch operations over many blocks. Plain loops: Python 3.11 specialises a list store or a dict
# delete by an int key, which makes them cheaper than mapping operator.setitem/delitem from C and
# draining the map (the earlier form): per element, callgrind counts 271 instructions against 335
# for store, 153 against 331 for fill (770-block batches).
def store(values: list, indices, new) -> None:
    """values[i] = v for each i, v of indices and new, in that order."""
    for i, v in zip(indices, new):
        values[i] = v


def fill(values: list[int], indices: list[int], value: int) -> None:
    """values[i] = value for each i of indices."""
    for i in indices:
        values[i] = value


def gather(values, indices: list) -> tuple:
    """(values[i] for each i of indices), as a tuple (itemgetter: 150 instructions an element)."""
    if len(indices) > 1:
        return itemgetter(*indices)(values)
    return (values[indices[0]],) if indices else ()


def any_marked(counts: list[int], blocks: list[int]) -> bool:
    """Whether any of blocks has a nonzero count. (Compiled, ~50 instructions a block, callgrind;
    a set's isdisjoint costs ~130 and itemgetter with any() ~200, per block.)"""
    for block in blocks:
        if counts[block]:
            return True
    return False


class FreeBlockQueue:
    """The free blocks of a pool in eviction order: taken from the head, returned to the tail.

    A list with a moving head instead of an ordered dict, so that n blocks leave the head as one
    slice and n join the tail as one extend. A cached block revived by a prefix hit leaves from
    the middle: its entry stays, stale, and is skipped when the head reaches it. No position is
    kept per block: a block's entries lie in the order it was freed, and a revival always makes
    its latest entry stale, so all its entries but the last are stale, and counting its stale
    entries (_stale[block]) tells at the head whether an entry is one of them.
    """

    __slots__ = ("_order", "_head", "size", "_stale", "_num_stale", "_num_blocks")

    def __init__(self, num_blocks: int):
        self._order = list(range(num_blocks))  # entries before _head are spent
        self._head = 0
        self.size = num_blocks
        # block -> its stale entries at or after _head (a list: a take checks its blocks by index)
        self._stale = [0] * num_blocks
        self._num_stale = 0
        self._num_blocks = num_blocks

    def __len__(self) -> int:
        return self.size  # also a plain attribute: the pool's hot paths read it without a call

    def __contains__(self, block: int) -> bool:
        """(a walk of the queue, for checks: the pool knows a free block by its refcount of 0)"""
        return self._order[self._head:].count(block) > self._stale[block]

    def __iter__(self):
        return iter(self._live())

    def _live(self) -> list[int]:
        """The free blocks in order: the entries from the head on, less the stale ones (each
        block's first _stale[block] entries), found at C speed among the entries of blocks that
        have any."""
        entries = self._order[self._head:]
        if not self._num_stale:
            return entries
        left = dict(compress(enumerate(self._stale), self._stale))  # (the blocks that have any)
        keep = [True] * len(entries)
        for i in compress(range(len(entries)), map(left.__contains__, entries)):
            block = entries[i]
            if left[block]:
                left[block] -= 1
                keep[i] = False
        return list(compress(entries, keep))

    def __copy__(self) -> FreeBlockQueue:
        clone = FreeBlockQueue(0)  # (an empty queue, filled in below: no list of num_blocks entries made)
        clone._order, clone._stale = list(self._order), list(self._stale)
        clone._head, clone.size, clone._num_stale, clone._num_blocks = self._head, self.size, self._num_stale, self._num_blocks
        return clone

    def _skip_stale(self, block: int) -> None:
        """The entry of block at the head is stale: count it off."""
        self._stale[block] -= 1
        self._num_stale -= 1

    def popleft(self) -> int:
        """The block at the head (callers check len first)."""
        if self._num_stale:
            return self.popleft_n(1)[0]
        block = self._order[self._head]
        self._head += 1
        self.size -= 1
        if self._head > self._num_blocks:
            self._drop_spent()
        return block

    def popleft_n(self, n: int) -> list[int]:
        """The n blocks at the head, in order (callers check len first)."""
        head = self._head
        blocks = self._order[head:head + n]
        # (stale entries are few, one a revival: most takes pass none, and checking costs less than
        # finding them all, as _compact does, each time the spent entries are dropped)
        if self._num_stale and any_marked(self._stale, blocks):
            blocks, head = self._take_past_stale(n)
        else:
            head += n
        self._head = head
        self.size -= n
        if head > self._num_blocks:
            self._drop_spent()
        return blocks

    def _take_past_stale(self, n: int) -> tuple[list[int], int]:
        """The n live blocks from the head on, one entry at a time, counting off the stale ones
        passed; and the head past them."""
        order, stale, head = self._order, self._stale, self._head
        blocks: list[int] = []
        while len(blocks) < n:
            block = order[head]
            head += 1
            if stale[block]:  # (a block with stale entries: its first is one)
                self._skip_stale(block)
            else:
                blocks.append(block)
        return blocks, head

    def append(self, block: int) -> None:
        self._order.append(block)
        self.size += 1

    def extend(self, blocks) -> None:
        """Append each of blocks (a list, or any iterable: the size grows by what it yields)."""
        order = self._order
        before = len(order)
        order.extend(blocks)
        self.size += len(order) - before

    def remove(self, block: int) -> None:
        """Take a free block out of the queue (its latest entry becomes stale)."""
        self._stale[block] += 1
        self._num_stale += 1
        self.size -= 1
        if self._num_stale > self._num_blocks:
            self._compact()

    def remove_n(self, blocks) -> None:
        """remove each of blocks (distinct free blocks), in one pass at C speed; the free blocks
        and their order end as after one remove per block (compacting later changes no entry
        that is live)."""
        blocks = list(blocks)
        stale = self._stale
        store(stale, blocks, map(add, gather(stale, blocks), repeat(1)))
        self._num_stale += len(blocks)
        self.size -= len(blocks)
        if self._num_stale > self._num_blocks:
            self._compact()

    def _drop_spent(self) -> None:
        """Drop the entries before the head (once per num_blocks taken). Stale entries stay, to be
        passed when the head reaches them: they are few (a revival's each), and finding them
        among all the entries, as _compact does, costs a pass over the queue."""
        del self._order[:self._head]
        self._head = 0

    def _compact(self) -> None:
        """Drop spent and stale entries; amortized O(1), since it runs once per num_blocks stale ones."""
        self._order = self._live()
        self._head, self._stale, self._num_stale = 0, [0] * self._num_blocks, 0


class BlockPool:
    """Physical blocks of one memory (device or host) with reference counts and a free queue.

    The free queue's order is the eviction order: blocks are taken from its head and returned
    to its tail, so with prefix caching the least recently freed cached block is evicted first.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = False):
        self.num_blocks = num_blocks
        self.refcount = [0] * num_blocks
        self.free_queue = FreeBlockQueue(num_blocks)
        self.enable_caching = enable_caching
        self.block_hash: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}  # block hash -> block id holding those tokens
        self.num_evictions = 0
        # Sum of all refcounts: every block-table entry that points into this pool. Kept as a
        # running total so the memory-saving metric (1 - used / num_refs) costs nothing per step.
        self.num_refs = 0

    @property
    def num_free(self) -> int:
        return self.free_queue.size

    def __copy__(self) -> BlockPool:
        """A shallow copy (the same lists, queue and dict), as copy.copy gives a plain object
        (a class compiled by mypyc has no __dict__ for copy.copy to copy)."""
        return shallow_copy(self, lambda: BlockPool(0))

    def allocate(self) -> int:
        if not self.free_queue.size:
            raise OutOfBlocks(f"all {self.num_blocks} blocks are in use (callers check num_free first)")
        block = self.free_queue.popleft()
        if self.block_hash[block] is not None:
            self._evict(block)
        self.refcount[block] = 1
        self.num_refs += 1
        return block

    def allocate_n(self, n: int) -> list[int]:
        """n blocks from the head of the free queue, each with refcount 1: the same blocks, in
        the same order, as n calls to allocate()."""
        free = self.free_queue.size
        if n > free:
            state = f"all {self.num_blocks} blocks are in use" if not free else f"only {free} of {self.num_blocks} are free"
            raise OutOfBlocks(f"{n} blocks asked for, {state} (callers check num_free first)")
        blocks = self.free_queue.popleft_n(n)
        self.num_refs += n
        if not self.cached:
            fill(self.refcount, blocks, 1)
            return blocks
        # Blocks that hold cached contents forget them (_evict), in one pass with the refcounts:
        # ~700 instructions a block against ~870 for four passes (fill, gather, del, fill), and
        # with prefix caching nearly every block taken holds a key (Mooncake: 9 M of them).
        # (the evictions counted by the keys they take out of the cache, not one by one in the loop)
        refcount, block_hash, cached = self.refcount, self.block_hash, self.cached
        num_cached = len(cached)
        for block in blocks:
            refcount[block] = 1
            key = block_hash[block]
            if key is not None:
                del cached[key]
                block_hash[block] = None
        self.num_evictions += num_cached - len(cached)
        return blocks

    def _evict(self, block: int) -> None:
        """Forget the cached contents of a block taken from the free queue."""
        key = self.block_hash[block]
        assert key is not None  # (a block in the free queue with cached contents)
        del self.cached[key]
        self.block_hash[block] = None
        self.num_evictions += 1

    def incref(self, block: int) -> None:
        count = self.refcount[block]
        if not count:  # a cached block revived by a prefix hit
            self.free_queue.remove(block)
        self.refcount[block] = count + 1
        self.num_refs += 1

    def incref_n(self, blocks: list[int]) -> None:
        """incref each block (a prefix hit's blocks, a forked table), in batch when they are distinct."""
        counts = gather(self.refcount, blocks)
        if len(set(blocks)) != len(blocks):
            for block in blocks:
                self.incref(block)
            return
        if 0 in counts:  # cached blocks revived by a prefix hit
            self.free_queue.remove_n(compress(blocks, map(eq, counts, repeat(0))))
        store(self.refcount, blocks, map(add, counts, repeat(1)))
        self.num_refs += len(blocks)

    def decref(self, block: int) -> None:
        count = self.refcount[block]
        if count <= 0:
            raise NegativeRefcount(f"block {block} is already free (refcount {count})")
        self.refcount[block] = count - 1
        self.num_refs -= 1
        if count == 1:
            self.free_queue.append(block)

    def release(self, blocks: list[int], distinct: bool = False) -> None:
        """decref each block in turn; those that reach 0 join the free queue in that order, in
        one extend instead of one queue operation per block. distinct: the caller knows no block
        appears twice (one sequence's table), which spares checking it."""
        refcount = self.refcount
        counts = gather(refcount, blocks)
        n = len(blocks)
        last = counts.count(1)  # blocks whose last reference this is
        if (distinct or len(set(blocks)) == n) and (last == n or 0 not in counts):
            # (the common case, checked at C speed: distinct blocks all in use, nothing can fail)
            if last == n:  # (no block shared: every one is freed)
                fill(refcount, blocks, 0)
                self.free_queue.extend(blocks)
            else:
                # The shared blocks (a prefix hit's, usually few) lose one reference each, the
                # others are freed by one fill: a store of every count less one (map(sub)) cost
                # ~4x as much per block, and a table that hit the cache shares some of its blocks.
                # A table freed tail first has its shared prefix last: then the freed blocks are
                # one slice, else they are picked out (compress) where they lie.
                cut = last
                if 1 in counts[cut:]:
                    freed = list(compress(blocks, map(eq, counts, repeat(1))))
                    shared: Iterable[int] = compress(blocks, map(ne, counts, repeat(1)))
                else:
                    freed, shared = blocks[:cut], blocks[cut:]
                for block in shared:
                    refcount[block] -= 1
                if freed:
                    fill(refcount, freed, 0)
                    self.free_queue.extend(freed)
            self.num_refs -= n
            return
        freed = []
        for i, block in enumerate(blocks):
            count = refcount[block]
            if count <= 0:
                self.free_queue.extend(freed)  # keep the pool consistent up to the bad block
                self.num_refs -= i
                raise NegativeRefcount(f"block {block} is already free (refcount {count})")
            refcount[block] = count - 1
            if count == 1:
                freed.append(block)
        self.num_refs -= len(blocks)
        self.free_queue.extend(freed)

    def register(self, block: int, block_hash: Hashable) -> None:
        """Record that block holds the full block of tokens identified by block_hash."""
        if self.block_hash[block] is None and block_hash not in self.cached:
            self.block_hash[block] = block_hash
            self.cached[block_hash] = block

"""BlockPool's free queue and allocate_n against a plain reference: an OrderedDict free queue
with one dict operation per block (what the pool did before allocate_n). Same operations, same
blocks handed out in the same order, same evictions, same free queue after every step."""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.core import BlockPool
from pagesim.core.block_pool import FreeBlockQueue
from pagesim.core.errors import NegativeRefcount, OutOfBlocks


class ReferencePool:
    def __init__(self, num_blocks: int):
        self.refcount = [0] * num_blocks
        self.free = OrderedDict.fromkeys(range(num_blocks))
        self.block_hash: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self.evictions = 0

    def allocate(self) -> int:
        block, _ = self.free.popitem(last=False)
        if block in self.block_hash:
            del self.cached[self.block_hash.pop(block)]
            self.evictions += 1
        self.refcount[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.refcount[block] == 0:
            del self.free[block]
        self.refcount[block] += 1

    def decref(self, block: int) -> None:
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self.free[block] = None

    def register(self, block: int, h: int) -> None:
        if block not in self.block_hash and h not in self.cached:
            self.block_hash[block] = h
            self.cached[h] = block


# (kind, argument): allocate n, allocate one, decref the i-th held reference, release the last k, incref a held block, revive a
# free cached block (a prefix hit), register a held block under a hash, incref several at once
# (held and free cached blocks mixed, as a prefix hit's; sometimes one of them twice)
OPS = st.lists(st.tuples(st.sampled_from(["alloc", "alloc1", "decref", "release", "incref", "revive", "register",
                                          "incref_n"]),
                         st.integers(0, 40)),
               max_size=200)


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(1, 6), ops=OPS)
def test_block_pool_matches_ordered_dict_reference(num_blocks, ops):
    pool, ref = BlockPool(num_blocks, enable_caching=True), ReferencePool(num_blocks)
    held: list[int] = []  # one entry per reference taken
    for kind, arg in ops:
        if kind == "alloc":
            n = arg % (num_blocks + 2)
            if n > len(ref.free):
                with pytest.raises(OutOfBlocks):
                    pool.allocate_n(n)
                continue
            blocks = pool.allocate_n(n)
            assert blocks == [ref.allocate() for _ in range(n)]
            held += blocks
        elif kind == "alloc1" and ref.free:
            held.append(pool.allocate())
            assert held[-1] == ref.allocate()
        elif kind == "release" and held:
            # the last k references taken, newest first (a sequence freeing its table's tail first)
            k = arg % len(held) + 1
            blocks = held[-k:][::-1]
            del held[-k:]
            pool.release(blocks)
            for block in blocks:
                ref.decref(block)
        elif kind == "decref" and held:
            block = held.pop(arg % len(held))
            pool.decref(block), ref.decref(block)
        elif kind == "incref" and held:
            block = held[arg % len(held)]
            pool.incref(block), ref.incref(block)
            held.append(block)
        elif kind == "revive":
            cached_free = [b for b in ref.free if b in ref.block_hash]
            if cached_free:
                block = cached_free[arg % len(cached_free)]
                pool.incref(block), ref.incref(block)
                held.append(block)
        elif kind == "incref_n":
            candidates = sorted(set(held)) + [b for b in ref.free if b in ref.block_hash]
            if candidates:
                start = arg % len(candidates)
                blocks = candidates[start:start + arg % 4 + 1]
                if arg % 5 == 0:
                    blocks.append(blocks[0])
                pool.incref_n(blocks)
                for block in blocks:
                    ref.incref(block)
                held += blocks
        elif kind == "register" and held:
            block = held[arg % len(held)]
            pool.register(block, arg), ref.register(block, arg)
        assert list(pool.free_queue) == list(ref.free)
        assert pool.num_free == len(ref.free) and pool.refcount == ref.refcount
        assert all((b in pool.free_queue) == (b in ref.free) for b in range(num_blocks))
        assert pool.cached == ref.cached and pool.num_evictions == ref.evictions
        assert {b: h for b, h in enumerate(pool.block_hash) if h is not None} == ref.block_hash
        assert pool.num_refs == sum(ref.refcount)


def test_free_queue_compacts_and_copies_independently():
    # Many allocate/free cycles and revivals: the queue's list must not grow without bound,
    # and a copy must not share state with the original.
    pool = BlockPool(4, enable_caching=True)
    for i in range(1000):
        blocks = pool.allocate_n(3)
        pool.register(blocks[0], i)
        for b in reversed(blocks):
            pool.decref(b)
        pool.incref(blocks[0]), pool.decref(blocks[0])  # revive the cached block, free it again
    assert len(pool.free_queue._order) <= 3 * pool.num_blocks
    clone = copy.copy(pool.free_queue)
    order = list(pool.free_queue)
    clone.popleft_n(2)
    assert list(pool.free_queue) == order and len(clone) == 2


def test_revived_block_in_the_middle_is_skipped():
    # A prefix hit takes a cached block out of the middle of the free queue; allocating past
    # that point must skip it and hand out the next blocks in eviction order.
    pool = BlockPool(4, enable_caching=True)
    a, b = pool.allocate_n(2)
    pool.register(a, 11)
    pool.decref(a), pool.decref(b)  # free queue: 2 3 a b
    pool.incref(a)  # the hit revives a
    assert list(pool.free_queue) == [2, 3, b] and a not in pool.free_queue
    assert pool.allocate_n(3) == [2, 3, b]
    assert pool.num_free == 0 and pool.num_evictions == 0 and pool.cached == {11: a}


def test_release_of_a_free_block_raises_and_keeps_the_pool_consistent():
    pool = BlockPool(3)
    a, b = pool.allocate_n(2)
    with pytest.raises(NegativeRefcount, match="block 2 is already free"):
        pool.release([b, 2, a])
    assert list(pool.free_queue) == [2, b] and pool.refcount == [1, 0, 0] and pool.num_refs == 1


# (kind, argument) for the free queue alone: take n from the head, take one, free a held block,
# free several held blocks in one extend, revive a free block from anywhere in the queue, revive
# a run of free blocks in one remove_n, revive and free one block several times over (several
# stale entries of one block), copy
QUEUE_OPS = st.lists(st.tuples(st.sampled_from(["take", "take1", "free", "free_many", "revive", "revive_many", "churn",
                                                "copy"]),
                               st.integers(0, 40)),
                     max_size=300)


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 12), ops=QUEUE_OPS)
def test_free_queue_matches_a_plain_list(num_blocks, ops):
    # The queue keeps no position per block, only each block's count of stale entries; a plain
    # list (remove from the middle, take from the front) is the brute-force model. Long mixes on
    # tiny pools revive the same block many times between compactions.
    queue, model = FreeBlockQueue(num_blocks), list(range(num_blocks))
    held: list[int] = []
    for kind, arg in ops:
        if kind == "take" and model:
            n = arg % len(model) + 1
            assert queue.popleft_n(n) == model[:n]
            held += model[:n]
            del model[:n]
        elif kind == "take1" and model:
            block = queue.popleft()
            assert block == model.pop(0)
            held.append(block)
        elif kind == "free" and held:
            block = held.pop(arg % len(held))
            queue.append(block), model.append(block)
        elif kind == "free_many" and held:
            k = arg % len(held) + 1
            blocks = held[-k:][::-1]
            del held[-k:]
            queue.extend(iter(blocks)), model.extend(blocks)  # (any iterable: release passes a compress)
        elif kind == "revive" and model:
            block = model.pop(arg % len(model))
            queue.remove(block)
            held.append(block)
        elif kind == "revive_many" and model:  # (a prefix hit's free blocks, taken out in one pass)
            start = arg % len(model)
            blocks = model[start:start + arg % 5 + 1]
            del model[start:start + len(blocks)]
            queue.remove_n(iter(blocks[::-1]))
            held += blocks
        elif kind == "churn" and model:
            block = model.pop(arg % len(model))
            for _ in range(arg % 4 + 1):
                queue.remove(block), queue.append(block)
            model.append(block)
        elif kind == "copy":
            clone = copy.copy(queue)
            if len(clone):
                clone.popleft_n(len(clone))
            clone.extend([])
        assert list(queue) == model and len(queue) == len(model)
        assert [b in queue for b in range(num_blocks)] == [b in model for b in range(num_blocks)]
        assert len(queue._order) <= 3 * num_blocks  # compaction bounds the list (spent, stale, live)


def test_many_stale_entries_in_one_take():
    # Seven blocks revived and freed again (each leaves a stale entry at its old place): one take
    # of the whole queue passes them all (the one-entry-at-a-time path), and the queue stays exact.
    queue = FreeBlockQueue(10)
    for block in range(7):
        queue.remove(block), queue.append(block)
    assert list(queue) == [7, 8, 9, 0, 1, 2, 3, 4, 5, 6]
    assert queue.popleft_n(10) == [7, 8, 9, 0, 1, 2, 3, 4, 5, 6] and len(queue) == 0
    queue.extend([3, 1])
    assert list(queue) == [3, 1] and queue.popleft_n(2) == [3, 1]


@pytest.mark.parametrize("shared", [(), (0,), (4,), (3, 4), (0, 2), (1, 3, 4), (0, 1, 2, 3, 4)])
def test_release_with_shared_blocks_anywhere_matches_one_decref_each(shared):
    # release's fast path frees a slice when the shared blocks come last (a table freed tail
    # first, its hit prefix last) and picks the freed ones out otherwise: both as decref one by one
    pool, ref = BlockPool(6, enable_caching=True), ReferencePool(6)
    blocks = pool.allocate_n(5)
    assert blocks == [ref.allocate() for _ in range(5)]
    for i in shared:  # another table holds these too
        pool.incref(blocks[i]), ref.incref(blocks[i])
    pool.release(blocks, distinct=True)
    for block in blocks:
        ref.decref(block)
    assert pool.refcount == ref.refcount and list(pool.free_queue) == list(ref.free)
    assert pool.num_refs == sum(ref.refcount)


def test_stale_entry_outlives_dropping_the_spent_ones():
    # Dropping the spent entries keeps a stale one ahead of the head; a later take passes it.
    queue = FreeBlockQueue(4)
    assert queue.popleft_n(3) == [0, 1, 2]
    queue.extend([0, 1, 2])  # entries 0 1 2 | 3 0 1 2
    queue.remove(1)  # a revival: the entry of 1 goes stale
    assert queue.popleft_n(2) == [3, 0]  # past the fourth entry: the spent ones are dropped
    assert queue._order == [1, 2] and list(queue) == [2] and 1 not in queue
    queue.append(1)
    assert list(queue) == [2, 1] and queue.popleft_n(2) == [2, 1] and len(queue) == 0

"""The core fails loudly and by name: every broken invariant raises one of pagesim.core.errors,
none of which a caller catching KeyError, IndexError or RuntimeError would swallow."""

from __future__ import annotations

import pytest

from pagesim.core import (BlockPool, BuddyAllocator, CannotServe, CoreError, DoubleFree, FirstFitAllocator,
                          NegativeRefcount, OutOfBlocks, PagedKVManager, Request, SamplingParams, Sequence)
from pagesim.sim.specs import kv_cache_capacity


def test_core_errors_are_not_the_exceptions_callers_used_to_swallow():
    for error in (OutOfBlocks, DoubleFree, NegativeRefcount):
        assert issubclass(error, CoreError)
        assert not issubclass(error, (KeyError, IndexError, RuntimeError, ValueError, NotImplementedError))
    assert issubclass(CannotServe, ValueError) and not issubclass(CannotServe, CoreError)


def test_empty_block_pool_raises_out_of_blocks():
    empty = BlockPool(0)
    with pytest.raises(OutOfBlocks, match="all 0 blocks"):
        empty.allocate()
    pool = BlockPool(2)
    pool.allocate(), pool.allocate()
    with pytest.raises(OutOfBlocks):
        pool.allocate()


def test_refcount_never_goes_negative():
    pool = BlockPool(3)
    block = pool.allocate()
    pool.decref(block)
    assert pool.refcount[block] == 0 and pool.num_free == 3
    with pytest.raises(NegativeRefcount, match=f"block {block} is already free"):
        pool.decref(block)
    assert pool.refcount[block] == 0 and pool.num_free == 3  # the failed call changed nothing


def test_freeing_a_sequence_twice_is_caught():
    mgr = PagedKVManager(8, block_size=4)
    seq = Sequence(0, 10, None)
    mgr.allocate_slots(seq, 10)
    table = list(seq.block_table)
    mgr.free(seq)
    seq.block_table = table  # a driver bug: the same blocks freed again
    with pytest.raises(NegativeRefcount):
        mgr.free(seq)


@pytest.mark.parametrize("allocator", [BuddyAllocator(16, 8), FirstFitAllocator(16)])
def test_contiguous_allocators_catch_double_free_and_exhaustion(allocator):
    start, size = allocator.allocate(4)
    allocator.free(start)
    with pytest.raises(DoubleFree, match=f"block {start}"):
        allocator.free(start)
    with pytest.raises(DoubleFree):
        allocator.free(5)  # never the start of an allocation
    allocator.allocate(8), allocator.allocate(8)
    with pytest.raises(OutOfBlocks):
        allocator.allocate(1)


def test_a_model_that_leaves_no_kv_pool_cannot_serve():
    # OPT-175B's 350 GB of weights on one 40 GB GPU: a documented "cannot serve", not a bug
    with pytest.raises(CannotServe, match="leaves no KV pool"):
        kv_cache_capacity("opt-175b", "a100-40gb", tp=1)
    with pytest.raises(CannotServe, match="cannot be split"):
        kv_cache_capacity("llama-2-7b", "a100-80gb", tp=3)


def test_requests_that_never_fit_are_rejected_not_raised():
    from pagesim.core import SchedulerConfig, make_scheduler
    from pagesim.core.policies import PoolConfig

    sched = make_scheduler("paged", PoolConfig(0, 0, 16), SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=2048))
    group = sched.add_request(Request(0, 10, SamplingParams(max_tokens=5)))
    assert group.reject_reason == "needs 1 KV blocks at its longest, the pool has 0 usable"
    assert not sched.has_unfinished

"""BuddyAllocator and FirstFitAllocator against a brute-force bitmap of the pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.core import BuddyAllocator, FirstFitAllocator, OutOfBlocks

OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), max_size=60)
SETTINGS = settings(max_examples=100, deadline=None)


def pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def pieces(num_blocks: int, max_chunk: int) -> list[tuple[int, int]]:
    """The pool cut into max_chunk pieces, then the remainder's binary digits, largest first."""
    out = [(i * max_chunk, max_chunk) for i in range(num_blocks // max_chunk)]
    start, rest, size = len(out) * max_chunk, num_blocks % max_chunk, max_chunk
    while size > 1:
        size //= 2
        if rest & size:
            out.append((start, size))
            start += size
    return out


def canonical_free_chunks(bitmap: list[bool], num_blocks: int, max_chunk: int) -> list[tuple[int, int]]:
    """Maximal all-free buddy nodes: what a fully coalescing buddy allocator's free list is."""
    out = []

    def node(a, size):
        cells = bitmap[a:a + size]
        if all(cells):
            out.append((a, size))
        elif any(cells):
            node(a, size // 2)
            node(a + size // 2, size // 2)

    for a, size in pieces(num_blocks, max_chunk):
        node(a, size)
    return sorted(out)


class Model:
    """The pool as a bitmap (True = free) and the live allocations."""

    def __init__(self, num_blocks):
        self.free = [True] * num_blocks
        self.live: dict[int, int] = {}

    def take(self, start, size):
        assert 0 <= start and start + size <= len(self.free), (start, size)
        assert all(self.free[start:start + size]), f"range {start}+{size} overlaps a live allocation"
        self.free[start:start + size] = [False] * size
        self.live[start] = size

    def give(self, start):
        size = self.live.pop(start)
        self.free[start:start + size] = [True] * size

    def free_runs(self):
        runs, a = [], None
        for i, f in enumerate(self.free + [False]):
            if f and a is None:
                a = i
            elif not f and a is not None:
                runs.append((a, i - a))
                a = None
        return runs


def check_common(alloc, model):
    assert alloc.num_free_blocks == sum(model.free)
    assert alloc.allocated_chunks() == sorted(model.live.items())
    covered = [False] * len(model.free)
    for start, size in alloc.free_chunks():
        for i in range(start, start + size):
            assert not covered[i], "free chunks overlap"
            covered[i] = True
    assert covered == model.free, "free list does not cover exactly the free blocks"


def run_ops(alloc, model, ops, max_size, on_alloc, after, free_order):
    """Apply ops to the allocator and the bitmap alike, then free what is left in a random order;
    after() checks the two agree after every step."""
    for is_alloc, x in ops:
        if is_alloc or not model.live:
            n = 1 + x % max_size
            ok = alloc.can_allocate(n)
            on_alloc(n, ok)  # checks the brute-force answer, before the state changes
            if ok:
                start, size = alloc.allocate(n)
                model.take(start, size)
            else:
                with pytest.raises(OutOfBlocks):
                    alloc.allocate(n)
        else:
            starts = sorted(model.live)
            start = starts[x % len(starts)]
            alloc.free(start)
            model.give(start)
        after()
    live = sorted(model.live)
    free_order.shuffle(live)
    for start in live:
        alloc.free(start)
        model.give(start)
        after()


@SETTINGS
@given(num_blocks=st.integers(0, 70), log_max=st.integers(0, 5), ops=OPS, order=st.randoms())
def test_buddy_against_bitmap(num_blocks, log_max, ops, order):
    max_chunk = 1 << log_max
    alloc = BuddyAllocator(num_blocks, max_chunk)
    model = Model(num_blocks)
    initial = pieces(num_blocks, max_chunk)
    assert alloc.free_chunks() == initial

    def on_alloc(n, ok):
        s = pow2_at_least(n)
        expected = any(all(model.free[a:a + s]) for ps, psz in initial if psz >= s for a in range(ps, ps + psz, s))
        assert ok == expected, f"can_allocate({n}) = {ok}, bitmap says {expected}"
        if ok:
            # smallest fitting free chunk, lowest address among those
            fits = [(size, a) for a, size in canonical_free_chunks(model.free, num_blocks, max_chunk) if size >= s]
            want = min(fits)[1]
            start, size = alloc.allocate(n)
            alloc.free(start)
            assert (start, size) == (want, s), f"allocate({n}) gave {(start, size)}, expected {(want, s)}"

    def after():
        check_common(alloc, model)
        for start, size in list(model.live.items()) + alloc.free_chunks():
            assert size & (size - 1) == 0 and size <= max_chunk and start % size == 0, (start, size)
            assert any(ps <= start and start + size <= ps + psz for ps, psz in initial), "chunk crosses a piece edge"
        assert alloc.free_chunks() == canonical_free_chunks(model.free, num_blocks, max_chunk), "buddies left uncoalesced"

    run_ops(alloc, model, ops, max_chunk, on_alloc, after, order)
    assert alloc.free_chunks() == initial
    assert alloc.num_free_blocks == num_blocks


@SETTINGS
@given(num_blocks=st.integers(1, 70), max_size=st.integers(1, 24), ops=OPS, order=st.randoms())
def test_first_fit_against_bitmap(num_blocks, max_size, ops, order):
    alloc = FirstFitAllocator(num_blocks, max_chunk=24)
    model = Model(num_blocks)

    def on_alloc(n, ok):
        first = next((a for a in range(num_blocks - n + 1) if all(model.free[a:a + n])), None)
        assert ok == (first is not None), f"can_allocate({n}) = {ok}, bitmap has a run at {first}"
        if ok:
            start, size = alloc.allocate(n)
            alloc.free(start)
            assert (start, size) == (first, n), f"first fit of {n} should be at {first}, got {start}"

    def after():
        check_common(alloc, model)
        assert alloc.free_chunks() == model.free_runs(), "free extents are not the maximal free runs"

    run_ops(alloc, model, ops, max_size, on_alloc, after, order)
    assert alloc.free_chunks() == ([(0, num_blocks)] if num_blocks else [])


def test_buddy_rejects_oversized_and_bad_max_chunk():
    with pytest.raises(ValueError):
        BuddyAllocator(64, 12)
    alloc = BuddyAllocator(64, 16)
    with pytest.raises(ValueError):
        alloc.allocate(17)
    assert alloc.allocate(9) == (0, 16)  # rounded to a power of two
    assert alloc.num_free_blocks == 48


def test_first_fit_max_chunk():
    alloc = FirstFitAllocator(64, max_chunk=16)
    with pytest.raises(ValueError):
        alloc.allocate(17)
    assert alloc.allocate(9) == (0, 9)  # exact size


def test_buddy_does_not_coalesce_across_pieces():
    # 12 blocks with chunks of at most 8: pieces [0, 8) and [8, 12); a 4 at 8 never merges with [0, 8).
    alloc = BuddyAllocator(12, 8)
    assert alloc.free_chunks() == [(0, 8), (8, 4)]
    a = alloc.allocate(4)
    b = alloc.allocate(4)
    assert sorted([a, b]) == [(0, 4), (8, 4)]
    assert not alloc.can_allocate(8)
    alloc.free(8)
    assert not alloc.can_allocate(8)
    alloc.free(0)
    assert alloc.free_chunks() == [(0, 8), (8, 4)]

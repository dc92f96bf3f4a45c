"""block_hashes against the chained hash written out by hand: key i is hash((key i-1, the ids of
block i as a tuple)), key -1 being 0; asked for more blocks than the ids fill, the last are
partial or empty tuples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.core.paged import block_hashes, chain_keys, fast_block_key, sha256_block_key


def reference(ids: list[int], block_size: int, num_blocks: int) -> list[int]:
    keys, parent = [], 0
    for i in range(num_blocks):
        parent = hash((parent, tuple(ids[i * block_size:(i + 1) * block_size])))
        keys.append(parent)
    return keys


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 50), max_size=40), block_size=st.integers(1, 6), extra=st.integers(-3, 3))
def test_block_hashes_match_the_chain_by_hand(ids, block_size, extra):
    num_blocks = max(0, len(ids) // block_size + extra)
    assert block_hashes(ids, block_size, num_blocks) == reference(ids, block_size, num_blocks)
    assert block_hashes(ids, block_size, num_blocks, fast_block_key) == reference(ids, block_size, num_blocks)


def test_sha256_keys_chain_the_same_spans():
    ids = list(range(10))
    a, b, c = block_hashes(ids, 4, 3, sha256_block_key)  # blocks (0..3), (4..7), (8, 9): the last partial
    assert a == sha256_block_key(b"", (0, 1, 2, 3))
    assert b == sha256_block_key(a, (4, 5, 6, 7)) and c == sha256_block_key(b, (8, 9))


def test_sha256_keys_tell_numbered_parents_apart():
    # the first block past a hashed prompt chains from its numbered key (an int): two prompts
    # with the same output tokens must still get different keys (the int was once dropped)
    tokens = (7, 7, 7, 7)
    a, b = sha256_block_key((1 << 62) + 5, tokens), sha256_block_key((1 << 62) + 99, tokens)
    assert a != b and len({a, b, sha256_block_key(0, tokens), sha256_block_key(b"", tokens)}) == 3
    assert sha256_block_key(0, tokens) == sha256_block_key(b"", tokens)  # the root: nothing before it


@settings(max_examples=100, deadline=None)
@given(parent=st.integers(-2**63, 2**63 - 1), spans=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=12))
def test_fast_chain_keys_are_the_chain_by_hand_from_any_parent(parent, spans):
    # chain_keys maps hash over a zip that reads the list it extends: key i is hash((key i-1, block i))
    expected, key = [], parent
    for span in spans:
        key = hash((key, span))
        expected.append(key)
    assert chain_keys(parent, iter(spans), fast_block_key) == expected
    assert chain_keys(parent, iter(spans), lambda p, t: hash((p, t))) == expected  # (the accumulate path)

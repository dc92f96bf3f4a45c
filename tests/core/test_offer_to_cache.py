"""offer_to_cache against the rule written out one block at a time: for each index (retries
first, then start..end-1), a block that holds no key takes its key unless another block already
holds that key (then the index is returned). Random tables, keys with repeats, blocks already
keyed, keys already cached, and the batch fast path's cases (none held, some held, repeats
inside the batch) all meet the same state.
"""

from __future__ import annotations

import random

import pytest

from pagesim.core.block_pool import BlockPool
from pagesim.core.paged import offer_to_cache


def offer_one_by_one(block_hash: list, cached: dict, table, keys, retry, start, end) -> list[int]:
    left = []
    for i in list(retry or ()) + list(range(start, end)):
        block = table[i]
        if block < 0 or block_hash[block] is not None:
            continue
        if keys[i] in cached:
            left.append(i)
        else:
            block_hash[block] = keys[i]
            cached[keys[i]] = block
    return left


def random_case(rng: random.Random):
    pool = BlockPool(40, enable_caching=True)
    # some blocks already hold keys (registered by other tables), from a small key space
    for block in rng.sample(range(40), rng.randint(0, 15)):
        key = rng.randrange(30)
        if key not in pool.cached:
            pool.block_hash[block], pool.cached[key] = key, block
    n = rng.randint(1, 20)
    table = rng.sample(range(40), n)
    if rng.random() < 0.2:  # a freed sliding-window entry
        table[rng.randrange(n)] = -1
    keys = [rng.randrange(30) if rng.random() < 0.5 else 100 + rng.randrange(8) for _ in range(n)]
    start = rng.randint(0, n)
    retry = sorted(rng.sample(range(start), rng.randint(0, min(3, start)))) if rng.random() < 0.3 else None
    return pool, table, keys, retry, start, rng.randint(start, n)


@pytest.mark.parametrize("seed", range(400))
def test_offer_to_cache_is_the_one_by_one_rule(seed):
    pool, table, keys, retry, start, end = random_case(random.Random(seed))
    block_hash, cached = list(pool.block_hash), dict(pool.cached)
    expected = offer_one_by_one(block_hash, cached, table, keys, retry, start, end)
    assert offer_to_cache(pool, table, keys, retry, start, end) == expected
    assert pool.block_hash == block_hash
    assert pool.cached == cached
    assert list(pool.cached) == list(cached)  # (the same insertion order, too)


def test_fast_path_with_a_held_key_and_a_repeat():
    pool = BlockPool(8, enable_caching=True)
    pool.block_hash[7], pool.cached["k1"] = "k1", 7  # another table's block holds k1
    left = offer_to_cache(pool, [0, 1, 2, 3], ["k0", "k1", "k2", "k0"], None, 0, 4)
    assert left == [1, 3]  # k1 is held by block 7; the second k0 by block 0, offered just before
    assert pool.cached == {"k1": 7, "k0": 0, "k2": 2}
    assert pool.block_hash[:4] == ["k0", None, "k2", None]

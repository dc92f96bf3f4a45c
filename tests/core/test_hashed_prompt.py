"""A prompt known by its block hash ids (Mooncake's traces) against the same prompt as
materialised token ids: the same tokens, the same prefix-cache keys up to renaming, and the
same scheduler and cache behaviour step by step (hits, evictions, block tables)."""

from __future__ import annotations

import random

import pytest

from pagesim.core import Request, SamplingParams
from pagesim.core.hashed_prompt import HashChainKeys, HashedPrompt
from pagesim.core.paged import block_hashes, fast_block_key, sha256_block_key

from .driver import FakeEngine, make_scheduler


def test_canonical_tokens_by_hand():
    p = HashedPrompt((7, 2, 7), length=10, block_tokens=4)  # blocks [7: 4 tokens] [2: 4] [7: 2, partial]
    assert p.to_list() == [28, 29, 30, 31, 8, 9, 10, 11, 28, 29]
    assert [p.token_id(i) for i in range(10)] == p.to_list()
    assert p.truncated(5) == HashedPrompt((7, 2), 5, 4)
    with pytest.raises(ValueError, match="3 hash ids for 6 tokens"):
        HashedPrompt((1, 2, 3), 6, 4)
    with pytest.raises(IndexError):
        p.token_id(10)


def random_prompts(rng: random.Random, count: int, block_tokens: int) -> list[HashedPrompt]:
    """Prompts that share prefixes of hash ids (few distinct ids, so many chains repeat), with a
    hash id sometimes reused at another position or as a partial last block."""
    prompts = []
    for _ in range(count):
        if prompts and rng.random() < 0.6:
            base = rng.choice(prompts).hash_ids
            ids = list(base[:rng.randint(1, len(base))])
        else:
            ids = []
        # ids from 1: hash id 0's canonical tokens 0..block_tokens-1 would include the fake
        # engine's output token 7, a coincidence no hashed prompt has (its real tokens are unknown)
        ids += [rng.randrange(1, 7) for _ in range(rng.randint(0 if ids else 1, 4))]
        length = (len(ids) - 1) * block_tokens + rng.randint(1, block_tokens)
        prompts.append(HashedPrompt(tuple(ids), length, block_tokens))
    return prompts


@pytest.mark.parametrize("block_tokens,block_size", [(8, 4), (8, 8), (8, 3), (8, 16), (6, 4), (512, 16)])
@pytest.mark.parametrize("key", [fast_block_key, sha256_block_key])
def test_keys_equal_exactly_when_materialised_ids_hash_equal(block_tokens, block_size, key):
    rng = random.Random(f"{block_tokens}-{block_size}")
    prompts = random_prompts(rng, 60, block_tokens)
    numbered = HashChainKeys(block_size, key)
    by_ids, by_hash, by_number = {}, {}, {}
    for p in prompts:
        n = (p.length - 1) // block_size
        # the reference: chained keys of the materialised ids; the prefix (as a tuple) names a block
        ref = block_hashes(p.to_list(), block_size, n, key)
        for i, (a, b, c) in enumerate(zip(ref, p.block_keys(block_size, n, key), numbered.keys(p, n))):
            prefix = tuple(p.to_list()[:(i + 1) * block_size])
            # each key names one prefix and each prefix one key, in all three schemes
            for seen, k in ((by_ids, a), (by_hash, b), (by_number, c)):
                assert seen.setdefault(k, prefix) == prefix
        assert len(ref) == n
    assert len(by_ids) == len(by_hash) == len(by_number)
    assert len(by_ids) < sum((p.length - 1) // block_size for p in prompts)  # some prefixes repeat


def test_numbered_keys_never_meet_real_token_keys():
    # numbered keys are machine-word ints from 2^62 on: never equal to a sha256 key (bytes), and
    # a fast key (any machine word) meets one only as two fast keys meet (2^-64 a pair; none here)
    p = HashedPrompt((0,), 64, 64)
    keys = HashChainKeys(4, fast_block_key).keys(p, 15)
    real = block_hashes(list(range(64)), 4, 15)
    assert not set(keys) & set(real) and all(type(k) is int and 2**62 <= k < 2**63 for k in keys)
    assert all(isinstance(k, bytes) for k in block_hashes(list(range(64)), 4, 15, sha256_block_key))


def kv_view(sched) -> dict:
    """What the cache does, with its keys left out (they are named differently on purpose)."""
    kv = sched.kv
    return {
        "tables": [(s.seq_id, s.status, tuple(s.block_table), s.num_computed_tokens)
                   for q in (sched.running, sched.swapped, sched.waiting) for g in q for s in g.seqs],
        "free_queue": list(kv.device.free_queue), "refcount": list(kv.device.refcount),
        "cached_blocks": sorted(kv.device.cached.values()),
        "registered": [h is not None for h in kv.device.block_hash],
        "evictions": kv.device.num_evictions, "hits": (kv.prefix_queries, kv.prefix_hits),
    }


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("block_size,chunked,mode", [(4, False, "recompute"), (3, True, "recompute"), (4, True, "swap")])
def test_scheduler_runs_hashed_and_materialised_prompts_alike(seed, block_size, chunked, mode):
    rng = random.Random(f"run-{seed}-{block_size}")
    prompts = random_prompts(rng, 80, block_tokens=8)
    outputs = [rng.randint(1, 12) for _ in prompts]
    engines = []
    for hashed in (False, True):
        sched = make_scheduler("paged", mode, chunked, num_blocks=40, block_size=block_size, caching=True,
                               max_model_len=64)
        # the materialised run has its memory checked by the fake engine; the hashed one has no ids to check
        engines.append(FakeEngine(sched, check_memory=not hashed, explicit_samples=False))
    pending = list(range(len(prompts)))
    while pending or engines[0].sched.has_unfinished:
        for _ in range(min(rng.randint(0, 3), len(pending))):
            i = pending.pop(0)
            sampling = SamplingParams(max_tokens=outputs[i], ignore_eos=True)
            p = prompts[i]
            engines[0].add(Request(i, p.length, sampling, prompt_token_ids=p.to_list()))
            engines[1].add(Request(i, p.length, sampling, hashed_prompt=p))
        for eng in engines:
            eng.step()
        assert kv_view(engines[0].sched) == kv_view(engines[1].sched), f"step {engines[0].steps}"
    kv = engines[1].kv
    assert kv.prefix_hits > 0 and kv.device.num_evictions > 0  # the case exercised what it is about


def test_vocab_ids_keep_the_sharing_and_stay_in_the_vocabulary():
    a = HashedPrompt((3, 9, 4), 1100, 512)
    b = HashedPrompt((3, 9, 5), 1500, 512)
    ia, ib = a.vocab_ids(1000, seed=1), b.vocab_ids(1000, seed=1)
    assert len(ia) == 1100 and len(ib) == 1500
    assert ia[:1024] == ib[:1024] and ia[1024:] != ib[1024:1100]
    assert min(ia + ib) >= 4 and max(ia + ib) < 1000
    assert a.vocab_ids(1000, seed=1) == ia and a.vocab_ids(1000, seed=2) != ia  # deterministic per seed
    # a partial block is the start of its hash id's stream
    assert HashedPrompt((3,), 100, 512).vocab_ids(1000, 1) == ia[:100]

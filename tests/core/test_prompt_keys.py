"""Chained block keys are computed once per distinct prompt, and per distinct prompt and output
(issue 30: a real run replays ~100 of each over 9,000 requests), and admission counts revived
blocks at C speed: the same keys, hits, evictions and block tables as keying every sequence's
blocks afresh and counting revived blocks one by one (the rules as they were, kept here as the
reference)."""

from __future__ import annotations

import pytest

from pagesim.core import PagedKVManager
from pagesim.core import paged
from pagesim.core.paged import block_hashes, block_spans, chain_keys
from pagesim.core.request import Request, SamplingParams, Sequence, SequenceGroup, SequenceStatus

from .test_prefix_registration import CASES, side_by_side


class HashEveryPrompt(PagedKVManager):
    """Each sequence's block keys hashed from its ids; revived hit blocks counted in a set."""

    def _key_chain(self, parent, token_ids, start, num_blocks, keep=True):
        return chain_keys(parent, block_spans(token_ids[start:], self.block_size, num_blocks), self.block_key)

    def can_admit(self, group, num_new_tokens):
        shared = self._siblings_share(group)
        need, revived = 0, set()
        for i, (seq, n) in enumerate(zip(group.seqs, num_new_tokens)):
            if i and shared:
                need += self._blocks_for(shared * self.block_size + n) - shared
                continue
            hits = self._cached_blocks(seq)
            need += self._blocks_for(len(hits) * self.block_size + n) - len(hits)
            revived.update(b for b in hits if self.device.refcount[b] == 0)
        return self.device.num_free - need - len(revived) >= self.watermark_blocks


@pytest.mark.parametrize("kept", [paged.KEY_CHAIN_TOKENS_KEPT, 40])  # (40 tokens: the cache is cleared often)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode,chunked,multi", CASES)
def test_shared_key_chains_match_keying_every_sequence(mode, chunked, multi, seed, kept, monkeypatch):
    monkeypatch.setattr(paged, "KEY_CHAIN_TOKENS_KEPT", kept)
    side_by_side(mode, chunked, multi, seed, reference_class=HashEveryPrompt)


def test_a_repeated_prompt_reuses_its_keys():
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    prompt = list(range(100, 111))  # 11 tokens: 2 full blocks keyed (the last token is always computed)
    first, second = Sequence(1, 11, prompt), Sequence(2, 11, list(prompt))
    other = Sequence(3, 11, prompt[:8] + [7, 7, 7])  # the same keyed blocks, another last block
    longer = Sequence(4, 13, prompt + [5, 6])  # one more full block
    keys = kv._hashes(first)
    assert keys == [hash((0, (100, 101, 102, 103))), hash((keys[0], (104, 105, 106, 107)))]
    assert kv._hashes(second) is keys and kv._hashes(other) is keys  # (equal lists, not the same object)
    assert kv._hashes(longer)[:2] == keys and len(kv._hashes(longer)) == 3
    changed = Sequence(5, 11, prompt[:7] + [9] + prompt[8:])  # the last keyed token differs
    assert kv._hashes(changed) == block_hashes(changed.token_ids, 4, 2) and kv._hashes(changed)[1] != keys[1]
    assert len(kv._key_chains) == 3


def test_the_key_cache_stays_bounded(monkeypatch):
    # each chain holds 8 tokens: 30 keep 3 chains
    monkeypatch.setattr(paged, "KEY_CHAIN_TOKENS_KEPT", 30)
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    for i in range(10):
        prompt = [i] * 9
        assert kv._hashes(Sequence(i, 9, prompt)) == block_hashes(prompt, 4, 2)
        assert 1 <= len(kv._key_chains) <= 3
        assert kv._key_chain_tokens == sum(len(tokens) for tokens, _ in kv._key_chains.values()) <= 30


def test_a_finished_sequence_caches_its_output_blocks_under_the_same_keys_again():
    # Two requests of one prompt and one output: their generated blocks are keyed by the
    # shared chain, equal to the keys computed from scratch.
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    prompt, output = [1, 2, 3, 4, 5, 6], [9] * 7  # 13 tokens: blocks 1 and 2 are past the keyed prompt block
    expected = block_hashes(prompt + output, 4, 3)
    tables = []
    for seq_id in (1, 2):
        seq = Sequence(seq_id, 6, prompt)
        group = SequenceGroup(Request(seq_id, 6, SamplingParams(max_tokens=7), prompt_token_ids=prompt), [seq], seq_id)
        kv.admit(group, [6 - kv.match_prefix(seq)])
        for token in output:
            seq.append_token(token)
        seq.num_computed_tokens = 12  # (the last token's K/V is never computed)
        kv.on_computed(seq)
        kv.allocate_slots(seq, 0)
        seq.status = SequenceStatus.FINISHED
        tables.append(list(seq.block_table))
        kv.free(seq)
        # the first request's blocks hold the keys (the second's found them held: they stay unregistered)
        assert [kv.device.block_hash[b] for b in tables[0][:3]] == expected
        assert [kv.device.cached[k] for k in expected] == tables[0][:3]
    # (the output's chain: found by its parent, 2 blocks, 8 tokens and its last block; the span compared)
    assert tables[1][0] == tables[0][0]
    assert kv._key_chains[(expected[0], 2, 8, *(prompt + output)[8:12])] == ((prompt + output)[4:12], expected[1:])


def test_chains_sharing_a_slot_are_told_apart_by_their_tokens():
    # the same parent, length and last block, another first block: a slot holds one chain at a time
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 0], [9, 9, 9, 9, 5, 6, 7, 8, 0]
    for seq_id, prompt in enumerate((a, b, a, b)):
        assert kv._hashes(Sequence(seq_id, 9, prompt)) == block_hashes(prompt, 4, 2)
    assert len(kv._key_chains) == 1 and kv._key_chain_tokens == 8


def test_a_conversations_next_turn_hashes_only_its_new_blocks():
    # each turn's prompt is the last one and more: its keys are block_hashes from scratch, and only
    # the blocks past the shared ones are hashed (a key function that counts its calls)
    hashed = []
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True,
                        block_key=lambda parent, tokens: hashed.append(tokens) or paged.fast_block_key(parent, tokens))
    turns = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
             [1, 2, 3, 4, 5, 6, 0, 0, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],  # (block 1 differs)
             [1, 2, 3, 4, 5, 6, 0, 0, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],  # (the same 4 blocks)
             [9, 2, 3, 4, 5, 6, 7, 8, 9]]  # (another first block)
    for seq_id, prompt in enumerate(turns):
        assert kv._hashes(Sequence(seq_id, len(prompt), prompt)) == block_hashes(prompt, 4, (len(prompt) - 1) // 4)
    # 2 blocks; 3, the first 2 shared (the first hashed to find them); 4, the first shared; a repeat; 2
    assert [len(t) for t in hashed] == [4] * (2 + 2 + 4 + 2) and hashed[2:4] == [(1, 2, 3, 4), (9, 10, 11, 12)]


@pytest.mark.parametrize("a,b,expected", [([], [1], 0), ([1, 2], [1, 2, 3], 1), ([1, 2, 3, 4], [1, 2, 3, 4], 2),
                                          ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 0, 7, 8, 9, 9], 2),
                                          ([0, 2], [1, 2, 3, 4], 0), ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 0], 3)])
def test_shared_blocks_against_a_block_by_block_walk(a, b, expected):
    walk = 0
    while (walk + 1) * 2 <= min(len(a), len(b)) and a[walk * 2:(walk + 1) * 2] == b[walk * 2:(walk + 1) * 2]:
        walk += 1
    assert paged.shared_blocks(a, b, 2) == walk == expected

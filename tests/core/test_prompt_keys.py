"""Chained block keys are computed once per submitted prompt, and per prompt and output (issue 30:
a replay cycling its trace submits each prompt ~3 times), and admission counts revived blocks at
C speed: the same keys, hits, evictions and block tables as keying every sequence's blocks
afresh by hand and counting revived blocks one by one (the rules as they were, kept here as the
reference)."""

from __future__ import annotations

import pytest

from pagesim.core import PagedKVManager
from pagesim.core import kept_keys, paged
from pagesim.core.paged import block_hashes
from pagesim.core.request import Request, SamplingParams, Sequence, SequenceGroup, SequenceStatus

from .test_prefix_registration import CASES, side_by_side


def keys_by_hand(key, parent, ids: list[int], block_size: int, num_blocks: int) -> list:
    keys = []
    for i in range(num_blocks):
        parent = key(parent, tuple(ids[i * block_size:(i + 1) * block_size]))
        keys.append(parent)
    return keys


class HashEveryPrompt(PagedKVManager):
    """Each sequence's block keys hashed by hand from its ids; revived hit blocks counted in a set."""

    def _prompt_keys(self, seq, num_blocks):
        return keys_by_hand(self.block_key, 0, seq.token_ids, self.block_size, num_blocks)

    def _tail_keys(self, seq, parent, start, num_blocks):
        return keys_by_hand(self.block_key, parent, seq.token_ids[start:], self.block_size, num_blocks)

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


@pytest.mark.parametrize("kept", [kept_keys.KEPT_BYTES, 400])  # (400 bytes: what is kept is dropped often)
@pytest.mark.parametrize("distinct", [None, 30])  # (30: the prompts are submitted again and again)
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode,chunked,multi", CASES)
def test_kept_keys_match_keying_every_sequence(mode, chunked, multi, seed, distinct, kept, monkeypatch):
    monkeypatch.setattr(kept_keys, "KEPT_BYTES", kept)
    side_by_side(mode, chunked, multi, seed, reference_class=HashEveryPrompt, distinct=distinct)


def test_a_resubmitted_prompt_reuses_its_keys():
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    prompt = list(range(100, 111))  # 11 tokens: 2 full blocks keyed (the last token is always computed)
    first, again = Sequence(1, 11, prompt), Sequence(2, 11, prompt)
    copy = Sequence(3, 11, list(prompt))  # equal ids, another list: keyed again, from the kept head
    keys = kv._hashes(first)
    assert keys == [hash((0, (100, 101, 102, 103))), hash((keys[0], (104, 105, 106, 107)))]
    assert kv._hashes(again) is keys
    assert kv._hashes(copy) == keys and kv._hashes(copy) is not keys
    changed = Sequence(5, 11, prompt[:7] + [9] + prompt[8:])  # the last keyed token differs
    assert kv._hashes(changed) == block_hashes(changed.token_ids, 4, 2) and kv._hashes(changed)[1] != keys[1]


def test_what_is_kept_stays_bounded(monkeypatch):
    # each prompt keeps 2 keys and holds its 9 tokens alive (80 + 324 bytes): 1,000 bytes keep 2 prompts
    monkeypatch.setattr(kept_keys, "KEPT_BYTES", 1000)
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    for i in range(10):
        prompt = [i] * 9
        assert kv._hashes(Sequence(i, 9, prompt)) == block_hashes(prompt, 4, 2)
        kept = kv._kept_keys
        assert 1 <= len(kept._prompts) <= 2 and len(kept._heads) == len(kept._prompts)
        assert kept._bytes == sum(40 * len(p.keys) + 36 * len(p.ids) for p in kept._prompts.values()) <= 1000


def finish(kv: PagedKVManager, seq_id: int, prompt: list[int], output: list[int]) -> list[int]:
    """Admit a request of prompt, compute output on it and free it finished; its block table."""
    seq = Sequence(seq_id, len(prompt), prompt)
    group = SequenceGroup(Request(seq_id, len(prompt), SamplingParams(max_tokens=len(output)), prompt_token_ids=prompt),
                          [seq], seq_id)
    kv.admit(group, [len(prompt) - kv.match_prefix(seq)])
    for token in output:
        seq.append_token(token)
    seq.num_computed_tokens = seq.num_tokens - 1  # (the last token's K/V is never computed)
    kv.on_computed(seq)
    kv.allocate_slots(seq, 0)
    seq.status = SequenceStatus.FINISHED
    table = list(seq.block_table)
    kv.free(seq)
    return table


def test_a_finished_sequence_caches_its_output_blocks_under_the_same_keys_again():
    # Two requests of one prompt and one output: their generated blocks are keyed as from scratch,
    # the second time from what the first kept.
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True)
    prompt, output = [1, 2, 3, 4, 5, 6], [9] * 7  # 13 tokens: blocks 1 and 2 are past the keyed prompt block
    expected = keys_by_hand(paged.fast_block_key, 0, prompt + output, 4, 3)
    tables = [finish(kv, 1, prompt, output)]
    kept = kv._kept_keys._prompts[id(prompt)]
    assert kept.tail_keys == expected[1:] and kept.tail_tokens == tuple((prompt + output)[4:12])
    tables.append(finish(kv, 2, prompt, output))
    # the first request's blocks hold the keys (the second's found them held: they stay unregistered)
    assert [kv.device.block_hash[b] for b in tables[0][:3]] == expected
    assert [kv.device.cached[k] for k in expected] == tables[0][:3]
    assert tables[1][0] == tables[0][0]
    # another output after the same prompt: keyed afresh, and kept instead
    other = [8] * 7
    finish(kv, 3, prompt, other)
    assert kept.tail_keys == keys_by_hand(paged.fast_block_key, 0, prompt + other, 4, 3)[1:]


def test_a_conversations_next_turn_hashes_only_its_new_blocks():
    # each turn's prompt is the last one and more: its keys are the chain by hand, and only the
    # blocks past the shared ones are hashed, and the first (to find them) (a key function that
    # counts its calls)
    hashed = []
    kv = PagedKVManager(64, block_size=4, enable_prefix_caching=True,
                        block_key=lambda parent, tokens: hashed.append(tokens) or paged.fast_block_key(parent, tokens))
    turns = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
             [1, 2, 3, 4, 5, 6, 0, 0, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18],  # (block 1 differs)
             [1, 2, 3, 4, 5, 6, 0, 0, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],  # (the same 4 blocks)
             [9, 2, 3, 4, 5, 6, 7, 8, 9]]  # (another first block)
    for seq_id, prompt in enumerate(turns):
        expected = keys_by_hand(paged.fast_block_key, 0, prompt, 4, (len(prompt) - 1) // 4)
        assert kv._hashes(Sequence(seq_id, len(prompt), prompt)) == expected
    # 2 blocks; 3, the first 2 shared; 4, the first shared; 4, all shared; 2
    assert [len(t) for t in hashed] == [4] * (2 + 2 + 4 + 1 + 2) and hashed[2:4] == [(1, 2, 3, 4), (9, 10, 11, 12)]
    assert hashed[8] == (1, 2, 3, 4)
    # a turn submitted again (the same list) hashes nothing
    kv._hashes(Sequence(9, len(turns[3]), turns[3]))
    assert len(hashed) == 11


@pytest.mark.parametrize("a,b,limit,expected", [([], [1], None, 0), ([1, 2], [1, 2, 3], None, 1),
                                                ([1, 2, 3, 4], [1, 2, 3, 4], None, 2), ([1, 2, 3, 4], [1, 2, 3, 4], 1, 1),
                                                ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 0, 7, 8, 9, 9], None, 2),
                                                ([0, 2], [1, 2, 3, 4], None, 0),
                                                ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 0], None, 3),
                                                ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 0], 2, 2)])
def test_shared_blocks_against_a_block_by_block_walk(a, b, limit, expected):
    walk = 0
    while (walk + 1) * 2 <= min(len(a), len(b)) and a[walk * 2:(walk + 1) * 2] == b[walk * 2:(walk + 1) * 2] \
            and (limit is None or walk < limit):
        walk += 1
    assert paged.shared_blocks(a, b, 2, limit) == walk == expected

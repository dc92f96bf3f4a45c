"""KV cache groups (pagesim.core.kv_groups, pagesim.core.hybrid_kv): the layout against vLLM's
published examples and hand arithmetic, sliding-window freeing at its exact boundaries, and whole
scheduler runs of hybrid models through the fake engine (tests/core/driver.py), whose simulated
memory proves every layer group reads back exactly the tokens its window needs."""

from __future__ import annotations

import random

import pytest

from pagesim.core import (
    NULL_BLOCK, HybridKVManager, KVGroupSpec, KVLayout, PagedKVManager, PoolConfig, Request, SamplingParams,
    SequenceGroup, Sequence, make_kv_manager,
)
from .driver import FakeEngine, make_scheduler, random_requests

FULL = KVGroupSpec("full", 2)
SLIDING = KVGroupSpec("sliding", 2, 6)


# -- layout -------------------------------------------------------------------------------------
# vLLM's design note docs/design/hybrid_kv_cache_manager.md (commit 458e74): its worked examples.

def test_layout_of_vllm_example_10_full_20_sliding():
    # "block_size 16, sliding window size 32, request length 112 ... we need to allocate 11
    # blocks (0-6 for full, 7-8 for sw group 1, 9-10 for sw group 2)"
    layout = KVLayout.of([KVGroupSpec("sliding", 20, 32), KVGroupSpec("full", 10)])
    assert layout.layers_per_block == 10 and layout.num_tables == 3 and layout.padding_layers == 0
    assert [t.kind for t in layout.tables] == ["full", "sliding", "sliding"]  # full first
    assert layout.blocks_per_sequence(112, 16) == 11
    assert layout.blocks_by_kind(112, 16) == {"full": 7, "sliding:32": 4}


def test_layout_of_gemma3_27b_pads_the_last_sliding_table():
    # the note's Gemma-3-27b: 52 sliding + 10 full layers, groups of 10, the last with 8 padding layers
    layout = KVLayout.of([KVGroupSpec("sliding", 52, 1024), KVGroupSpec("full", 10)])
    assert layout.layers_per_block == 10 and layout.num_tables == 7 and layout.padding_layers == 8
    assert [t.num_layers for t in layout.tables] == [10, 10, 10, 10, 10, 10, 2]
    assert [t.first_layer for t in layout.tables[1:]] == [0, 10, 20, 30, 40, 50]


def test_layout_of_nearly_balanced_kinds_uses_the_larger_count():
    # vLLM's kv_cache_utils comment: gpt-oss-20b + eagle, 12 sw + 13 full, padded to (13 sw, 13 full)
    layout = KVLayout.of([KVGroupSpec("sliding", 12, 128), KVGroupSpec("full", 13)])
    assert (layout.layers_per_block, layout.num_tables, layout.padding_layers) == (13, 2, 1)


def test_one_kind_is_one_table_of_every_layer_and_sizes_as_today():
    # DeepSeek-V3: 61 MLA layers, (512 + 64) latent x 2 bytes = 1152 B per token per layer
    layout = KVLayout.of([KVGroupSpec("mla", 61)])
    assert layout.is_plain and layout.layers_per_block == 61
    assert layout.block_bytes(16, 1152) == 16 * 70_272  # the 70,272 B per token, 16 tokens
    assert layout.num_blocks(10 * 16 * 70_272 + 5, 16, 1152) == 10
    assert KVLayout.of([KVGroupSpec("full", 4), KVGroupSpec("full", 4)]).specs == (KVGroupSpec("full", 8),)


def test_sequences_that_fit_count_the_window():
    layout = KVLayout.of([KVGroupSpec("sliding", 8, 64), KVGroupSpec("full", 8)])
    # 1000 tokens, blocks of 16: full 63 blocks; sliding keeps [1000 - 63, 1000): blocks 58..62 = 5
    assert layout.blocks_by_kind(1000, 16) == {"full": 63, "sliding:64": 5}
    assert layout.sequences_that_fit(680, 1000, 16) == 10


def test_plain_manager_refuses_groups_it_cannot_serve():
    with pytest.raises(ValueError, match="HybridKVManager"):
        PagedKVManager(16, 4, kv_groups=(FULL, SLIDING))
    assert type(make_kv_manager("paged", PoolConfig(16, 0, 4, kv_groups=(KVGroupSpec("mla", 3),)), 64)) is PagedKVManager
    assert type(make_kv_manager("paged", PoolConfig(16, 0, 4, kv_groups=(SLIDING,)), 64)) is HybridKVManager
    with pytest.raises(ValueError, match="paged blocks"):
        make_kv_manager("orca-max", PoolConfig(16, 0, 4, kv_groups=(FULL, SLIDING)), 64)


# -- sliding-window freeing at its boundaries ------------------------------------------------------

def _admit(kv, rid, tokens, n=None):
    seq = Sequence(rid, len(tokens), tokens)
    group = SequenceGroup(Request(rid, len(tokens), SamplingParams(max_tokens=64), prompt_token_ids=tokens), [seq], rid)
    n = len(tokens) - kv.match_prefix(seq) if n is None else n
    assert kv.can_admit(group, [n])
    kv.admit(group, [n])
    seq.num_computed_tokens += n
    kv.on_computed(seq)
    return seq


def _decode(kv, seq, token=0):
    seq.append_token(token)
    kv.allocate_slots(seq, 1)
    seq.num_computed_tokens += 1
    kv.on_computed(seq)


def test_sliding_window_frees_a_block_exactly_when_the_next_token_no_longer_reads_it():
    # window 8, blocks of 4: the token at position p reads p - 7 .. p, so block 0 (positions 0-3)
    # is needed by the token at 10 (reads 3..10) and free from the token at 11 on (reads 4..11)
    kv = HybridKVManager(16, 4, kv_groups=(KVGroupSpec("sliding", 3, 8),), watermark=0.0)
    seq = _admit(kv, 0, list(range(10)))  # 10 computed: the next token is at position 10
    assert seq.block_table[0] != NULL_BLOCK and kv.num_free_blocks == 13
    _decode(kv, seq)  # 11 computed
    assert seq.block_table[0] == NULL_BLOCK and kv.num_free_blocks == 14
    _decode(kv, seq)  # 12 computed: a new block opens at 12 (3 blocks, one freed)
    assert kv.num_free_blocks == 14 and len(seq.block_table) == 3
    for expected_nulls, computed in ((1, 13), (1, 14), (2, 15)):  # block 1 (4-7) goes when 15 reads 8..15
        _decode(kv, seq)
        assert seq.num_computed_tokens == computed
        assert seq.block_table[:expected_nulls] == [NULL_BLOCK] * expected_nulls
        assert NULL_BLOCK not in seq.block_table[expected_nulls:]
    # at most ceil((W - 1) / B) + 1 = 3 blocks held while decoding, however long it grows
    for _ in range(40):
        _decode(kv, seq)
        assert sum(b != NULL_BLOCK for b in seq.block_table) <= 3
    kv.free(seq)
    assert kv.num_free_blocks == 16 and not any(kv.device.refcount)


def test_a_long_prefill_holds_its_whole_chunk_then_frees_what_left_the_window():
    kv = HybridKVManager(32, 4, kv_groups=(FULL, KVGroupSpec("sliding", 2, 5)), watermark=0.0)
    seq = Sequence(0, 40, list(range(40)))
    group = SequenceGroup(Request(0, 40, SamplingParams(), prompt_token_ids=list(range(40))), [seq], 0)
    assert kv.can_admit(group, [40]) and kv.blocks_needed  # 10 blocks in each of the 2 tables
    kv.admit(group, [40])
    assert kv.num_free_blocks == 32 - 20
    seq.num_computed_tokens = 40
    kv.on_computed(seq)  # the token at 40 reads 36..40: sliding keeps block 9 only
    full, sliding = kv.block_tables(seq)
    assert NULL_BLOCK not in full and sliding[:9] == [NULL_BLOCK] * 9 and sliding[9] >= 0
    assert kv.num_free_blocks == 32 - 11


def test_sliding_prefix_hit_needs_only_the_window_blocks():
    # window 5, blocks of 4: a hit of k blocks needs blocks k-1 (ceil(4 / 4) = 1) cached in the
    # sliding table and all k in the full table
    kv = HybridKVManager(40, 4, kv_groups=(FULL, KVGroupSpec("sliding", 2, 5)), enable_prefix_caching=True,
                         watermark=0.0)
    prompt = list(range(21))  # 5 full prompt blocks are cacheable
    first = _admit(kv, 0, prompt)
    full, sliding = kv.block_tables(first)
    kept_sliding = sliding[4]
    kv.free(first)
    # every block is cached and free; a new request with the same prompt hits all 5 blocks
    again = Sequence(1, 21, prompt)
    assert kv.match_prefix(again) == 20
    # now evict the sliding table's block 2 (not in the window of a 5-block hit): still a full hit
    key = (1, kv._hashes(again)[2])
    block = kv.device.cached.pop(key)
    kv.device.block_hash[block] = None
    assert kv.match_prefix(again) == 20
    # evict the sliding table's block 4: the hit falls back to 4 blocks? block 3 is cached, so
    # the longest prefix whose window block is cached is 4 blocks (needs block 3)
    block = kv.device.cached.pop((1, kv._hashes(again)[4]))
    assert block == kept_sliding
    kv.device.block_hash[block] = None
    assert kv.match_prefix(again) == 16
    group = SequenceGroup(Request(1, 21, SamplingParams(), prompt_token_ids=prompt), [again], 1)
    kv.admit(group, [5])
    full, sliding = kv.block_tables(again)
    assert sliding[:3] == [NULL_BLOCK] * 3 and sliding[3] >= 0 and NULL_BLOCK not in full
    assert kv.prefix_hits == 4


# -- whole runs through the scheduler ---------------------------------------------------------------

LAYOUTS = {
    "sliding-only": (KVGroupSpec("sliding", 3, 30),),
    "full+sliding": (KVGroupSpec("full", 2), KVGroupSpec("sliding", 4, 6)),
    "full+2-windows": (KVGroupSpec("full", 1), KVGroupSpec("sliding", 1, 5), KVGroupSpec("sliding", 2, 13)),
    "mla": (KVGroupSpec("mla", 3),),
}


# (swap with chunked prefill is left out: on main too, a group swapped out in the middle of its
# prefill and swapped back in while nothing else runs gives a step with nothing to compute, which
# the driver, like the simulator, calls a stall; reported to the scheduler's owner)
RUN_MODES = [("recompute", False), ("recompute", True), ("swap", False), ("auto", False), ("auto", True)]


@pytest.mark.parametrize("mode,chunked", RUN_MODES)
@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_driver_hybrid(layout, caching, chunked, mode):
    groups = LAYOUTS[layout]
    sched = make_scheduler("paged", mode, chunked, num_blocks=28 * KVLayout.of(groups).num_tables, caching=caching,
                           kv_groups=groups)
    rng = random.Random(f"{layout}-{caching}-{chunked}-{mode}")
    eng = FakeEngine(sched)
    reqs = random_requests(rng, 150, multi=0.2, prefixes=3 if caching else 0, oversize=0.03,
                           max_model_len=sched.config.max_model_len)
    eng.run(reqs, rng)
    eng.check_finished()
    eng.check_pool_empty()
    assert any(g.reject_reason for g in eng.groups)
    assert sched.num_preemptions > 0, "the pool is meant to be small enough to force preemption"
    if caching:
        assert sched.kv.prefix_hits > 0


def test_never_fits_counts_a_window_by_the_largest_step():
    # full + sliding (W = 5), blocks of 4; a 40-token prompt with 10 outputs computes at most 49
    # tokens: the full table needs ceil(49 / 4) = 13 blocks; the sliding table as many when the
    # step may be a whole recompute, but only ceil((5 - 1 + 8) / 4) + 1 = 4 with chunks of 8
    from pagesim.core import Scheduler, SchedulerConfig
    groups = (KVGroupSpec("full", 1), KVGroupSpec("sliding", 1, 5))
    request = Request(0, 40, SamplingParams(max_tokens=10), prompt_token_ids=list(range(40)))
    for chunked, need in ((False, 26), (True, 17)):
        for blocks, fits in ((need, True), (need - 1, False)):
            kv = HybridKVManager(blocks, 4, kv_groups=groups, watermark=0.0)
            Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8 if chunked else 64, max_model_len=64,
                                      chunked_prefill=chunked), kv)
            group = SequenceGroup(request, [Sequence(0, 40, list(range(40)))], 0)
            reason = kv.never_fits(group, 64)
            assert (reason is None) == fits, (chunked, blocks, reason)


def test_one_mla_group_is_the_plain_manager_step_for_step():
    # the same workload with no groups and with one MLA group: identical tables, pools and outputs
    engines = []
    for groups in (None, (KVGroupSpec("mla", 61),)):
        sched = make_scheduler("paged", "auto", True, num_blocks=40, caching=True, kv_groups=groups)
        engines.append(FakeEngine(sched))
    reqs = [random_requests(random.Random(5), 120, multi=0.2, prefixes=3) for _ in engines]
    rng = random.Random(6)
    while reqs[0] or engines[0].sched.has_unfinished:
        k = min(rng.randint(0, 2), len(reqs[0]))
        for eng, pending in zip(engines, reqs):
            for _ in range(k):
                eng.add(pending.pop(0))
            eng.step()
        a, b = (e.sched.kv for e in engines)
        assert [(s.seq_id, s.block_table) for g in engines[0].sched.running for s in g.seqs] == \
               [(s.seq_id, s.block_table) for g in engines[1].sched.running for s in g.seqs]
        assert list(a.device.free_queue) == list(b.device.free_queue) and a.device.cached == b.device.cached
    assert engines[1].sched.kv.layout.layers_per_block == 61 and engines[0].sched.kv.prefix_hits > 0

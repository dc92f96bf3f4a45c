"""State KV groups (kind "state": linear attention / Mamba layers, a constant-size state per
sequence, vLLM v1's MambaSpec with mamba_cache_mode "none"): the layout's block counts by hand
over a sequence's life, admission refusing when the state blocks do not fit, frees at finish,
copy-on-write of a forked state, and whole scheduler runs (preemption by recompute and swap)
through the fake engine, whose shadow memory checks that each state block holds the state of
exactly its sequence's computed prefix (tests/core/driver.py)."""

from __future__ import annotations

import random

import pytest

from pagesim.core import HybridKVManager, KVGroupSpec, KVLayout, Request, SamplingParams, Sequence, SequenceGroup

from .driver import FakeEngine, make_scheduler, random_requests
from .test_kv_groups import _admit, _decode

# Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (12), the other 36 Gated DeltaNet
QWEN3_NEXT = (KVGroupSpec("state", 36), KVGroupSpec("full", 12))


def test_qwen3_next_layout_is_one_full_table_and_three_state_tables():
    # vLLM groups 12 layers a table (the fewest of any kind): 12 full, 36 state = 1 + 3 tables
    layout = KVLayout.of(QWEN3_NEXT)
    assert layout.layers_per_block == 12 and layout.padding_layers == 0
    assert [t.kind for t in layout.tables] == ["full", "state", "state", "state"]
    assert layout.num_tables == 4 and layout.num_token_tables == 1
    # 1000 tokens at 16 a block: ceil(1000 / 16) = 63 full blocks + 1 state block per state table
    assert layout.blocks_per_sequence(1000, 16) == 66
    assert layout.blocks_by_kind(1000, 16) == {"full": 63, "state": 3}
    assert layout.blocks_per_sequence(1, 16) == 4  # the state is held from the first token on
    assert layout.sequences_that_fit(660, 1000, 16) == 10


def test_a_layout_of_state_layers_alone_is_refused():
    with pytest.raises(ValueError, match="attention layers"):
        KVLayout.of((KVGroupSpec("state", 4),))


def test_state_block_taken_at_admission_never_grows_and_is_freed_at_finish():
    # full 2 + state 2 layers: one full and one state table, blocks of 4, 20 blocks
    kv = HybridKVManager(20, 4, kv_groups=(KVGroupSpec("full", 2), KVGroupSpec("state", 2)), watermark=0.0)
    seq = _admit(kv, 0, list(range(10)))  # ceil(10 / 4) = 3 full blocks + 1 state block
    full, state = kv.block_tables(seq)
    assert len(full) == 3 and len(state) == 1 and kv.num_free_blocks == 16
    first_state = state[0]
    assert kv.blocks_needed(seq, 1) == 0  # the 11th and 12th tokens fit in the third block
    _decode(kv, seq)
    _decode(kv, seq)  # 12 computed
    assert kv.num_free_blocks == 16 and kv.blocks_needed(seq, 1) == 1  # a new full block only
    for _ in range(9):  # 21 computed: ceil(21 / 4) = 6 full blocks, still one state block
        _decode(kv, seq)
    full, state = kv.block_tables(seq)
    assert len(full) == 6 and state == [first_state] and kv.num_free_blocks == 20 - 7
    kv.free(seq)
    assert kv.num_free_blocks == 20 and not any(kv.device.refcount)


def test_admission_refuses_when_the_state_blocks_do_not_fit():
    # a 16-token prompt at 4 a block needs 4 full blocks; with 3 state tables 4 + 3 = 7
    groups = (KVGroupSpec("full", 1), KVGroupSpec("state", 3))
    assert KVLayout.of(groups).num_tables == 4

    def group(rid):
        seq = Sequence(rid, 16, list(range(16)))
        return SequenceGroup(Request(rid, 16, SamplingParams(), prompt_token_ids=list(range(16))), [seq], rid)
    assert HybridKVManager(7, 4, kv_groups=groups, watermark=0.0).can_admit(group(0), [16])
    kv = HybridKVManager(6, 4, kv_groups=groups, watermark=0.0)
    assert not kv.can_admit(group(0), [16])  # the tokens' 4 blocks fit, the 3 states do not
    assert kv.never_fits(group(0), 128) is not None
    # n = 2 samples: each its own state, the prompt's full blocks shared only on re-admission
    kv = HybridKVManager(40, 4, kv_groups=groups, watermark=0.0)
    seqs = [Sequence(10 + i, 16, list(range(16))) for i in range(2)]
    g = SequenceGroup(Request(1, 16, SamplingParams(n=2), prompt_token_ids=list(range(16))), seqs, 1)
    assert kv.blocks_needed  # (two sequences admitted together: 2 x (4 + 3) blocks, none shared)
    kv.admit(g, [16, 16])
    assert kv.num_free_blocks == 40 - 14


def test_a_forked_state_is_copied_at_the_childs_next_step():
    kv = HybridKVManager(20, 4, kv_groups=(KVGroupSpec("full", 1), KVGroupSpec("state", 1)), watermark=0.0)
    parent = _admit(kv, 0, list(range(6)))  # 2 full blocks + 1 state
    child = Sequence(1, 6, list(range(6)))
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)
    assert kv.block_tables(child) == kv.block_tables(parent) and kv.num_free_blocks == 17
    # the child's next token: its partly filled full block and its state are both shared
    assert kv.blocks_needed(child, 1) == 2
    _decode(kv, child)
    (pf, ps), (cf, cs) = kv.block_tables(parent), kv.block_tables(child)
    assert cs != ps and cf[-1] != pf[-1] and kv.num_free_blocks == 15
    assert (ps[0], cs[0]) in kv.pending_copies
    assert kv.blocks_needed(parent, 1) == 0  # the parent's own blocks are no longer shared


def test_prefix_caching_is_refused_with_state_layers():
    with pytest.raises(ValueError, match="prefix caching is not modelled"):
        HybridKVManager(20, 4, enable_prefix_caching=True, kv_groups=QWEN3_NEXT)


LAYOUTS = {
    "full+state": (KVGroupSpec("full", 1), KVGroupSpec("state", 3)),
    "full+sliding+state": (KVGroupSpec("full", 2), KVGroupSpec("sliding", 2, 5), KVGroupSpec("state", 2)),
}
RUN_MODES = [("recompute", False), ("recompute", True), ("swap", False), ("auto", False), ("auto", True)]


@pytest.mark.parametrize("mode,chunked", RUN_MODES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_driver_state_groups(layout, mode, chunked):
    groups = LAYOUTS[layout]
    sched = make_scheduler("paged", mode, chunked, num_blocks=28 * KVLayout.of(groups).num_token_tables + 24,
                           kv_groups=groups)
    rng = random.Random(f"{layout}-{chunked}-{mode}")
    eng = FakeEngine(sched)
    reqs = random_requests(rng, 150, multi=0.2, prefixes=0, oversize=0.03, max_model_len=sched.config.max_model_len)
    eng.run(reqs, rng)
    eng.check_finished()
    eng.check_pool_empty()
    assert sched.num_preemptions > 0, "the pool is meant to be small enough to force preemption"

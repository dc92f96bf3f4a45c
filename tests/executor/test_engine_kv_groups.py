"""The engine on the core's hybrid KV manager (issue 24: blocks outside the window are never
read, and freed): Mistral (every layer a window of 8), Gemma 2 (a windowed and a full layer, the
core's tables in the other order than the model's groups) and a six-layer Qwen3 (one full and
two sliding tables of two layers) generate through LLMEngine with transformers' greedy tokens and
logits, while each sequence's sliding tables hold at most ceil((W - 1) / B) + 1 blocks, the full
table grows with the sequence, and every block is back in the pool at the end."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from executor.engine import EngineConfig, LLMEngine  # noqa: E402
from executor.kv_layout import place_layers  # noqa: E402
from pagesim.core import SamplingParams  # noqa: E402
from pagesim.core.hybrid_kv import HybridKVManager  # noqa: E402
from pagesim.core.kv_groups import NULL_BLOCK, KVGroupSpec  # noqa: E402
from tests.executor.test_models import hf_logits, prompt  # noqa: E402
from tests.executor.test_modern_models import BS, build_pair  # noqa: E402


def test_layers_are_placed_in_the_cores_tables():
    """Hand-worked: 4 full and 2 sliding layers make tables of 2 layers (4 >= 1.25 x 2): full
    layers 0, 1, 3, 5 fill tables 0 and 1 in turn, sliding layers 2 and 4 table 2."""
    groups = [KVGroupSpec("full", 4), KVGroupSpec("sliding", 2, 8)]
    placed = place_layers(groups, [0, 0, 1, 0, 1, 0])
    assert placed.layout.layers_per_block == 2 and placed.layout.num_tables == 3
    assert placed.table == (0, 0, 2, 1, 2, 1)
    assert placed.slot == (0, 1, 0, 0, 1, 1)
    # Gemma 2's groups list the window first; the core puts full tables first
    gemma = place_layers([KVGroupSpec("sliding", 1, 8), KVGroupSpec("full", 1)], [0, 1])
    assert gemma.table == (1, 0) and gemma.slot == (0, 0)
    plain = place_layers([KVGroupSpec("full", 3)], [0, 0, 0])
    assert plain.is_plain and plain.slot == (0, 1, 2)


# variant -> (layer tensors the cache keeps, core tables): tables share tensors
LAYOUTS = {"mistral-tiny": (2, 1), "gemma2-tiny": (1, 2), "qwen3-six-layers": (2, 3)}


@pytest.mark.parametrize("variant", list(LAYOUTS))
def test_engine_on_hybrid_kv_equals_hf_and_frees_behind_the_window(variant):
    hf, lm, _ = build_pair(variant)
    engine = LLMEngine(lm, EngineConfig(block_size=BS, num_gpu_blocks=64, max_num_seqs=4))
    kv = engine.scheduler.kv
    assert isinstance(kv, HybridKVManager)
    tensors, num_tables = LAYOUTS[variant]
    assert len(engine.cache.key_caches) == tensors and kv.num_tables == num_tables
    tables = kv.layout.tables
    sliding = [t for t, g in enumerate(tables) if g.sliding_window is not None]
    full = [t for t, g in enumerate(tables) if g.sliding_window is None]
    window = tables[sliding[0]].sliding_window
    bound = math.ceil((window - 1) / BS) + 1  # = 3 for a window of 8 in blocks of 4

    logits_of: dict[int, list[torch.Tensor]] = {}  # seq_id -> the logits of each token it sampled
    sample = engine._sample

    def recording_sample(out, logits):
        row = 0
        for _, due in out.due_by_group():  # rows follow the due sequences in batch order
            for seq in due:
                logits_of.setdefault(seq.seq_id, []).append(logits[row].clone())
                row += 1
        return sample(out, logits)

    engine._sample = recording_sample
    free_at_start = kv.device.num_free
    prompts = [prompt(n, seed=300 + n) for n in (5, 13, 9)]
    groups = [engine.add_request(p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)) for p in prompts]
    most_full, freed_seen, now = 0, False, 0.0
    while engine.has_unfinished():
        engine.step(now)
        now += 1.0
        for group in engine.scheduler.running:
            for seq in group.seqs:
                held = kv.block_tables(seq)
                for t in sliding:
                    assert sum(b != NULL_BLOCK for b in held[t]) <= bound
                    freed_seen |= NULL_BLOCK in held[t]
                for t in full:
                    assert NULL_BLOCK not in held[t] and len(held[t]) * BS >= seq.num_computed_tokens
                    most_full = max(most_full, len(held[t]))
    assert freed_seen
    if full:  # the full table kept every block of the longest sequence: ceil((13 + 29) / 4)
        assert most_full >= math.ceil((13 + 29) / BS)
    assert kv.device.num_free == free_at_start
    for p, group in zip(prompts, groups):
        seq = group.finished_seqs[0]
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=30, do_sample=False)[0, len(p):].tolist()
        assert seq.output_token_ids == want
        # the logits of every sampled token: those transformers gives at the token before it
        theirs = hf_logits(hf, p + want)[len(p) - 1:-1]
        torch.testing.assert_close(torch.stack(logits_of[seq.seq_id]), theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ["mistral-tiny", "gemma2-tiny"])
def test_prefix_hits_on_hybrid_kv_equal_hf(variant):
    """Prefix caching per table: a second request sharing a 20-token prefix with a finished one
    starts from cached blocks (its sliding tables NULL before the window) and still gives
    transformers' greedy tokens."""
    hf, lm, _ = build_pair(variant)
    engine = LLMEngine(lm, EngineConfig(block_size=BS, num_gpu_blocks=64, max_num_seqs=4, prefix_caching=True))
    shared = prompt(20, seed=7)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    first, second = shared + prompt(3, seed=8), shared + prompt(5, seed=9)
    (out_first,) = engine.generate([first], params)
    hits_before = engine.scheduler.kv.prefix_hits
    (out_second,) = engine.generate([second], params)
    assert engine.scheduler.kv.prefix_hits - hits_before == 20 // BS
    for p, result in ((first, out_first), (second, out_second)):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p):].tolist()
        assert result.outputs[0] == want

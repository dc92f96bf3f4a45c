"""KV cache groups in the executor (the executor's half of vLLM v1's hybrid KV cache manager):
a model whose layers differ (full attention and a sliding window) names its groups, and runs on
one block table per group over one pool, the sliding group's out-of-window blocks freed
(NULL_BLOCK, poisoned) as sequences grow, equal to transformers at every step."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from executor.attention import AttentionMetadata  # noqa: E402
from executor.kernels.reference import NULL_BLOCK  # noqa: E402
from executor.models import loader  # noqa: E402
from pagesim.core.kv_groups import KVGroupSpec  # noqa: E402
from tests.executor.test_modern_models import BS, build_pair, new_cache  # noqa: E402
from tests.executor.test_models import Blocks, hf_logits, prompt  # noqa: E402


def test_groups_follow_the_layers():
    assert loader.load_model("random:qwen3-tiny").kv_groups == [KVGroupSpec("full", 1), KVGroupSpec("sliding", 1, 8)]
    assert loader.load_model("random:mistral-tiny").kv_groups == [KVGroupSpec("sliding", 2, 8)]
    assert loader.load_model("random:deepseek-v2-tiny").kv_groups == [KVGroupSpec("mla", 2)]
    assert loader.load_model("random:gemma2-tiny").kv_groups == [KVGroupSpec("sliding", 1, 8), KVGroupSpec("full", 1)]
    lm = loader.load_model("random:qwen3-tiny")
    assert lm.layer_groups == [0, 1]
    assert [layer.self_attn.attn.kv_group for layer in lm.model.model.layers] == [0, 1]


def run_grouped(lm, cache, batch):
    """batch: (tables per group, num_computed, new token ids) -> logits of every new row, metadata."""
    md = AttentionMetadata.build_grouped([(tables, done, len(toks)) for tables, done, toks in batch], BS)
    ids = torch.tensor([t for _, _, toks in batch for t in toks], dtype=torch.int64)
    with torch.no_grad():
        return lm.model.compute_logits(lm.model(ids, md.positions, cache.kv_caches, md)), md


@pytest.mark.parametrize("variant", ["qwen3-tiny", "gemma2-capped"])
def test_interleaved_windows_on_per_group_tables_with_freed_blocks(variant):
    """A full and a windowed layer (Qwen3: layer 1 a window of 8; Gemma 2: layer 0): each sequence
    has a full table and a sliding table from the same pool; the sliding table's blocks that
    leave the window are freed (NaN in every layer's tensor, NULL_BLOCK in the table) while three
    sequences decode."""
    hf, lm, _ = build_pair(variant)
    kinds = [g.kind for g in lm.kv_groups]
    assert sorted(kinds) == ["full", "sliding"]
    full, sliding = kinds.index("full"), kinds.index("sliding")
    assert lm.kv_groups[sliding].sliding_window == 8
    blocks, cache = Blocks(128), new_cache(lm, num_blocks=128)
    seqs = [{"tokens": prompt(n, seed=n), "done": 0, "tables": ([], [])} for n in (5, 12, 9)]
    freed = 0
    for step in range(10):
        batch = [(tuple(blocks.grow(t, len(s["tokens"]), BS) for t in s["tables"]), s["done"], s["tokens"][s["done"]:])
                 for s in seqs]
        logits, md = run_grouped(lm, cache, batch)
        assert md.decode_only == (step > 0) and len(md.group_tables) == 2
        for s, row in zip(seqs, md.last_token_indices().tolist()):
            torch.testing.assert_close(logits[row], hf_logits(hf, s["tokens"])[-1], atol=1e-4, rtol=0)
            s["done"] = len(s["tokens"])
            s["tokens"].append(int(logits[row].argmax()))
            window_table = s["tables"][sliding]
            for b in range(max(0, len(s["tokens"]) - 8) // BS):  # wholly before the next query's window
                if window_table[b] != NULL_BLOCK:
                    for k, v in cache.kv_caches:
                        k[window_table[b]], v[window_table[b]] = float("nan"), float("nan")
                    window_table[b] = NULL_BLOCK
                    freed += 1
    assert freed >= 6
    # the full group kept every block
    assert all(NULL_BLOCK not in s["tables"][full] for s in seqs)


def test_a_new_token_in_a_freed_block_is_refused():
    with pytest.raises(ValueError, match="freed block"):
        AttentionMetadata.build([([NULL_BLOCK, 3], 3, 2)], BS)

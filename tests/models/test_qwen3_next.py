"""Qwen3-Next-80B-A3B (model_type qwen3_next): the released config against the published counts,
and its KV bytes per token and linear-attention state per sequence by hand.

tests/models/data/Qwen3-Next-80B-A3B-Instruct.json: no hub access here. The fields through
moe_intermediate_size were read from a vendored copy of the released config found with the search
tool (a "Qwen/Qwen3-Next-80B-A3B-Instruct / model config" page: 48 layers, hidden 2048,
intermediate_size 5120, full_attention_interval 4, linear heads 16 key / 32 value of 128,
conv kernel 4, max_position_embeddings 262144, moe_intermediate_size 512); the rest are
transformers 5.25's Qwen3NextConfig defaults, which describe the flagship (512 experts top-10,
shared_expert_intermediate_size 512, 16 q / 2 KV heads of 256, vocab 151936, untied). The
per-parameter count is checked against transformers' modules in test_model_params.py."""

from __future__ import annotations

from pathlib import Path

from pagesim.core import KVLayout
from pagesim.models import load_model_config

CONFIG = Path(__file__).parent / "data" / "Qwen3-Next-80B-A3B-Instruct.json"
# Qwen3-Next blog / model card (Sept 2025): "80B total parameters, only 3B active"; the model card
# (as mirrored at usionmedia.com/models/qwen3-next-80b-a3b-instruct.html, read here): "80B in total
# and 3B activated", "Non-Embedding: 79B", "12 * (3 * (Gated DeltaNet -> MoE) -> (Gated Attention -> MoE))"
PUBLISHED_TOTAL_B, PUBLISHED_ACTIVE_B, PUBLISHED_NON_EMBEDDING_B = 80, 3, 79


def test_counts_against_the_published_figures():
    spec = load_model_config(CONFIG)
    embedding = 151936 * 2048  # the input embedding; the LM head is as large (untied)
    assert round(spec.params_total / 1e9) == PUBLISHED_TOTAL_B  # 79.67 B
    assert round((spec.params_total - 2 * embedding) / 1e9) == PUBLISHED_NON_EMBEDDING_B  # 79.05 B
    # active: 3.87 B with the embedding row and LM head, 3.25 B without; "3B" either way to one digit
    assert round((spec.params_active - 2 * embedding) / 1e9) == PUBLISHED_ACTIVE_B
    assert 3.5e9 < spec.params_active < 4.0e9


def test_layers_kv_bytes_and_state_bytes_by_hand():
    spec = load_model_config(CONFIG)
    assert spec.num_layers == 48 and spec.num_attention_layers == 12 and spec.linear_attn.num_layers == 36
    # full attention: 2 (K, V) x 2 KV heads x 256 x 2 bytes x 12 layers
    assert spec.kv_bytes_per_token == 2 * 2 * 256 * 2 * 12 == 24_576
    # per DeltaNet layer (vLLM gated_delta_net_state_shape): conv (4 - 1) x (2 x 16 x 128 + 32 x 128)
    # = 24,576 and recurrent 32 x 128 x 128 = 524,288 elements, bf16: 1,097,728 bytes
    assert spec.linear_attn.state_bytes_per_layer() == (3 * 8192 + 32 * 128 * 128) * 2 == 1_097_728
    assert spec.state_bytes_per_sequence() == 36 * 1_097_728 == 39_518_208
    assert spec.state_bytes_per_sequence(4) == 36 * (3 * 2048 + 8 * 128 * 128) * 2 == 9_879_552
    layout = KVLayout.of(spec.kv_groups)
    assert [t.kind for t in layout.tables] == ["full", "state", "state", "state"]

"""Granite-4.0-H-Tiny (model_type granitemoehybrid): the released config against the published
counts, and its KV bytes per token and Mamba2 state per sequence by hand.

tests/models/data/granite-4.0-h-tiny.json: no hub access here. The shape fields (hidden 1536,
40 layers with attention at 5, 15, 25 and 35, 12 q / 4 KV heads, 64 experts of 512 top-6, shared
MLP 1024, vocab 100352 tied, Mamba2 48 heads of 64, state 128, 1 group, conv 4, chunk 256,
max_position_embeddings 131072) were read from a vendored copy of the published config.json found
with the find_string tool (a test fixture GRANITE_H_TINY_HF); attention_bias, mamba_conv_bias,
mamba_proj_bias and position_embedding_type are transformers 5.25's GraniteMoeHybridConfig defaults /
the Granite 4.0 convention (no bias, conv bias, NoPE). The per-parameter count is checked against
transformers' modules for a tiny config in test_model_params.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.core import KVLayout
from pagesim.models import load_model_config
from pagesim.models.config import ModelConfigError
from pagesim.models.mamba2 import Mamba2Spec
from pagesim.sim.pool import state_block_size

CONFIG = Path(__file__).parent / "data" / "granite-4.0-h-tiny.json"
# ibm-granite/granite-4.0-h-tiny model card (as copied in the README of DocDBrown/IBMGranite4Tiny,
# read here): "Granite-4.0-H-Tiny is a 7B parameter long-context instruct model"; IBM's Granite 4.0
# announcement (Oct 2025): "7B total, 1B active" (recalled)
PUBLISHED_TOTAL_B, PUBLISHED_ACTIVE_B = 7, 1


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_counts_by_hand_and_against_the_published_figures(spec):
    h, embedding = 1536, 100352 * 1536  # tied: one table
    moe_layer = h * 64 + 64 * 3 * h * 512 + 3 * h * 1024 + 2 * h  # router, experts, shared MLP, 2 norms
    # in_proj (z, x, B, C, dt: 3,072 + 3,328 + 48), out_proj; conv 3,328 x (4 + 1 bias), A_log/D/dt_bias, gated norm
    mamba = h * 6448 + 3072 * h + 3328 * 5 + 3 * 48 + 3072
    attention = 2 * h * h + 2 * h * 512  # q, o; k, v (4 heads of 128)
    assert spec.params_total == embedding + h + 40 * moe_layer + 36 * mamba + 4 * attention == 6_939_037_248
    assert round(spec.params_total / 1e9) == PUBLISHED_TOTAL_B
    active_moe = moe_layer - 58 * 3 * h * 512  # 6 of the 64 experts
    assert spec.params_active == embedding + h + 40 * active_moe + 36 * mamba + 4 * attention == 1_465_470_528
    assert round((spec.params_active - embedding) / 1e9) == PUBLISHED_ACTIVE_B  # 1.31 B without the embedding


def test_layers_kv_bytes_and_state_bytes_by_hand(spec):
    assert spec.num_layers == 40 and spec.num_attention_layers == 4 and spec.linear_attn.num_layers == 36
    assert isinstance(spec.linear_attn, Mamba2Spec)
    # attention (NoPE): 2 (K, V) x 4 KV heads x 128 x 2 bytes x 4 layers
    assert spec.kv_bytes_per_token == 2 * 4 * 128 * 2 * 4 == 8_192
    # per Mamba2 layer (vLLM mamba2_state_shape): conv (4 - 1) x (3,072 + 2 x 1 x 128) and SSM 48 x 64 x 128, bf16
    assert spec.linear_attn.state_bytes_per_layer() == (3 * 3328 + 48 * 64 * 128) * 2 == 806_400
    assert spec.state_bytes_per_sequence() == 36 * 806_400 == 29_030_400
    # TP 2: the one group is replicated to 2 (extra_groups_for_head_shards), so each GPU keeps B and C whole
    assert spec.state_bytes_per_sequence(2) == 36 * (3 * (1536 + 2 * 128) + 24 * 64 * 128) * 2 == 14_542_848
    assert spec.state_bytes_per_sequence(4) == 36 * (3 * (768 + 2 * 128) + 12 * 64 * 128) * 2 == 7_299_072
    layout = KVLayout.of(spec.kv_groups)
    assert [t.kind for t in layout.tables] == ["full"] + ["state"] * 9  # 36 state layers in pages of 4


def test_block_size_raised_to_hold_a_state_page(spec):
    # an attention page of B tokens in one layer: B x 2,048 bytes at TP 1 must hold 806,400: B >= 393.75 -> 400
    assert state_block_size(16, spec, 1) == 400
    # TP 2: 1,024 bytes a token against 403,968 -> 394.5 -> 400
    assert state_block_size(16, spec, 2) == 400


def test_inspect_counts_the_state_pages_in_its_concurrency():
    import json

    from typer.testing import CliRunner

    from pagesim.cli import app

    result = CliRunner().invoke(app, ["model", "inspect", str(CONFIG), "--gpu", "h100-80gb", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    pool = info["kv_pool"]
    # pages of 400 tokens x 4 layers x 2,048 bytes (one layer's K and V a token): 3,276,800 bytes
    assert pool["block_size"] == 400 and pool["num_blocks"] == pool["pool_bytes_per_gpu"] // (400 * 4 * 2048)
    # a request of max_model_len tokens: ceil(L / 400) attention pages and one page in each of the 9 state tables
    length = info["max_model_len"]
    assert pool["max_concurrency"] == pool["num_blocks"] // (-(-length // 400) + 9)
    # the token count alone (pool bytes / 8,192 a token) would admit more: the state takes its pages
    assert pool["max_concurrency"] < pool["token_slots"] // length


def test_layer_types_refused(tmp_path):
    import json
    fields = json.loads(CONFIG.read_text())
    for types, problem in ((["mamba"] * 40, "no attention layer"), (["mamba"] * 39, "lists 39 layers"),
                           (["mamba"] * 39 + ["mlp"], "unknown kinds")):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(dict(fields, layer_types=types)))
        with pytest.raises(ModelConfigError, match=problem):
            load_model_config(path)

"""Falcon-H1 (model_type falcon_h1): every layer runs attention AND a Mamba2 mixer side by side
(ModelSpec.num_parallel_mixer_layers), so every layer keeps paged KV and a Mamba2 state.
Falcon-H1-7B-Instruct and Falcon-H1-34B-Instruct against their published parameter counts, KV
bytes per token, state bytes per sequence and block size by hand; malformed configs refused in one
line naming the file and the field.

The configs (tests/models/data/, no hub access here) are rebuilt: depth, width, attention heads
(q / KV), Mamba heads, head sizes (attention / Mamba) and d_state as the transformers FalconH1
model doc's table gives them (7B: 44, 3072, 12 / 2, 24, 128 / 128, 256; 34B: 72, 5120, 20 / 4,
32, 128 / 128, 256), so mamba_d_ssm = Mamba heads x 128; intermediate_size (7B 12288, 34B 21504),
vocab_size (7B 130048, 34B 261120), mamba_n_groups 1, untied embeddings, mamba_rms_norm false,
262144 positions (recalled). The muP multipliers are left out: they change no shape. The count
per tensor is checked against transformers' own FalconH1 modules in test_model_params.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core import KVLayout
from pagesim.models import load_model_config
from pagesim.sim.pool import state_block_size

DATA = Path(__file__).parent / "data"
H7B, H34B = DATA / "Falcon-H1-7B-Instruct.json", DATA / "Falcon-H1-34B-Instruct.json"
# tiiuae/Falcon-H1-7B-Instruct and tiiuae/Falcon-H1-34B-Instruct HF pages (safetensors): 7.59B and
# 33.6B params (recalled; the figures issue 24 gives as ~7.6 B and ~33.6 B)
PUBLISHED_7B_B, PUBLISHED_34B_B = 7.59, 33.6


def layer(h, heads, kv_heads, head_dim, mamba_heads, mamba_head_dim, state, ffn, groups=1, kernel=4):
    """One Falcon-H1 layer by hand: two norms; q, k, v, o; the Mamba2 in_proj (z, x, B, C, dt),
    conv1d with bias, A_log, D, dt_bias (no gated-norm weight: mamba_rms_norm false), out_proj;
    the gated MLP."""
    inner, bc = mamba_heads * mamba_head_dim, 2 * groups * state
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    mamba = h * (2 * inner + bc + mamba_heads) + (inner + bc) * (kernel + 1) + 3 * mamba_heads + inner * h
    return 2 * h + attention + mamba + 3 * h * ffn


def test_7b_counts_by_hand_and_against_the_published_figure():
    spec = load_model_config(H7B)
    h = 3072
    assert spec.num_layers == spec.num_attention_layers == spec.linear_attn.num_layers == 44
    assert spec.num_parallel_mixer_layers == 44 and spec.num_mixer_layers == 44
    total = 44 * layer(h, 12, 2, 128, 24, 128, 256, 12288) + 2 * 130048 * h + h  # embedding, untied head, final norm
    assert spec.params_total == spec.params_active == total == 7_585_513_568
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_7B_B, rel=0.005)  # -0.06 %


def test_34b_counts_by_hand_and_against_the_published_figure():
    spec = load_model_config(H34B)
    h = 5120
    total = 72 * layer(h, 20, 4, 128, 32, 128, 256, 21504) + 2 * 261120 * h + h
    assert spec.params_total == total == 33_453_293_312
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_34B_B, rel=0.005)  # -0.44 %


def test_kv_bytes_and_state_bytes_by_hand():
    h7 = load_model_config(H7B)
    # every layer keeps paged KV: K and V of 2 heads of 128, bf16, 44 layers
    assert h7.kv_bytes_per_token == 44 * 2 * 2 * 128 * 2 == 45_056
    assert h7.kv_bytes_per_token_per_gpu(2) == 22_528
    # and a Mamba2 state (vLLM mamba2_state_shape, bf16): conv (4 - 1) x (3,072 + 2 x 1 x 256), SSM 24 x 128 x 256
    assert h7.linear_attn.state_bytes_per_layer() == (3 * 3584 + 24 * 128 * 256) * 2 == 1_594_368
    assert h7.state_bytes_per_sequence() == 44 * 1_594_368 == 70_152_192
    # TP 2: the one group is replicated to 2, so each GPU keeps B and C whole; 12 heads
    assert h7.state_bytes_per_sequence(2) == 44 * (3 * (1536 + 2 * 256) + 12 * 128 * 256) * 2 == 35_143_680
    h34 = load_model_config(H34B)
    assert h34.kv_bytes_per_token == 72 * 2 * 4 * 128 * 2 == 147_456
    assert h34.state_bytes_per_sequence() == 72 * (3 * (4096 + 512) + 32 * 128 * 256) * 2 == 152_985_600


def test_state_tables_and_block_size_by_hand():
    h7 = load_model_config(H7B)
    layout = KVLayout.of(h7.kv_groups)
    # 44 attention layers and 44 state layers: one table each, pages of 44 layers, no padding
    assert [t.kind for t in layout.tables] == ["full", "state"] and layout.layers_per_block == 44
    assert layout.padding_layers == 0
    # an attention page of B tokens in one layer, B x 1,024 bytes, must hold 1,594,368: 97.3 x 16 -> 98 x 16
    assert state_block_size(16, h7, 1) == 1568
    # TP 2: 512 bytes a token in a layer against 798,720: 97.5 x 16 -> 98 x 16
    assert state_block_size(16, h7, 2) == 1568
    # 34B: 2,048 bytes a token in a layer against 2,124,800: 64.8 x 16 -> 65 x 16
    assert state_block_size(16, load_model_config(H34B), 1) == 1040


@pytest.mark.parametrize("change,field,problem", [
    (dict(mamba_d_head=100), "mamba_d_head", "100 x 'mamba_n_heads' 24 is not the Mamba width 3072"),
    (dict(mamba_d_head="auto", mamba_n_heads=25), "mamba_n_heads", "25 does not divide the Mamba width 3072"),
    (dict(mamba_n_groups=5), "mamba_n_groups", "does not divide 'mamba_n_heads' 24"),
    (dict(mamba_proj_bias=True), "mamba_proj_bias", "biases are not modelled"),
    (dict(projectors_bias=True), "projectors_bias", "biases are not modelled"),
    (dict(attention_bias=True), "attention_bias", "biases are not modelled"),
    (dict(hidden_act="gelu"), "hidden_act", "must be 'silu'"),
    (dict(mamba_d_state=0), "mamba_d_state", "must be a positive integer"),
])
def test_malformed_configs_are_one_line_naming_the_file_and_field(tmp_path, refused_in_one_line, change, field, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(H7B.read_text()), **change}))
    refused_in_one_line(path, field, problem)


def test_inspect_json():
    result = CliRunner().invoke(app, ["model", "inspect", str(H7B), "--gpu", "h100-80gb", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["params_total"], out["kv_bytes_per_token"], out["state_bytes_per_sequence"]) == \
        (7_585_513_568, 45_056, 70_152_192)
    assert out["num_parallel_mixer_layers"] == 44
    assert [(g["kind"], g["num_layers"]) for g in out["kv_groups"]] == [("full", 44), ("state", 44)]

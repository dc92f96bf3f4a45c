"""AI21 Jamba (model_type jamba): Mamba v1 mixers (pagesim.models.mamba1) with GQA attention one
layer in 8, routed experts (16, top 2) every other layer. Jamba-Mini-1.6 and Jamba-Large-1.6
against their published parameter counts, KV bytes per token, state bytes per sequence and block
size by hand; malformed configs refused in one line naming the file and the field. The count per
tensor is checked against transformers' own JambaForCausalLM modules in test_model_params.py.

The configs (tests/models/data/, no hub access here) are rebuilt from memory (recalled) on
transformers 5's JambaConfig defaults, which are the Mini's shapes: hidden 4096, 32 layers, 32
heads / 8 KV heads, intermediate 14336, vocab 65536, 16 experts top 2 (expert period 2 offset 1),
attention period 8 offset 4, mamba d_state 16, d_conv 4, expand 2, dt_rank 256, conv bias, untied
head, 262144 positions. Large: hidden 8192, 72 layers, 64 heads / 8 KV heads, intermediate 24576,
dt_rank 512, the rest as the Mini."""

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
MINI, LARGE = DATA / "AI21-Jamba-Mini-1.6.json", DATA / "AI21-Jamba-Large-1.6.json"
# ai21labs/AI21-Jamba-Mini-1.6 HF page (safetensors): 51.6B params; AI21's model cards and blog:
# Mini 12B active / 52B total, Large 94B active / 398B total (all recalled)
PUBLISHED_MINI_B, PUBLISHED_LARGE_B, PUBLISHED_LARGE_ACTIVE_B = 51.6, 398, 94
PUBLISHED_MINI_ACTIVE_B = 12  # two significant digits: checked to them (as test_model_params does)
V = 65536


def mamba(h, r, n=16, kernel=4):
    """One Mamba v1 mixer by hand (I = 2 h): in_proj (h -> 2 I), conv1d I x kernel + bias, x_proj
    (I -> r + 2 n), dt_proj (r -> I) + bias, A_log I x n, D, dt/B/C norms, out_proj (I -> h)."""
    i = 2 * h
    return h * 2 * i + i * kernel + i + i * (r + 2 * n) + r * i + i + i * n + i + r + 2 * n + i * h


def attention(h, heads, kv_heads, head_dim=128):
    return 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim


def model(h, layers, heads, kv_heads, ffn, r, active=False):
    mlp = 3 * h * ffn
    moe = (2 if active else 16) * mlp + h * 16  # experts (top 2 when active) and the router
    n_attn, n_moe = layers // 8, layers // 2
    return ((layers - n_attn) * mamba(h, r) + n_attn * attention(h, heads, kv_heads) + (layers - n_moe) * mlp
            + n_moe * moe + layers * 2 * h + 2 * V * h + h)  # two norms a layer; embedding, untied head, final norm


def test_mini_counts_by_hand_and_against_the_published_figures():
    spec = load_model_config(MINI)
    assert (spec.num_attention_layers, spec.linear_attn.num_layers) == (4, 28)  # layers 4, 12, 20, 28 attend
    assert (spec.moe.num_moe_layers, spec.num_dense_layers, spec.moe.num_experts) == (16, 16, 16)  # odd layers
    assert spec.params_total == model(4096, 32, 32, 8, 14336, 256) == 51_570_323_328
    assert spec.params_active == model(4096, 32, 32, 8, 14336, 256, active=True) == 12_110_311_296
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_MINI_B, rel=0.005)  # -0.06 %
    assert round(spec.params_active / 1e9) == PUBLISHED_MINI_ACTIVE_B  # 12.11: +0.9 % of the rounded 12


def test_large_counts_by_hand_and_against_the_published_figures():
    spec = load_model_config(LARGE)
    assert (spec.num_attention_layers, spec.linear_attn.num_layers, spec.moe.num_moe_layers) == (9, 63, 36)
    assert spec.params_total == model(8192, 72, 64, 8, 24576, 512) == 398_555_145_696
    assert spec.params_active == model(8192, 72, 64, 8, 24576, 512, active=True) == 94_149_338_592
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_LARGE_B, rel=0.005)  # +0.14 %
    assert spec.params_active / 1e9 == pytest.approx(PUBLISHED_LARGE_ACTIVE_B, rel=0.005)  # +0.16 %


def test_kv_bytes_and_state_bytes_by_hand():
    mini = load_model_config(MINI)
    # 4 attention layers: K and V of 8 heads of 128, bf16. At 256K tokens: 4 GiB, the "4GB" of the
    # Jamba paper's table 1 (Lieber et al. 2024, recalled)
    assert mini.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    assert mini.kv_bytes_per_token * 262_144 == 4 * 2**30
    assert mini.kv_bytes_per_token_per_gpu(2) == 8_192
    # vLLM mamba1_state_shape, bf16: conv (4 - 1) x 8,192, SSM 8,192 x 16
    assert mini.linear_attn.state_bytes_per_layer() == (3 * 8192 + 8192 * 16) * 2 == 311_296
    assert mini.state_bytes_per_sequence() == 28 * 311_296 == 8_716_288
    assert mini.state_bytes_per_sequence(2) == 28 * (3 * 4096 + 4096 * 16) * 2 == 4_358_144  # I split over TP
    large = load_model_config(LARGE)
    assert large.kv_bytes_per_token == 9 * 2 * 8 * 128 * 2 == 36_864
    assert large.state_bytes_per_sequence() == 63 * (3 * 16384 + 16384 * 16) * 2 == 39_223_296


def test_state_tables_and_block_size_by_hand():
    mini = load_model_config(MINI)
    layout = KVLayout.of(mini.kv_groups)
    # 4 attention layers, 28 state layers in pages of 4: seven state tables, no padding
    assert [t.kind for t in layout.tables] == ["full"] + ["state"] * 7 and layout.padding_layers == 0
    # an attention page of B tokens in one layer, B x 4,096 bytes, must hold 311,296: 4.75 x 16 -> 5 x 16
    assert state_block_size(16, mini, 1) == 80
    # TP 2: 2,048 bytes a token in a layer against 155,648: 4.75 x 16 -> 80 again
    assert state_block_size(16, mini, 2) == 80
    # Large: 4,096 bytes against 622,592: 9.5 x 16 -> 10 x 16
    assert state_block_size(16, load_model_config(LARGE), 1) == 160


@pytest.mark.parametrize("change,field,problem", [
    (dict(attn_layer_offset=8), "attn_layer_offset", "8 must be smaller than 'attn_layer_period' 8"),
    (dict(expert_layer_offset=2), "expert_layer_offset", "2 must be smaller than 'expert_layer_period' 2"),
    (dict(num_hidden_layers=4), "attn_layer_offset", "leaves no attention layer in 4"),
    (dict(num_experts_per_tok=17), "num_experts_per_tok", "17 is more than 'num_experts' 16"),
    (dict(mamba_proj_bias=True), "mamba_proj_bias", "biases on the Mamba projections are not modelled"),
    (dict(mamba_dt_rank="big"), "mamba_dt_rank", "integer"),
    (dict(mamba_d_state=0), "mamba_d_state", "must be a positive integer"),
    (dict(hidden_act="gelu"), "hidden_act", "must be 'silu'"),
])
def test_malformed_configs_are_one_line_naming_the_file_and_field(tmp_path, refused_in_one_line, change, field, problem):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(MINI.read_text()), **change}))
    refused_in_one_line(path, field, problem)


def test_inspect_json():
    result = CliRunner().invoke(app, ["model", "inspect", str(MINI), "--gpu", "h100-80gb", "--tp", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["params_total"], out["params_active"], out["kv_bytes_per_token"], out["state_bytes_per_sequence"]) == \
        (51_570_323_328, 12_110_311_296, 16_384, 8_716_288)
    assert out["state_bytes_per_sequence_per_gpu"] == 4_358_144
    assert [(g["kind"], g["num_layers"]) for g in out["kv_groups"]] == [("full", 4), ("state", 28)]

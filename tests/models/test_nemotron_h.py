"""Nemotron-H (model_type nemotron_h): Nemotron-H-8B-Base-8K and NVIDIA-Nemotron-Nano-9B-v2 against
their published parameter counts, and their KV bytes per token, Mamba2 state per sequence and
block size by hand; malformed patterns refused with one line naming the file and the field.

The configs (tests/models/data/, no hub access here) are rebuilt:
- Nemotron-H-8B-Base-8K: the shape fields as a TensorRT-LLM test fixture vendors the config
  (MAMBA_HYBRID_CONFIG: hidden 4096, 52 layers "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
  32 q / 8 KV heads of 128 (attention_head_dim), MLP 21504 relu2, Mamba 128 heads of 64, 8 groups,
  state 128, conv 4, vocab 131072 untied, 8192 positions) and a blog's table read from the HF
  config (the same values, ssm_state_size 128, expand 2); chunk_size 128 (recalled: the fixture
  says 256; it moves only the prefill scan's cost).
- NVIDIA-Nemotron-Nano-9B-v2: as recalled, and the same fields in a planner's test fixture found
  with find_string (hidden 4480, 56 layers "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
  MLP 15680, 40 q / 8 KV heads of 128, Mamba 128 heads of 80, 8 groups, state 128); conv 4,
  vocab 131072 untied, 131072 positions (recalled).
Neither config sets mamba_ssm_cache_dtype, so vLLM keeps the SSM state in float32
(NemotronHForCausalLMConfig's default, vllm-project/vllm PR 39032; the model cards also ask for
--mamba-ssm-cache-dtype float32). The per-parameter count is checked against transformers' own
NemotronH modules for a tiny config in test_model_params.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core import KVLayout
from pagesim.models import load_model_config
from pagesim.models.config import ModelConfigError, model_from_config
from pagesim.sim.pool import state_block_size

DATA = Path(__file__).parent / "data"
NANO, H8B = DATA / "NVIDIA-Nemotron-Nano-9B-v2.json", DATA / "Nemotron-H-8B-Base-8K.json"
# nvidia/NVIDIA-Nemotron-Nano-9B-v2 (HF page, safetensors): 8.89B params (recalled; the figure the
# issue gives); nvidia/Nemotron-H-8B-Base-8K (HF page, safetensors): 8.1B params (recalled); the
# Nemotron-H report (arXiv 2504.03624) names it by its rounded 8B
PUBLISHED_NANO_B, PUBLISHED_8B_B = 8.89, 8.1


def mamba_layer(h, heads, head_dim, groups, state, kernel=4):
    """One Mamba2 layer by hand: its norm, in_proj (z, x, B, C, dt), conv1d with bias, A_log, D,
    dt_bias, the gated norm (width I), out_proj."""
    inner, bc = heads * head_dim, 2 * groups * state
    return h + h * (2 * inner + bc + heads) + (inner + bc) * (kernel + 1) + 3 * heads + inner + inner * h


def test_nano_9b_v2_counts_by_hand_and_against_the_published_figure():
    spec = load_model_config(NANO)
    h = 4480
    mamba = mamba_layer(h, 128, 80, 8, 128)
    mlp = h + 2 * h * 15680  # norm, up, down: no gate
    attention = h + 2 * h * 40 * 128 + 2 * h * 8 * 128  # norm, q and o, k and v
    assert (spec.linear_attn.num_layers, spec.num_mlp_only_layers, spec.num_attention_layers) == (27, 25, 4)
    total = 27 * mamba + 25 * mlp + 4 * attention + 2 * 131072 * h + h  # embedding, untied head, final norm
    assert spec.params_total == spec.params_active == total == 8_888_227_328
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_NANO_B, rel=0.005)  # 0.02 % off


def test_8b_counts_by_hand_and_against_the_published_figure():
    spec = load_model_config(H8B)
    h = 4096
    total = (24 * mamba_layer(h, 128, 64, 8, 128) + 24 * (h + 2 * h * 21504) + 4 * (h + 2 * h * h + 2 * h * 1024)
             + 2 * 131072 * h + h)
    assert spec.params_total == total == 8_100_852_736
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_8B_B, rel=0.005)  # 0.01 % off
    assert spec.head_dim == 128 and spec.max_model_len == 8192  # (attention_head_dim)


def test_kv_bytes_and_state_bytes_by_hand():
    nano = load_model_config(NANO)
    # only the 4 attention layers keep paged KV: K and V of 8 heads of 128, bf16
    assert nano.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2 == 16_384
    assert nano.kv_bytes_per_token_per_gpu(2) == 8_192
    # a Mamba2 layer: conv state (4 - 1) x (10,240 + 2 x 8 x 128) in bf16, SSM state 128 x 80 x 128 in fp32
    assert nano.linear_attn.state_bytes_per_layer() == 3 * 12_288 * 2 + 128 * 80 * 128 * 4 == 5_316_608
    assert nano.state_bytes_per_sequence() == 27 * 5_316_608 == 143_548_416
    # TP 2: 64 heads and 4 of the 8 groups a GPU
    assert nano.state_bytes_per_sequence(2) == 27 * (3 * (5_120 + 2 * 4 * 128) * 2 + 64 * 80 * 128 * 4) == 71_774_208
    h8 = load_model_config(H8B)
    assert h8.kv_bytes_per_token == 16_384
    assert h8.state_bytes_per_sequence() == 24 * (3 * 10_240 * 2 + 128 * 64 * 128 * 4) == 102_137_856
    # at bf16 (the config saying so) the SSM part halves: 24 x 2,158,592, a blog's figure for this model
    fields = dict(json.loads(H8B.read_text()), mamba_ssm_cache_dtype="bfloat16")
    assert model_from_config(fields, "nemotron-h").state_bytes_per_sequence() == 24 * 2_158_592 == 51_806_208


def test_state_tables_and_block_size_by_hand():
    nano = load_model_config(NANO)
    layout = KVLayout.of(nano.kv_groups)
    # 4 attention layers against 27 state layers: pages of 4 layers, 7 state tables (the last of 3)
    assert [t.kind for t in layout.tables] == ["full"] + ["state"] * 7 and layout.padding_layers == 1
    # an attention page of B tokens in one layer, B x 4,096 bytes, must hold 5,316,608: B > 1,298 -> 82 x 16
    assert state_block_size(16, nano, 1) == 1312
    h8 = load_model_config(H8B)
    # TP 2: 2,048 bytes a token in a layer against 30,720 + 2,097,152 = 2,127,872: 64.9 x 16 -> 65 x 16
    assert state_block_size(16, h8, 2) == 1040


@pytest.mark.parametrize("change,field,problem", [
    (dict(num_hidden_layers=55), "hybrid_override_pattern", "has 56 layers, 'num_hidden_layers' is 55"),
    (dict(hybrid_override_pattern="M-M*X" + "-" * 51), "hybrid_override_pattern", "unknown layer characters ['X']"),
    (dict(hybrid_override_pattern="M-" * 28), "hybrid_override_pattern", "no attention layer"),
    # 'E' layers (Nemotron 3, tests/models/test_nemotron3.py) need the MoE fields this config lacks
    (dict(hybrid_override_pattern="ME*-" * 14), "n_routed_experts", "is missing: the MoE layers ('E') need it"),
    (dict(hybrid_override_pattern=None), "hybrid_override_pattern", "is missing"),
    (dict(mamba_ssm_cache_dtype="int8"), "mamba_ssm_cache_dtype", "must be one of"),
])
def test_malformed_configs_are_one_line_naming_the_file_and_field(tmp_path, change, field, problem):
    assert_refused_in_one_line(tmp_path, NANO, change, field, problem)


def assert_refused_in_one_line(tmp_path, base, change: dict, field: str, problem: str) -> None:
    """The config file `base` with `change` is refused in one line naming the file, the field and the problem."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(base.read_text()), **change}))
    with pytest.raises(ModelConfigError) as e:
        load_model_config(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message and repr(field) in message and problem in message


def test_inspect_json():
    result = CliRunner().invoke(app, ["model", "inspect", str(NANO), "--gpu", "h100-80gb", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["params_total"], out["kv_bytes_per_token"], out["state_bytes_per_sequence"]) == \
        (8_888_227_328, 16_384, 143_548_416)
    assert out["num_mlp_only_layers"] == 25

"""MiniMax-M1 (model_type minimax_m1; MiniMax-Text-01's architecture): the released config against
the published counts, its KV bytes per token and lightning-attention state per sequence by hand,
the pool on 8 x H200, inspect and a replay, and malformed configs refused in one line.

tests/models/data/MiniMax-M1.json: no hub access here. The file is, byte for byte, config.json of
the GitHub repository MiniMax-AI/MiniMax-M1 (commit 4917af1b, "add README and model files",
16 June 2025, unchanged to its head 2abb4f4), read from a snapshot fetched with the search tools:
80 layers of 6,144 with attn_type_list a softmax layer (1) every 8th and lightning (0) the rest,
64 q / 8 KV heads of 128, rotary_dim 64, 32 experts of 9,216 top 2, shared_intermediate_size 0,
vocab 200,064 untied, max_position_embeddings 10,240,000. Its README: "MiniMax-M1-40k" and
"MiniMax-M1-80k" (the thinking budgets of one architecture) and "a total of 456 billion parameters
with 45.9 billion parameters activated per token"; MiniMax-AI/MiniMax-01's
MiniMax-Text-01-Model-Card.md gives the same for MiniMax-Text-01 ("Total Parameters: 456B",
"Activated Parameters per Token: 45.9B") with the same shapes (80 layers, hidden 6,144, 32 experts
of 9,216 top 2, a softmax layer after every 7 lightning ones). The per-parameter count is checked
against transformers' modules for a tiny config in test_model_params.py; the lightning state's
shape and dtype are vLLM's (MambaStateShapeCalculator.linear_attention_state_shape: heads / TP x
head_dim x head_dim; linear_attention_state_dtype: the model dtype)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core import KVLayout
from pagesim.models import load_model_config, model_from_config
from pagesim.models.config import ModelConfigError
from pagesim.models.lightning import LightningAttnSpec
from pagesim.sim.pool import size_pool, state_block_size
from pagesim.sim.replay_config import ReplayConfig

CONFIG = Path(__file__).parent / "data" / "MiniMax-M1.json"
FIELDS = json.loads(CONFIG.read_text())
TRACE = Path(__file__).parents[2] / "traces" / "sharegpt.json"
FILES = ["MiniMax-M1"]  # (test_public_configs.test_every_data_file_is_checked)
PUBLISHED_TOTAL_B, PUBLISHED_ACTIVE_B = 456, 45.9
GiB = 2**30
H, VOCAB, EXPERT = 6144, 200_064, 3 * 6144 * 9216  # hidden; vocabulary; one expert's gate, up and down


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_counts_by_hand_and_against_the_published_figures(spec):
    softmax = H * 8192 + 2 * H * 1024 + 8192 * H  # q; k and v (8 KV heads of 128); o
    lightning = H * 3 * 8192 + H * 8192 + 8192 * H + 8192  # qkv_proj, output_gate, out_proj; the norm
    layer = 2 * H + H * 32 + 32 * EXPERT  # two norms, the router, 32 experts
    outside = 2 * VOCAB * H + H  # embedding and LM head (untied), final norm
    assert spec.params_total == outside + 80 * layer + 10 * softmax + 70 * lightning == 456_089_655_296
    assert spec.params_total / 1e9 == pytest.approx(PUBLISHED_TOTAL_B, rel=0.005)  # 456.09 B
    assert spec.params_active == spec.params_total - 80 * 30 * EXPERT == 48_403_306_496  # 2 of 32 experts
    # MiniMax counts neither the embedding table nor the LM head: 45.94 B (48.40 B with both)
    assert (spec.params_active - 2 * VOCAB * H) / 1e9 == pytest.approx(PUBLISHED_ACTIVE_B, rel=0.005)


def test_layers_kv_bytes_and_state_bytes_by_hand(spec):
    assert spec.num_layers == 80 and spec.num_attention_layers == 10 and spec.linear_attn.num_layers == 70
    assert spec.linear_attn == LightningAttnSpec(70, 64, 128)
    assert spec.moe.num_moe_layers == 80 and spec.moe.num_shared_experts == 0
    # softmax layers: 2 (K, V) x 8 KV heads x 128 x 2 bytes x 10 layers; TP 8: one KV head a GPU
    assert spec.kv_bytes_per_token == 2 * 8 * 128 * 2 * 10 == 40_960
    assert spec.kv_bytes_per_token_per_gpu(8) == 5_120
    # lightning: 64 heads x 128 x 128, bf16, a layer; 70 layers (a 2,048-token request's KV is 83.9 MB)
    assert spec.linear_attn.state_bytes_per_layer() == 64 * 128 * 128 * 2 == 2_097_152
    assert spec.state_bytes_per_sequence() == 70 * 2_097_152 == 146_800_640
    assert spec.state_bytes_per_sequence(8) == 70 * 8 * 128 * 128 * 2 == 18_350_080
    layout = KVLayout.of(spec.kv_groups)  # 70 state layers in tables of the 10 softmax layers' size
    assert layout.layers_per_block == 10 and [t.kind for t in layout.tables] == ["full"] + ["state"] * 7


def test_block_size_and_pool_on_eight_h200_by_hand(spec):
    # an attention page of B tokens of one layer on one GPU must hold one layer's state page:
    # TP 8: 512 bytes a token (one KV head) against 262,144: 16 x ceil(262,144 / 8,192) = 512;
    # TP 1: 4,096 against 2,097,152: 512 again
    assert state_block_size(16, spec, 8) == 16 * -(-262_144 // (16 * 512)) == 512
    assert state_block_size(16, spec, 1) == 512
    cfg = ReplayConfig(model=str(CONFIG), gpu="h200-141gb", tp=8, max_num_batched_tokens=8192, max_model_len=1_000_000)
    sized = size_pool(cfg, spec)
    assert sized.block_size == 512 and any("block size 512 (not 16)" in n for n in sized.notes)
    usable = int(0.95 * 141 * GiB)
    weights = 456_089_655_296 * 2 // 8  # bf16 over 8 GPUs: 106.2 GiB of the 127.3 usable
    # the profiling step of 8,192 tokens: residual stream 3 x 8,192 x 6,144 x 2, plus its largest
    # branch, the sampler's logits of 256 sequences (bf16 and two fp32 copies of 200,064)
    activations = 3 * 8192 * H * 2 + 256 * VOCAB * (2 + 2 * 4)
    assert (sized.capacity.weight_bytes_per_gpu, sized.capacity.activation_bytes_per_gpu) == (weights, activations)
    pool = usable - weights - activations - int(1.75 * GiB)
    assert sized.capacity.pool_bytes_per_gpu == pool == 27_112_101_580
    block_bytes = 512 * 10 * 512  # 512 tokens x 10 layers x 512 bytes (a state page, 262,144, padded to it)
    assert sized.num_blocks == pool // block_bytes == 10_342
    # a sequence of 2,048 tokens: 4 attention blocks and one block in each of the 7 state tables
    assert KVLayout.of(spec.kv_groups).sequences_that_fit(10_342, 2_048, 512) == 10_342 // (4 + 7) == 940


def test_inspect_counts_the_state_pages():
    result = CliRunner().invoke(app, ["model", "inspect", str(CONFIG), "--gpu", "h200-141gb", "--tp", "8", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert (info["params_total"], info["kv_bytes_per_token"], info["state_bytes_per_sequence_per_gpu"]) == \
        (456_089_655_296, 40_960, 18_350_080)
    pool = info["kv_pool"]
    assert pool["block_size"] == 512 and pool["num_blocks"] == pool["pool_bytes_per_gpu"] // (512 * 10 * 512)
    # one request of the 10,240,000-token max length needs 20,000 attention blocks: more than the pool
    assert pool["max_concurrency"] == pool["num_blocks"] // (10_240_000 // 512 + 7) == 0


def test_replay_fifty_requests_on_eight_h200():
    # vLLM v1's defaults (chunked prefill, 8,192-token steps): without them the profiling step
    # would be the 10,240,000-token max length, which leaves no pool (as in vLLM)
    # and at M1's 1,000,000-token context: its 10,240,000 positions need 48.85 GiB of KV a GPU
    # for one request, more than the pool, so vLLM would refuse to start (as pagesim does)
    args = ["replay", str(TRACE), "--model", str(CONFIG), "--gpu", "h200-141gb", "--tp", "8",
            "--num-requests", "50", "--policy", "vllm-v1", "--json"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "vLLM would refuse to start" in refused.output, refused.output
    result = CliRunner().invoke(app, [*args, "--max-model-len", "1000000"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["completed"] == 50 and out["failed"] == 0
    assert out["median_ttft_ms"] > 0 and out["median_tpot_ms"] > 0
    assert any("block size 512" in note for note in out["notes"])


def test_hf_layer_types_read_as_attn_type_list(spec):
    kinds = {0: "linear_attention", 1: "full_attention"}
    hf = {k: v for k, v in FIELDS.items() if k != "attn_type_list"}
    hf.update(model_type="minimax", layer_types=[kinds[k] for k in FIELDS["attn_type_list"]])
    assert model_from_config(hf, spec.name) == spec
    # neither field: every layer softmax attention (vLLM's default), no state
    plain = model_from_config({k: v for k, v in hf.items() if k != "layer_types"}, spec.name)
    assert plain.linear_attn is None and plain.num_attention_layers == 80


def edited(**changes):
    fields = dict(FIELDS, **changes)
    return {k: v for k, v in fields.items() if v is not ...}


@pytest.mark.parametrize("fields,field,words", [
    (edited(attn_type_list=[0, 1] * 39), "attn_type_list", "80 layers"),
    (edited(attn_type_list=[0, 2] * 40), "attn_type_list", "other than 0"),
    (edited(attn_type_list=[True] * 80), "attn_type_list", "other than 0"),
    (edited(attn_type_list=[0] * 80), "attn_type_list", "no softmax attention layer"),
    (edited(attn_type_list=..., layer_types=["linear_attention"] * 79), "layer_types", "lists 79 layers"),
    (edited(attn_type_list=..., layer_types=["mamba"] * 80), "layer_types", "unknown kinds"),
    (edited(num_local_experts=...), "num_local_experts", "missing"),
    (edited(num_experts_per_tok=...), "num_experts_per_tok", "missing"),
    (edited(num_local_experts=[32] * 80), "num_local_experts", "positive integer"),
    (edited(num_local_experts=1, num_experts_per_tok=1), "num_local_experts", "dense MLP"),
    (edited(num_experts_per_tok=33), "num_experts_per_tok", "more than"),
    (edited(shared_intermediate_size=9216), "shared_intermediate_size", "not modelled"),
    (edited(rotary_dim=256), "rotary_dim", "more than"),
])
def test_malformed_configs_are_one_line_naming_file_and_field(tmp_path, fields, field, words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    with pytest.raises(ModelConfigError) as refused:
        load_model_config(path)
    message = str(refused.value)
    assert str(path) in message and repr(field) in message and words in message and "\n" not in message
    result = CliRunner().invoke(app, ["model", "inspect", str(path)])
    assert result.exit_code != 0 and result.output.strip().count("\n") == 0 and field in result.output

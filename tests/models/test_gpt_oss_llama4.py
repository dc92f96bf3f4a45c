"""gpt-oss and Llama 4 from their released config.json files (tests/models/data/), every figure
worked out by hand from the shapes and compared with the published ones.

Where the files come from (no hub access here; the fields as released, from repositories that
vendor them):
- gpt-oss-20b.json / gpt-oss-120b.json: https://huggingface.co/openai/gpt-oss-{20b,120b}/raw/main/config.json
  as vendored verbatim (as a Python dict) in circuit-tracer's tests (20b) and a test that quotes the
  120b file with `layer_types` written as 18 x [sliding, full]; expanded here.
- Llama-4-Scout-17B-16E-Instruct.json: meta-llama/Llama-4-Scout-17B-16E's config.json (a
  third-party dump of Llama4Config, `moe_layers` written as 0..47, expanded here) with the two
  fields the -Instruct repo changes: max_position_embeddings 10,485,760 (as quoted by neuronx and
  vLLM-issue copies of the Instruct config) and its llama3 rope_scaling (factor 16, both band
  factors 1). Neither changes a shape.
- Llama-4-Maverick-17B-128E-Instruct.json: TensorRT-LLM's LLAMA_4_MAVERICK_TWO_LAYER_CONFIG (the
  released text_config cut to 2 layers) with num_hidden_layers back to 48, its added
  no_rope_layer_interval dropped and moe_layers / no_rope_layers written out as transformers
  derives them (interleave step 2: layers 1, 3, ..., 47; every 4th layer NoPE); the vision_config
  is Scout's (the same encoder).
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core.errors import CannotServe
from pagesim.models import get_model, model_from_config
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.specs import get_gpu, kv_cache_capacity

DATA = Path(__file__).parent / "data"
TRACE = Path(__file__).parents[2] / "traces" / "sharegpt.json"
GiB = 2**30


def model(name):
    return get_model(str(DATA / f"{name}.json"))


def config(name):
    return json.loads((DATA / f"{name}.json").read_text())


# -- gpt-oss ---------------------------------------------------------------------------------
H, VOCAB, EXPERT = 2880, 201_088, 3 * 2880 * 2880      # an expert: gate_up (h x 2I) + down (I x h)
ATTN = H * (64 * 64 + 2 * 8 * 64) + 64 * 64 * H         # q, k, v, o weights
ATTN_OTHER = (64 * 64 + 2 * 8 * 64 + H) + 64            # q, k, v, o biases; 64 sinks
EXPERT_BIAS = 2 * 2880 + H                               # gate_up_proj_bias, down_proj_bias


def gpt_oss_by_hand(layers, experts, top_k=4):
    """(total, active without the embedding table, matmul weights of the experts)."""
    router = H * experts + experts                       # weight and bias
    per_layer = ATTN + ATTN_OTHER + 2 * H + router
    total = layers * (per_layer + experts * (EXPERT + EXPERT_BIAS)) + 2 * VOCAB * H + H
    active = layers * (per_layer + top_k * (EXPERT + EXPERT_BIAS)) + VOCAB * H + H  # LM head, not the embedding
    return total, active, layers * experts * EXPERT


@pytest.mark.parametrize("name,layers,experts,active_b,checkpoint_gib", [
    # gpt-oss model card (arXiv 2508.10925) Table 1: active 3.61B / 5.13B, checkpoint 12.8 / 60.8 GiB
    # (as recalled: the card could not be re-read in this sandbox; the counts by hand below agree
    # with these figures to the last digit given)
    ("gpt-oss-20b", 24, 32, 3.61, 12.8),
    ("gpt-oss-120b", 36, 128, 5.13, 60.8),
])
def test_gpt_oss_counts_and_mxfp4_bytes_by_hand(name, layers, experts, active_b, checkpoint_gib):
    m = model(name)
    total, active, expert_weights = gpt_oss_by_hand(layers, experts)
    assert m.params_total == total
    # the model card's active count leaves the embedding table out (the LM head stays in)
    assert m.params_active - VOCAB * H == active
    assert active / 1e9 == pytest.approx(active_b, rel=0.005)
    # MXFP4 experts: 4 bits a weight + one 8-bit scale per 32 = 4.25 bits; the rest (attention,
    # router, embeddings, biases, norms) bf16
    assert m.quant.method == "mxfp4" and m.quant.experts_only and not m.quant.fp8_compute
    assert m.weight_bytes == (total - expert_weights) * 2 + expert_weights * 17 // 32
    assert m.weight_bytes / GiB == pytest.approx(checkpoint_gib, rel=0.005)
    assert m.routed_expert_weight_bytes == expert_weights * 17 // 32


@pytest.mark.parametrize("name,layers", [("gpt-oss-20b", 24), ("gpt-oss-120b", 36)])
def test_gpt_oss_kv_bytes_by_hand(name, layers):
    # half the layers slide over 128 tokens: a token costs every layer while it is among a
    # sequence's last 128, then only the full-attention half; the pool is one set of blocks with a
    # block table per group (vLLM's hybrid KV cache manager), the sliding group's blocks freed once
    # they fall out of the window
    m = model(name)
    per_layer = 2 * 8 * 64 * 2                            # K and V, 8 heads of 64, bf16
    assert (m.num_sliding_layers, m.sliding_window) == (layers // 2, 128)
    assert m.kv_bytes_per_token == layers * per_layer
    assert m.kv_bytes_per_token_full_layers == layers // 2 * per_layer
    assert m.kv_bytes_per_token_per_gpu(8) == layers * per_layer // 8


def test_gpt_oss_without_layer_types_slides_on_even_layers():
    c = {k: v for k, v in config("gpt-oss-20b").items() if k != "layer_types"}
    m = model_from_config(c, "gpt-oss-20b")
    assert (m.num_sliding_layers, m.sliding_window) == (12, 128)
    del c["num_experts_per_tok"]  # the older field name
    assert model_from_config(c, "gpt-oss-20b").moe.experts_per_token == 4


def test_mxfp4_experts_are_read_at_4_25_bits():
    m = model("gpt-oss-20b")
    moe = [g for g in layer_groups(m, 1)][-1]
    bytes_of = {g.op: g.weight_bytes for g in moe.gemms}
    assert bytes_of["moe_experts_up"] == bytes_of["moe_experts_down"] == 0.53125
    assert bytes_of["attn_pre_proj"] == bytes_of["attn_post_proj"] == bytes_of["moe_router"] == 2
    # roofline decode of one token: its 4 experts a layer, read once, at 4.25 bits
    roof = RooflineCostModel(m, "h100-80gb")
    hbm = get_gpu("h100-80gb").hbm_bandwidth * roof.constants.hbm_efficiency
    assert roof._moe_terms(1)[1] == pytest.approx(24 * 4 * EXPERT * 0.53125 / hbm)


def test_mxfp4_needs_experts(tmp_path, refused_in_one_line):
    c = json.loads((DATA / "Llama-3.2-1B.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**c, "quantization_config": {"quant_method": "mxfp4"}}))
    refused_in_one_line(path, "quantization_config", "MoE experts only")


# -- Llama 4 ---------------------------------------------------------------------------------
def llama4_vision_by_hand(v: dict, text_hidden: int) -> int:
    """Llama4VisionModel + the multi-modal projector, from vision_config: patch embedding (no
    bias), class token, positions, two LayerNorms, `layers` x (q k v o with biases, fc1 fc2 with
    biases, two LayerNorms), the pixel-shuffle adapter MLP (no biases) and the projector."""
    d, ffn, patches = v["hidden_size"], v["intermediate_size"], (v["image_size"] // v["patch_size"]) ** 2
    embed = v["num_channels"] * v["patch_size"] ** 2 * d + d + (patches + 1) * d + 2 * 2 * d
    layer = 4 * (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 2 * 2 * d
    shuffled = int(d / v["pixel_shuffle_ratio"] ** 2)
    adapter = shuffled * v["projector_input_dim"] + v["projector_input_dim"] * v["projector_output_dim"]
    return embed + v["num_hidden_layers"] * layer + adapter + v["vision_output_dim"] * text_hidden


LLAMA4_VISION = llama4_vision_by_hand(config("Llama-4-Scout-17B-16E-Instruct")["vision_config"], 5120)

LH, L4_VOCAB, L4_EXPERT = 5120, 202_048, 3 * 5120 * 8192
L4_ATTN = LH * (40 * 128 + 2 * 8 * 128) + 40 * 128 * LH   # no biases; the q/k L2 norm has no weights


def llama4_by_hand(experts, moe_layers):
    """(language-model total, active) of 48 layers, `moe_layers` of them MoE (shared expert + top-1
    of `experts`, router without bias), the others a dense MLP of 16384; untied LM head."""
    dense = 48 - moe_layers
    common = 48 * (L4_ATTN + 2 * LH) + dense * 3 * LH * 16384 + 2 * L4_VOCAB * LH + LH
    total = common + moe_layers * (LH * experts + L4_EXPERT + experts * L4_EXPERT)
    active = common + moe_layers * (LH * experts + 2 * L4_EXPERT)
    return total, active


@pytest.mark.parametrize("name,experts,moe_layers,published_total", [
    ("Llama-4-Scout-17B-16E-Instruct", 16, 48, 109e9),      # Llama 4 blog: 109B total, 17B active
    ("Llama-4-Maverick-17B-128E-Instruct", 128, 24, 400e9),  # Llama 4 blog: 400B total, 17B active
])
def test_llama4_counts_by_hand(name, experts, moe_layers, published_total):
    m = model(name)
    total, active = llama4_by_hand(experts, moe_layers)
    assert LLAMA4_VISION == 871_932_416  # = transformers' Llama4VisionModel + projector on this vision_config
    # the vision encoder and projector vLLM loads count in the total and the weights, not per token
    assert (m.params_total, m.params_active, m.num_vision_params) == (total + LLAMA4_VISION, active, LLAMA4_VISION)
    assert (m.moe.num_moe_layers, m.moe.num_experts, m.moe.experts_per_token) == (moe_layers, experts, 1)
    assert (m.moe.shared_expert_ffn_size, m.moe.expert_ffn_size, m.ffn_size) == (8192, 8192, 16384)
    # the published totals count the vision encoder, as pagesim does
    assert m.params_total / published_total == pytest.approx(1, abs=0.005)
    assert active / 17e9 == pytest.approx(1, abs=0.025)       # the 17B active, embedding included
    assert m.weight_bytes == (total + LLAMA4_VISION) * 2 and m.quant is None


@pytest.mark.parametrize("name", ["Llama-4-Scout-17B-16E-Instruct", "Llama-4-Maverick-17B-128E-Instruct"])
def test_llama4_kv_bytes_by_hand(name):
    # 36 RoPE layers attend within chunks of 8192 (modelled as a window of 8192), the 12 NoPE
    # layers (3, 7, ..., 47) to everything
    m = model(name)
    per_layer = 2 * 8 * 128 * 2
    assert (m.num_sliding_layers, m.sliding_window) == (36, 8192)
    assert m.kv_bytes_per_token == 48 * per_layer == 196_608
    assert m.kv_bytes_per_token_full_layers == 12 * per_layer
    assert m.kv_bytes_per_token_per_gpu(8) == 48 * per_layer // 8


def test_llama4_defaults_and_text_only_configs():
    text = config("Llama-4-Maverick-17B-128E-Instruct")["text_config"]
    bare = {k: v for k, v in text.items() if k not in ("moe_layers", "no_rope_layers")}
    m = model_from_config(bare, "maverick-text")  # model_type llama4_text, vLLM's / HF's defaults
    assert (m.moe.num_moe_layers, m.num_sliding_layers) == (24, 36)
    assert model_from_config({**bare, "attention_chunk_size": 1_048_576}, "m").num_sliding_layers == 0
    assert model_from_config({**bare, "attention_chunk_size": None}, "m").kv_groups[0].kind == "full"


# -- serving them ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,gpu,tp,extra", [
    ("gpt-oss-20b", "h100-80gb", 1, []),
    # 60.8 GiB of MXFP4 weights fit one H100, as vLLM (v1: no other serves gpt-oss) serves it; with
    # v0's whole-prompt steps of 131,072 tokens the activations would leave no room for one request
    ("gpt-oss-120b", "h100-80gb", 1, ["--policy", "vllm-v1"]),
    ("gpt-oss-120b", "h100-80gb", 2, []),
    # 10,485,760 positions make the default step budget that many tokens: a usual serving length
    ("Llama-4-Scout-17B-16E-Instruct", "h100-80gb", 4, ["--max-model-len", "32768"]),
    ("Llama-4-Scout-17B-16E-Instruct", "h100-80gb", 8, ["--max-model-len", "32768"]),
    ("Llama-4-Maverick-17B-128E-Instruct", "h200", 8, ["--max-model-len", "32768"]),
])
def test_replay_serves_them(name, gpu, tp, extra):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"), "--gpu", gpu,
                                      "--tp", str(tp), "--num-requests", "50", "--json", *extra])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 50


def test_bf16_maverick_does_not_fit_eight_h100s():
    # 401.6B bf16 weights (vision tower included, sharded over TP as vLLM's default
    # mm_encoder_tp_mode "weights" does): 100.4 GB a GPU at TP 8, more than an H100 holds (Meta
    # serves the FP8 checkpoint on one H100 host); eight H200s hold them
    m = model("Llama-4-Maverick-17B-128E-Instruct")
    assert m.weight_bytes_per_gpu(8) == -(-(llama4_by_hand(128, 24)[0] + LLAMA4_VISION) * 2 // 8) > 80e9
    with pytest.raises(CannotServe, match="split the model over more GPUs"):
        kv_cache_capacity(m, "h100-80gb", tp=8, max_num_batched_tokens=8192)


@pytest.mark.parametrize("name,total,weights", [
    ("gpt-oss-20b", gpt_oss_by_hand(24, 32)[0], "13.76 GB (mxfp4, 4-bit experts)"),
    # (107,769,861,120 + 871,932,416 vision) x 2 bytes
    ("Llama-4-Scout-17B-16E-Instruct", llama4_by_hand(16, 48)[0] + LLAMA4_VISION, "217.28 GB"),
])
def test_inspect_shows_them(name, total, weights):
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / f"{name}.json"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["params_total"] == total
    assert info["params_vision"] == (LLAMA4_VISION if name.startswith("Llama-4") else 0)
    table = CliRunner().invoke(app, ["model", "inspect", str(DATA / f"{name}.json")])
    assert table.exit_code == 0 and weights in table.output, table.output

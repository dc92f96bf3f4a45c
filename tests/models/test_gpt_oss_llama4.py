"""gpt-oss from their released config.json files (tests/models/data/), every figure
worked out by hand from the shapes and compared with the published ones.

Where the files come from (no hub access here; the fields as released, from repositories that
vendor them):
- gpt-oss-20b.json / gpt-oss-120b.json: https://huggingface.co/openai/gpt-oss-{20b,120b}/raw/main/config.json
  as vendored verbatim (as a Python dict) in circuit-tracer's tests (20b) and a test that quotes the
  120b file with `layer_types` written as 18 x [sliding, full]; expanded here.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import get_model, model_from_config
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.specs import get_gpu

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


# -- serving them ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,gpu,tp,extra", [
    ("gpt-oss-20b", "h100-80gb", 1, []),
    ("gpt-oss-120b", "h100-80gb", 1, []),    # 60.8 GiB of MXFP4 weights fit one H100, as vLLM serves it
    ("gpt-oss-120b", "h100-80gb", 2, []),
])
def test_replay_serves_them(name, gpu, tp, extra):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"), "--gpu", gpu,
                                      "--tp", str(tp), "--num-requests", "50", "--json", *extra])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 50


@pytest.mark.parametrize("name,total,weights", [
    ("gpt-oss-20b", gpt_oss_by_hand(24, 32)[0], "13.76 GB (mxfp4, 4-bit experts)"),
])
def test_inspect_shows_them(name, total, weights):
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / f"{name}.json"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["params_total"] == total
    table = CliRunner().invoke(app, ["model", "inspect", str(DATA / f"{name}.json")])
    assert table.exit_code == 0 and weights in table.output, table.output

"""fbgemm_fp8 (Meta's FP8 releases): weight bytes and per-part GEMM widths by hand.

Llama-3.1-405B-Instruct-FP8 is quantized as the Llama 3 paper says (Dubey et al. 2024, section 6.2,
"FP8 quantization"): the feed-forward layers only, not the self-attention, and not the first and
last layers; its config.json names what stays in bf16 in `modules_to_not_convert` (rebuilt here
from that rule: every layer's q/k/v/o projections, layers 0 and 125's MLPs, lm_head)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import get_model
from pagesim.models.config import ModelConfigError
from pagesim.sim.cost.layer_ops import layer_groups

H, FFN, LAYERS, VOCAB = 16384, 53248, 126, 128256
ATTN = H * H + 2 * H * 1024 + H * H       # q, k, v (8 KV heads of 128), o
MLP = 3 * H * FFN                          # gate, up, down
TOTAL = LAYERS * (ATTN + MLP + 2 * H) + 2 * VOCAB * H + H  # layers and their norms, embedding, LM head, final norm


def llama_405b(modules=None) -> dict:
    kept = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(LAYERS) for p in "qkvo"]
    kept += [f"model.layers.{i}.mlp.{p}_proj" for i in (0, LAYERS - 1) for p in ("gate", "up", "down")]
    return {"model_type": "llama", "hidden_size": H, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
            "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": VOCAB,
            "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "quantization_config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                                    "modules_to_not_convert": (kept + ["lm_head"]) if modules is None else modules}}


def load(tmp_path, config: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return get_model(str(path))


def test_only_the_middle_layers_mlps_are_fp8(tmp_path):
    model = load(tmp_path, llama_405b())
    assert TOTAL == 405_853_388_800  # the model card's 405 B, counted from the shapes
    assert model.num_params == TOTAL
    assert model.quantized_params == (LAYERS - 2) * MLP
    assert model.weight_bytes == 2 * TOTAL - (LAYERS - 2) * MLP  # 1 byte a weight there, 2 elsewhere
    assert model.weight_bytes == 487_168_311_296


def test_attention_gemms_stay_bf16_and_mlp_bytes_add_up(tmp_path):
    model = load(tmp_path, llama_405b())
    (group,) = layer_groups(model, tokens=64, tp=8)
    by_op = {g.op: g for g in group.gemms}
    for op in ("attn_pre_proj", "attn_post_proj"):
        assert (by_op[op].weight_bytes, by_op[op].fp8) == (2, False)
    for op in ("mlp_up_proj", "mlp_down_proj"):
        # the mean over the 126 MLPs: 124 in FP8 (1 byte), 2 in bf16
        assert by_op[op].weight_bytes == pytest.approx((124 * 1 + 2 * 2) / 126)
        assert by_op[op].fp8


def test_a_fully_listed_checkpoint_and_an_empty_list(tmp_path):
    everything = load(tmp_path, llama_405b(modules=[]))
    assert everything.quantized_params == LAYERS * (ATTN + MLP)
    assert everything.weight_bytes == 2 * TOTAL - LAYERS * (ATTN + MLP)


def test_llama4_names_routers_and_shared_experts(tmp_path):
    from pagesim.models.quant import kept_modules
    from pagesim.models.config import ConfigFields

    names = ["language_model.model.layers.1.feed_forward.router", "language_model.model.layers.1.feed_forward.shared_expert.down_proj",
             "language_model.model.layers.3.feed_forward.shared_expert.up_proj", "language_model.model.layers.0.self_attn.q_proj",
             "language_model.model.layers.0.feed_forward.down_proj", "model.layers.2.block_sparse_moe.gate",
             "vision_model.model.layers.7.mlp.fc1", "lm_head"]
    fields = ConfigFields({}, "c.json: quantization_config")
    # (mixer layers, shared-expert layers, dense-MLP layers); vision_model's layers are not the decoder's
    assert kept_modules(names, fields) == (1, 2, 1)


@pytest.mark.parametrize("modules, message", [
    (["model.layers.0.self_attn.q_proj"], "keeps the attention of 1 of 126 layers unquantized: only all or none"),
    (["model.layers.5.block_sparse_moe.experts.0.w1"], "keeps routed experts unquantized"),
    ("lm_head", "must be a list of module names"),
])
def test_what_is_not_modelled_is_one_line(tmp_path, modules, message):
    with pytest.raises(ModelConfigError) as err:
        load(tmp_path, llama_405b(modules=modules))
    text = str(err.value)
    assert "config.json" in text and "quantization_config" in text and message in text
    assert "\n" not in text


def test_inspect_reports_the_bytes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama_405b()))
    result = CliRunner().invoke(app, ["model", "inspect", str(path), "--tp", "8", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["weight_bytes"] == 487_168_311_296
    assert info["weight_quantization"]["method"] == "fbgemm_fp8"

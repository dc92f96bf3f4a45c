"""The vision towers of multimodal checkpoints (pagesim.models.vision): Gemma 3's SigLIP encoder
and projector counted by hand from gemma-3-12b-it's vision_config (tests/models/data), compared
with the Gemma 3 report; Mistral Small 3.1's Pixtral tower and projector by hand, against the
published total and against transformers' modules; what they do to the weights and the KV pool.
Llama 4's tower is counted by hand in test_gpt_oss_llama4.py (LLAMA4_VISION), the Qwen towers in
test_qwen_vl.py."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import MODELS, get_model
from pagesim.sim.specs import kv_cache_capacity
from tests.models.test_gpt_oss_llama4 import LLAMA4_VISION

DATA = Path(__file__).parent / "data"

# gemma-3-12b-it vision_config: hidden 1152, intermediate 4304, 27 layers, 14 x 14 patches of
# 3 channels over 896 x 896 images (64 x 64 = 4,096 patches); text hidden 3840
D, FFN = 1152, 4304
PATCH_CONV = 3 * 14 * 14 * D + D                     # Conv2d with bias: 678,528
POSITIONS = 64 * 64 * D                              # one learned position a patch: 4,718,592
LAYER = 4 * (D * D + D) + (D * FFN + FFN) + (FFN * D + D) + 2 * 2 * D  # q k v o, fc1 fc2, 2 LayerNorms
SIGLIP = PATCH_CONV + POSITIONS + 27 * LAYER + 2 * D  # + post LayerNorm


def projector(text_hidden):
    """Gemma3MultiModalProjector: mm_input_projection_weight (vision x text) and an RMSNorm."""
    return D * text_hidden + D


def strip_vision(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != "vision_config"}


def write(tmp_path, config, name):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return path


def gemma3_12b():
    return json.loads((DATA / "gemma-3-12b-it.json").read_text())


def test_gemma3_tower_by_hand():
    assert LAYER == 15_239_504 and SIGLIP == 416_866_032  # (transformers' SiglipVisionModel: the same)
    # Gemma 3 technical report (arXiv 2503.19786) Table 1: a 417M vision encoder in 4B, 12B, 27B
    assert SIGLIP / 417e6 == pytest.approx(1, abs=0.002)
    m = get_model(str(DATA / "gemma-3-12b-it.json"))
    assert m.num_vision_params == SIGLIP + projector(3840) == 421_290_864
    # in the total and the weights, not in what a text token runs through (a dense model: the rest)
    assert m.params_active == m.params_total - m.num_vision_params
    assert m.weight_bytes == m.params_total * 2


def test_gemma3_27b_catalog_counts_its_tower():
    m = MODELS["gemma-3-27b"]
    assert m.num_vision_params == SIGLIP + projector(5376) == 423_060_336
    # Gemma 3 report Table 1 (recalled): 27B: 417M vision + 1,416M embedding + 25,600M non-embedding
    assert m.params_total / (0.417 + 1.416 + 25.600) / 1e9 == pytest.approx(1, abs=0.005)


@pytest.mark.parametrize("name,tp", [("gemma-3-12b-it", 1), ("gemma-3-12b-it", 2),
                                     ("Llama-4-Scout-17B-16E-Instruct", 4),
                                     ("Mistral-Small-3.1-24B-Instruct-2503", 2)])
def test_the_tower_comes_out_of_the_kv_pool(tmp_path, name, tp):
    # vLLM's default --mm-encoder-tp-mode weights shards the tower over TP as the language model:
    # the pool of each GPU is smaller by the tower's bf16 bytes / tp (the one rounding aside)
    config = json.loads((DATA / f"{name}.json").read_text())
    mm = get_model(str(DATA / f"{name}.json"))
    text = get_model(str(write(tmp_path, strip_vision(config), name)))
    assert mm.params_total - text.params_total == mm.num_vision_params > 0 and text.num_vision_params == 0
    kw = {"max_num_batched_tokens": 8192}
    pool_mm = kv_cache_capacity(mm, "h100-80gb", tp, **kw).pool_bytes_per_gpu
    pool_text = kv_cache_capacity(text, "h100-80gb", tp, **kw).pool_bytes_per_gpu
    assert pool_text - pool_mm == pytest.approx(mm.num_vision_params * 2 / tp, abs=1)
    if name.startswith("Llama-4"):
        assert pool_text - pool_mm == LLAMA4_VISION * 2 // 4 == 435_966_208  # 1.74 GB / 4


def test_fp8_checkpoint_keeps_the_tower_in_bf16(tmp_path):
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    config = {**gemma3_12b(), "quantization_config": fp8}
    mm = get_model(str(write(tmp_path, config, "mm")))
    text = get_model(str(write(tmp_path, strip_vision(config), "text")))
    assert mm.quant.method == "fp8" and mm.quantized_params == text.quantized_params
    assert mm.weight_bytes - text.weight_bytes == (SIGLIP + projector(3840)) * 2


def test_pooling_head_is_refused(tmp_path, refused_in_one_line):
    config = gemma3_12b()
    config["vision_config"] = {**config["vision_config"], "vision_use_head": True}
    refused_in_one_line(write(tmp_path, config, "head"), "vision_use_head", "not modelled")


def test_inspect_reports_the_tower():
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / "gemma-3-12b-it.json"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["params_vision"] == 421_290_864
    assert info["params_total"] - info["params_active"] == info["params_vision"]
    table = CliRunner().invoke(app, ["model", "inspect", str(DATA / "gemma-3-12b-it.json")])
    assert "vision tower + projector" in table.output and "0.421 B" in table.output
    text_only = CliRunner().invoke(app, ["model", "inspect", str(DATA / "gemma-3-1b-it.json"), "--json"])
    assert json.loads(text_only.output)["params_vision"] == 0


# Mistral-Small-3.1-24B-Instruct-2503 vision_config (Pixtral): hidden 1024, MLP 4096, 24 layers,
# 14 x 14 patches of 3 channels; spatial_merge_size 2, no projector biases; text hidden 5120
P, PFFN, TEXT = 1024, 4096, 5120
PIXTRAL_BLOCK = 2 * P + 4 * P * P + 3 * P * PFFN       # 2 RMSNorms; q k v o and gate up down, no biases
PIXTRAL = 3 * 14 * 14 * P + P + 24 * PIXTRAL_BLOCK     # patch Conv2d (no bias), ln_pre; no post norm
MISTRAL3_PROJECTOR = P + (4 * P) * P + P * TEXT + TEXT * TEXT  # norm, patch merger, linear_1, linear_2


def test_pixtral_tower_by_hand():
    assert PIXTRAL_BLOCK == 16_779_264 and PIXTRAL == 403_305_472 and MISTRAL3_PROJECTOR == 35_652_608
    m = get_model(str(DATA / "Mistral-Small-3.1-24B-Instruct-2503.json"))
    assert m.num_vision_params == PIXTRAL + MISTRAL3_PROJECTOR == 438_958_080  # the "0.44B" of the docs
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503 (HF page, safetensors): 24.0B params (recalled)
    assert m.params_total == 24_011_361_280 and m.params_total / 24.0e9 == pytest.approx(1, abs=0.005)
    assert m.params_active == m.params_total - m.num_vision_params


def mistral_small():
    return json.loads((DATA / "Mistral-Small-3.1-24B-Instruct-2503.json").read_text())


def test_pixtral_projector_fields(tmp_path):
    base = get_model(str(DATA / "Mistral-Small-3.1-24B-Instruct-2503.json")).num_vision_params
    biased = get_model(str(write(tmp_path, {**mistral_small(), "multimodal_projector_bias": True}, "bias")))
    assert biased.num_vision_params - base == 2 * TEXT  # linear_1's and linear_2's biases
    merge3 = get_model(str(write(tmp_path, {**mistral_small(), "spatial_merge_size": 3}, "merge3")))
    assert merge3.num_vision_params - base == (9 - 4) * P * P  # the merger reads 3 x 3 patches


@pytest.mark.parametrize("top,vision,field,words", [
    ({"vision_feature_layer": -2}, {}, "vision_feature_layer", "only the last layer"),
    ({"vision_feature_layer": [-1, -2]}, {}, "vision_feature_layer", "only the last layer"),
    ({}, {"model_type": "siglip_vision_model"}, "model_type", "'pixtral'"),
    ({}, {"num_attention_heads": 24}, "hidden_size", "not a multiple"),
    ({}, {"num_hidden_layers": None}, "num_hidden_layers", "missing"),
    ({"spatial_merge_size": 0}, {}, "spatial_merge_size", "positive integer"),
])
def test_malformed_pixtral_config_is_one_line(tmp_path, refused_in_one_line, top, vision, field, words):
    config = mistral_small()
    config = {**config, **top, "vision_config": {**config["vision_config"], **vision}}
    refused_in_one_line(write(tmp_path, config, "bad"), field, words)


@pytest.mark.parametrize("merge,bias", [(2, False), (3, True)])
def test_pixtral_counts_equal_transformers_parameters(merge, bias):
    # an independent count of every tensor: transformers' own modules on the meta device
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from pagesim.models import model_from_config

    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512)
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, patch_size=4,
                  image_size=64)
    config = transformers.AutoConfig.for_model("mistral3", text_config=text, vision_config=vision,
                                               spatial_merge_size=merge, multimodal_projector_bias=bias)
    with torch.device("meta"):
        hf = transformers.AutoModelForImageTextToText.from_config(config)
    fields = config.to_dict()
    fields.pop("quantization_config", None)
    spec = model_from_config(fields, "tiny-mistral3")
    assert spec.params_total == sum(p.numel() for p in hf.parameters())  # tied weights once
    towers = (hf.model.vision_tower, hf.model.multi_modal_projector)
    assert spec.num_vision_params == sum(p.numel() for t in towers for p in t.parameters())

"""The vision towers of multimodal checkpoints (pagesim.models.vision): Gemma 3's SigLIP encoder
and projector counted by hand from gemma-3-12b-it's vision_config (tests/models/data), compared
with the Gemma 3 report; what they do to the weights and the KV pool. Llama 4's tower is counted
by hand in test_gpt_oss_llama4.py (LLAMA4_VISION)."""

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
                                     ("Llama-4-Scout-17B-16E-Instruct", 4)])
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

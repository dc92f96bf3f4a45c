"""Qwen's vision-language families (qwen2_5_vl, qwen3_vl, qwen3_vl_moe; families/qwen_vl.py and
pagesim.models.vision): the released config.json files (tests/models/data/) against the published
totals, each vision tower and merger by hand from its layer shapes, the language model against
the text-only checkpoint it shares its shape with, KV bytes per token by hand, mrope taken as
plain rotary, malformed configs refused in one line, and the CLI (inspect, replay).

Where the configs come from (no hub access here): Qwen3-VL-8B-Instruct from a public copy of its
config.json (an Alpamayo port that vendors it, "byte-identical to Qwen/Qwen3-VL-8B-Instruct's");
Qwen3-VL-30B-A3B-Instruct from a public transcription of its config.json (a parser test, "from the
fetched file at commit 1fc78ad", the fields it reads; the token ids and dtype as in the 8B);
Qwen2.5-VL-7B-Instruct laid out as the public dump of Qwen2.5-VL-3B-Instruct's config.json, with
the 7B's shapes from a public module print of it (embedding 152,064 x 3,584, q 3,584, k/v 512, MLP
18,944, merger out 3,584); its max_position_embeddings (128,000) and max_window_layers are
recalled. Qwen2.5-VL-72B-Instruct is recalled: Qwen2.5-72B's shape (hidden 8,192, 80 layers, MLP
29,568, 64 heads, 8 KV heads, vocab 152,064) and a vision intermediate_size of 3,456 (recalled; the
7B's is 3,420; public configs of Qwen2.5-VL-32B and MiMo-VL read here have 3,456).
"""

import json

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import MODELS, get_model
from pagesim.sim.specs import kv_cache_capacity
from tests.models.test_public_configs import BILLION, DATA, TRACE, model

# (file, published total in billions, source); within 0.5 %. "(recalled)": the named page's figure
# as remembered, not re-read here (no internet in this sandbox).
PUBLISHED = [
    ("Qwen2.5-VL-7B-Instruct", 8.29, "Qwen/Qwen2.5-VL-7B-Instruct (HF page, safetensors): 8.29B params (recalled)"),
    ("Qwen2.5-VL-72B-Instruct", 73.4, "Qwen/Qwen2.5-VL-72B-Instruct (HF page, safetensors): 73.4B params (recalled)"),
    ("Qwen3-VL-8B-Instruct", 8.77, "Qwen/Qwen3-VL-8B-Instruct (HF page, safetensors): 8.77B params (recalled)"),
    ("Qwen3-VL-30B-A3B-Instruct", 31.1, "Qwen/Qwen3-VL-30B-A3B-Instruct (HF page, safetensors): 31.1B params (recalled)"),
]
FILES = [name for name, _, _ in PUBLISHED]

# Qwen2.5-VL's ViT (vision_config of the 7B): hidden 1280, MLP 3420, 32 blocks, 3 x 2 x 14 x 14 patches
D, FFN = 1280, 3420
PATCH_3D = 3 * 2 * 14 * 14 * D                        # Conv3d, no bias: 1,505,280


def qwen25_block(ffn):
    return (2 * D                                     # two RMSNorms
            + D * 3 * D + 3 * D + D * D + D           # qkv and proj, with biases
            + 2 * (D * ffn + ffn) + ffn * D + D)      # gate, up, down, with biases


QWEN25_BLOCK = qwen25_block(FFN)


def merger(width, out):
    """The PatchMerger's MLP over 2 x 2 merged patches: width*4 -> width*4 -> out, biases."""
    m = 4 * width
    return m * m + m + m * out + out


def qwen25_tower(ffn, text_hidden):
    return PATCH_3D + 32 * qwen25_block(ffn) + D + merger(D, text_hidden)  # + the merger's RMSNorm (ln_q)


# Qwen3-VL's ViT (the 8B, 30B-A3B): hidden 1152, MLP 4304, 27 blocks, 3 x 2 x 16 x 16 patches
V, VFFN = 1152, 4304
QWEN3_BLOCK = 4 * (V * V + V) + (V * VFFN + VFFN) + (VFFN * V + V) + 2 * 2 * V  # q k v o, fc1 fc2, 2 LayerNorms


def qwen3_tower(text_hidden):
    embed = 3 * 2 * 16 * 16 * V + V + 2304 * V      # Conv3d with bias, 2,304 learned positions
    main = 2 * V + merger(V, text_hidden)           # LayerNorm of the vision width + MLP
    deepstack = 3 * (2 * 4 * V + merger(V, text_hidden))  # blocks 8, 16, 24: LayerNorm of the merged width
    return embed + 27 * QWEN3_BLOCK + main + deepstack


def test_qwen25_vl_tower_by_hand():
    # a public torchinfo dump of Qwen2.5-VL-3B-Instruct (the same ViT, merger out 2,048): Conv3d
    # 1,505,280, each block 19,702,200, the merger's RMSNorm 1,280 and MLP 36,707,328
    assert (PATCH_3D, QWEN25_BLOCK, merger(D, 2048)) == (1_505_280, 19_702_200, 36_707_328)
    m = model("Qwen2.5-VL-7B-Instruct")
    assert m.num_vision_params == qwen25_tower(FFN, 3584) == 676_550_144
    assert model("Qwen2.5-VL-72B-Instruct").num_vision_params == qwen25_tower(3456, 8192) == 704_573_696
    # the language model is Qwen2.5-7B-Instruct's shape (families/qwen2.py): 7.61B, model card
    assert m.params_total - m.num_vision_params == model("Qwen2.5-7B-Instruct").params_total
    assert m.params_active == m.params_total - m.num_vision_params and m.weight_bytes == m.params_total * 2


def test_qwen3_vl_tower_by_hand():
    assert QWEN3_BLOCK == 15_239_504  # the SigLIP layer shape Gemma 3 has too (test_vision.py)
    dense = model("Qwen3-VL-8B-Instruct")
    assert dense.num_vision_params == qwen3_tower(4096) == 576_388_336
    assert dense.params_total - dense.num_vision_params == model("Qwen3-8B").params_total  # Qwen3-8B's shape
    moe = model("Qwen3-VL-30B-A3B-Instruct")
    assert moe.num_vision_params == qwen3_tower(2048) == 538_631_408
    text = MODELS["qwen3-30b-a3b"]  # Qwen3-30B-A3B's shape, 30.53B (docs/models.md)
    assert moe.params_total - moe.num_vision_params == text.params_total
    assert moe.params_active == text.params_active  # the tower is never active


@pytest.mark.parametrize("name,published,source", PUBLISHED)
def test_total_parameters_match_the_published_count(name, published, source):
    assert model(name).params_total / BILLION == pytest.approx(published, rel=0.005), source


@pytest.mark.parametrize("name,layers,kv_heads", [("Qwen2.5-VL-7B-Instruct", 28, 4), ("Qwen2.5-VL-72B-Instruct", 80, 8),
                                                  ("Qwen3-VL-8B-Instruct", 36, 8), ("Qwen3-VL-30B-A3B-Instruct", 48, 4)])
def test_kv_bytes_per_token_by_hand(name, layers, kv_heads):
    m = model(name)
    assert m.kv_bytes_per_token == layers * 2 * kv_heads * 128 * 2  # K and V, head 128, bf16
    assert m.num_sliding_layers == 0  # use_sliding_window false (Qwen2.5-VL); none in Qwen3-VL
    assert m.kv_bytes_per_token == {"Qwen2.5-VL-7B-Instruct": 57_344, "Qwen2.5-VL-72B-Instruct": 327_680,
                                    "Qwen3-VL-8B-Instruct": 147_456, "Qwen3-VL-30B-A3B-Instruct": 98_304}[name]


def config(name):
    return json.loads((DATA / f"{name}.json").read_text())


def write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def text_of(cfg):
    return cfg["text_config"] if "text_config" in cfg else cfg


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("rope", [None, {"type": "mrope", "mrope_section": [16, 24, 24]},
                                  {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}])
def test_mrope_is_plain_rotary(tmp_path, name, rope):
    cfg = config(name)
    text_of(cfg)["rope_scaling"] = rope
    assert get_model(str(write(tmp_path, cfg, f"{name}.json"))) == model(name)
    text_of(cfg).pop("rope_scaling")  # transformers 5 writes rope_parameters
    text_of(cfg)["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
    assert get_model(str(write(tmp_path, cfg, f"{name}.json"))) == model(name)


def test_nested_qwen25_vl_config_is_the_same_model(tmp_path):
    # transformers 5 saves Qwen2.5-VL with its language model under text_config
    cfg = config("Qwen2.5-VL-7B-Instruct")
    keep = {"model_type", "vision_config", "architectures", "tie_word_embeddings"}
    nested = {k: v for k, v in cfg.items() if k in keep}
    nested["text_config"] = {**{k: v for k, v in cfg.items() if k not in keep}, "model_type": "qwen2_5_vl_text"}
    assert get_model(str(write(tmp_path, nested, "Qwen2.5-VL-7B-Instruct.json"))) == model("Qwen2.5-VL-7B-Instruct")


def test_top_level_tie_word_embeddings_wins(tmp_path):
    # Qwen3-VL-2B/4B tie at the top level; the top level wins over text_config (transformers 5's
    # composite model ties as its own config says: Qwen3VLMoeTextConfig defaults to true, the
    # 30B-A3B checkpoint says false at the top level and ships its LM head; test below)
    cfg = config("Qwen3-VL-8B-Instruct")
    tied = get_model(str(write(tmp_path, {**cfg, "tie_word_embeddings": True}, "Qwen3-VL-8B-Instruct.json")))
    assert model("Qwen3-VL-8B-Instruct").params_total - tied.params_total == 151_936 * 4096
    cfg["text_config"]["tie_word_embeddings"] = True
    assert get_model(str(write(tmp_path, cfg, "Qwen3-VL-8B-Instruct.json"))) == model("Qwen3-VL-8B-Instruct")
    del cfg["tie_word_embeddings"]  # silent at the top level: text_config's
    assert get_model(str(write(tmp_path, cfg, "Qwen3-VL-8B-Instruct.json"))) == tied


def vision_without(name, field, **extra):
    cfg = config(name)
    cfg["vision_config"] = {k: v for k, v in cfg["vision_config"].items() if k != field} | extra
    return cfg


@pytest.mark.parametrize("cfg,field,words", [
    (vision_without("Qwen2.5-VL-7B-Instruct", "depth"), "depth", "missing"),
    (vision_without("Qwen3-VL-8B-Instruct", "depth"), "depth", "missing"),
    (vision_without("Qwen3-VL-30B-A3B-Instruct", "num_position_embeddings"), "num_position_embeddings", "missing"),
    (vision_without("Qwen3-VL-8B-Instruct", "deepstack_visual_indexes"), "deepstack_visual_indexes", "missing"),
    (vision_without("Qwen3-VL-8B-Instruct", "", deepstack_visual_indexes=[8, 27]), "deepstack_visual_indexes",
     "0..26"),
    (vision_without("Qwen2.5-VL-7B-Instruct", "", intermediate_size="3420"), "intermediate_size", "positive integer"),
    (vision_without("Qwen2.5-VL-72B-Instruct", "", out_hidden_size=3584), "out_hidden_size", "hidden_size is 8192"),
    ({**config("Qwen2.5-VL-7B-Instruct"), "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}},
     "rope_scaling", "not half the head size (64)"),
    ({**config("Qwen2.5-VL-7B-Instruct"), "rope_scaling": {"type": "3d"}}, "rope_scaling", "rope type '3d'"),
    ({**config("Qwen3-VL-8B-Instruct"), "vision_config": [1152]}, "vision_config", "must be an object"),
    ({**config("Qwen3-VL-8B-Instruct"), "text_config": {**config("Qwen3-VL-8B-Instruct")["text_config"],
                                                        "model_type": "qwen3_vl_moe_text"}}, "model_type", "qwen3_vl_text"),
])
def test_malformed_config_is_one_line(tmp_path, cfg, field, words, refused_in_one_line):
    path = write(tmp_path, cfg)
    refused_in_one_line(path, field, words)
    if field not in ("rope_scaling", "vision_config", "model_type"):  # the message says where the field is
        with pytest.raises(Exception, match=r"\(vision_config\)"):
            get_model(str(path))


def test_the_tower_comes_out_of_the_kv_pool(tmp_path):
    # split over TP as the language model's layers are (docs/calibration.md, "Vision towers")
    cfg = config("Qwen2.5-VL-72B-Instruct")
    text = get_model(str(write(tmp_path, {k: v for k, v in cfg.items() if k != "vision_config"})))
    kw = {"max_num_batched_tokens": 8192}
    pool_mm = kv_cache_capacity(model("Qwen2.5-VL-72B-Instruct"), "h100-80gb", 4, **kw).pool_bytes_per_gpu
    pool_text = kv_cache_capacity(text, "h100-80gb", 4, **kw).pool_bytes_per_gpu
    assert pool_text - pool_mm == pytest.approx(qwen25_tower(3456, 8192) * 2 / 4, abs=1)


@pytest.mark.parametrize("name,vision", [("Qwen2.5-VL-7B-Instruct", 676_550_144),
                                         ("Qwen3-VL-30B-A3B-Instruct", 538_631_408)])
def test_inspect_reports_the_tower(name, vision):
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / f"{name}.json"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["params_vision"] == vision
    assert info["params_total"] == model(name).params_total


# Qwen3-VL's 262,144 positions make the default step budget that many tokens, whose activations
# leave the 30B-A3B's 57.9 GiB of weights no pool on one H100 (as Mistral-Nemo's, test_public_configs.py)
@pytest.mark.parametrize("name,tp,extra", [("Qwen2.5-VL-7B-Instruct", 1, []), ("Qwen3-VL-8B-Instruct", 1, []),
                                           ("Qwen3-VL-30B-A3B-Instruct", 1, ["--max-model-len", "32768"]),
                                           ("Qwen2.5-VL-72B-Instruct", 4, [])])
def test_replay_serves_them(name, tp, extra):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"), "--gpu",
                                      "h100-80gb", "--tp", str(tp), "--num-requests", "200", "--json", *extra])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 200


TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)
VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, temporal_patch_size=2,
              in_channels=3, spatial_merge_size=2, out_hidden_size=64)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[0])


@pytest.mark.parametrize("model_type,text,vision,tie", [
    ("qwen2_5_vl", dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}), dict(VISION), False),
    ("qwen3_vl", dict(TEXT, head_dim=16, rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}),
     dict(VISION, num_position_embeddings=64, deepstack_visual_indexes=[0, 2]), True),
    # (Qwen3VLMoeTextConfig writes tie_word_embeddings true into text_config; the model is untied)
    ("qwen3_vl_moe", dict(TEXT, head_dim=16, **MOE), dict(VISION, num_position_embeddings=16,
                                                           deepstack_visual_indexes=[1]), False),
])
def test_counts_equal_transformers_parameters(model_type, text, vision, tie):
    # an independent count of every tensor: transformers' own modules on the meta device
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.AutoConfig.for_model(model_type, text_config=text, vision_config=vision,
                                               tie_word_embeddings=tie)
    with torch.device("meta"):
        hf = transformers.AutoModelForImageTextToText.from_config(config)
    spec = get_model_from_dict(config.to_dict(), model_type)
    assert spec.params_total == sum(p.numel() for p in hf.parameters())  # tied weights once
    assert spec.num_vision_params == sum(p.numel() for p in hf.model.visual.parameters())


def get_model_from_dict(fields, name):
    from pagesim.models import model_from_config

    fields.pop("quantization_config", None)
    return model_from_config(fields, name)

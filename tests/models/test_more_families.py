"""The second 2026 batch of families: glm4 (GLM-4-0414), cohere (Command R / R+), starcoder2, dbrx,
olmo3, ernie4_5 (dense). Each config (tests/models/data/) against its published total (and DBRX's
active) parameters, every count and KV figure by hand, the counts against transformers' own
modules for a tiny config of each, malformed configs refused in one line, and the CLI on each.

Where the configs come from (no hub access here; a source marked "(recalled)" is the named page's
figure as remembered, not re-read here):
- GLM-4-32B-0414: the shape llama.cpp read from a GLM-Z1-32B-0414 GGUF (the same architecture), in
  the log of ikawrakow/ik_llama.cpp PR #333 (found through the search tool): 61 blocks, embedding
  6,144, feed-forward 23,040, 48 heads, 2 KV heads, key/value length 128, context 32,768, 151,552
  tokens; llama.cpp printed "model params = 32.57 B". q/k/v biases and untied embeddings as
  transformers' Glm4Config builds them (attention_bias true by default).
- GLM-4-9B-0414: transformers' Glm4Config defaults (documented as the glm-4-9b shape: 4,096 hidden,
  13,696 MLP, 40 layers, 32 heads, 2 KV heads of 128, 151,552 tokens); context 32,768 (recalled).
- c4ai-command-r-v01: the fields of a CohereForCausalLM config as a Rust engine's test vendors them
  (8,192 hidden, 64 heads and KV heads, 40 layers, 22,528 MLP, 256,000 tokens, 8,192 positions,
  logit_scale 0.0625, tied). c4ai-command-r-plus: 12,288 hidden, 96 heads over 8 KV heads, 64 layers,
  33,792 MLP, use_qk_norm (recalled).
- starcoder2-3b/7b/15b: the 3B's shape as test fixtures vendor it (3,072 hidden, 30 layers, 12,288
  MLP, 24 heads, 2 KV heads, 49,152 tokens); the 7B's and 15B's shapes, the 16,384 positions, the
  4,096 window and the 15B's untied head (recalled; the StarCoder2 paper, arXiv 2402.19173, Table 2).
- dbrx-instruct: DBRX's shape (recalled: databricks/dbrx-instruct config.json; the DBRX blog: 16
  experts, 4 chosen, 32K context, 132B total, 36B active).
- Olmo-3-1025-7B: 4,096 hidden, 32 heads and KV heads, sliding window 4,096 on three of four layers,
  YaRN factor 8 over 8,192 positions, as a loader's test vendors the released config; 32 layers,
  11,008 MLP, 100,278 tokens (recalled). Olmo-3-1125-32B: 64 layers of 5,120 (a test fixture);
  40 heads over 8 KV heads, 27,648 MLP (recalled).
- ERNIE-4.5-0.3B-PT: the model card's table (18 layers, 16 q / 2 KV heads, 131,072 context) and the
  config's 1,024 hidden, 3,072 MLP, head_dim 128, 103,424 tokens, tied (recalled).
"""

import json

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import model_from_config
from tests.models.test_model_params import hf_model, routed_expert_numel
from tests.models.test_public_configs import BILLION, DATA, TRACE, assert_published_total, model

# (file, published total in billions, source); within 0.5 %
PUBLISHED = [
    ("GLM-4-9B-0414", 9.4, "THUDM/GLM-4-9B-0414 (HF page, safetensors): 9.4B params (recalled)"),
    ("GLM-4-32B-0414", 32.57, "llama.cpp's count of GLM-Z1-32B-0414 (ik_llama.cpp PR #333 log): model params = 32.57 B"),
    ("c4ai-command-r-v01", 35, "CohereForAI/c4ai-command-r-v01 model card: 35 billion parameters (recalled)"),
    ("c4ai-command-r-plus", 104, "CohereForAI/c4ai-command-r-plus model card: 104 billion parameters (recalled)"),
    ("starcoder2-3b", 3.03, "bigcode/starcoder2-3b (HF page, safetensors): 3.03B params (recalled)"),
    ("starcoder2-7b", 7.17, "bigcode/starcoder2-7b (HF page, safetensors): 7.17B params (recalled)"),
    ("starcoder2-15b", 15.96, "bigcode/starcoder2-15b (HF page, safetensors): 15.96B params (recalled; card: 15B)"),
    ("dbrx-instruct", 132, "Databricks, 'Introducing DBRX' (blog, Mar 2024): 132B total parameters (recalled)"),
    ("Olmo-3-1025-7B", 7.30, "allenai/Olmo-3-1025-7B (HF page, safetensors): 7.3B params (recalled)"),
    ("Olmo-3-1125-32B", 32.2, "allenai/Olmo-3-1125-32B (HF page, safetensors): 32.2B params (recalled)"),
    ("ERNIE-4.5-0.3B-PT", 0.36, "baidu/ERNIE-4.5-0.3B-PT model card: 0.36B parameters (recalled)"),
]
FILES = [name for name, _, _ in PUBLISHED]


@pytest.mark.parametrize("name,published,source", PUBLISHED)
def test_total_parameters_match_the_published_count(name, published, source):
    assert_published_total(name, published, source)


def test_dbrx_active_parameters_match_the_published_figure():
    # Databricks' 36B leaves the embedding table out and keeps the LM head (35.85 B; 36.47 B with it)
    m = model("dbrx-instruct")
    active = (m.params_active - m.vocab_size * m.hidden_size) / BILLION
    assert active == pytest.approx(36, rel=0.005), f"{active:.3f}B; DBRX blog: 36B active (recalled)"


def gqa(h, heads, kv, d):
    """q, k, v and o projections, no biases."""
    return h * heads * d * 2 + 2 * h * kv * d


@pytest.mark.parametrize("name,h,layers,heads,ffn", [
    ("GLM-4-9B-0414", 4096, 40, 32, 13696), ("GLM-4-32B-0414", 6144, 61, 48, 23040),
])
def test_glm4_by_hand(name, h, layers, heads, ffn):
    m = model(name)  # 2 KV heads of 128; q/k/v biases, no o bias; four RMSNorms a layer; untied
    layer = gqa(h, heads, 2, 128) + heads * 128 + 2 * 2 * 128 + 3 * h * ffn + 4 * h
    assert m.params_total == layers * layer + 2 * 151552 * h + h


@pytest.mark.parametrize("name,h,layers,heads,kv,ffn,qk_norm", [
    ("c4ai-command-r-v01", 8192, 40, 64, 64, 22528, False), ("c4ai-command-r-plus", 12288, 64, 96, 8, 33792, True),
])
def test_cohere_by_hand(name, h, layers, heads, kv, ffn, qk_norm):
    m = model(name)
    # one LayerNorm weight for the parallel block; R+'s q/k LayerNorms: a weight per head
    layer = gqa(h, heads, kv, 128) + 3 * h * ffn + h + ((heads + kv) * 128 if qk_norm else 0)
    assert m.params_total == layers * layer + 256000 * h + h  # tied
    assert m.qk_norm == qk_norm


@pytest.mark.parametrize("name,h,layers,heads,kv,tied", [
    ("starcoder2-3b", 3072, 30, 24, 2, True), ("starcoder2-7b", 4608, 32, 36, 4, True),
    ("starcoder2-15b", 6144, 40, 48, 4, False),
])
def test_starcoder2_by_hand(name, h, layers, heads, kv, tied):
    m = model(name)  # head 128; MLP 4 x hidden, two matrices (c_fc, c_proj)
    ffn = 4 * h
    biases = heads * 128 + 2 * kv * 128 + h + ffn + h
    layer = gqa(h, heads, kv, 128) + 2 * h * ffn + biases + 2 * 2 * h  # two LayerNorms with bias
    assert m.params_total == layers * layer + (1 if tied else 2) * 49152 * h + 2 * h  # final LayerNorm, bias
    assert (m.ungated_mlp, m.num_sliding_layers, m.sliding_window) == (True, layers, 4096)


def test_dbrx_by_hand():
    m = model("dbrx-instruct")  # 40 layers of 6,144; 48 heads over 8 KV heads of 128; 16 experts of 10,752, top 4
    h, expert = 6144, 3 * 6144 * 10752
    layer = gqa(h, 48, 8, 128) + 2 * h + h * 16 + 16 * expert  # two LayerNorms (no bias), router, experts
    assert m.params_total == 40 * layer + 2 * 100352 * h + h
    assert m.params_active == m.params_total - 40 * (16 - 4) * expert
    assert (m.moe.num_moe_layers, m.moe.num_shared_experts, m.num_dense_layers) == (40, 0, 0)


@pytest.mark.parametrize("name,h,layers,heads,kv,ffn", [
    ("Olmo-3-1025-7B", 4096, 32, 32, 32, 11008), ("Olmo-3-1125-32B", 5120, 64, 40, 8, 27648),
])
def test_olmo3_by_hand(name, h, layers, heads, kv, ffn):
    m = model(name)
    layer = gqa(h, heads, kv, 128) + 3 * h * ffn + 2 * h + (heads + kv) * 128  # post-norms, q/k norms
    assert m.params_total == layers * layer + 2 * 100278 * h + h
    assert (m.num_sliding_layers, m.sliding_window) == (layers * 3 // 4, 4096)  # layer 3 of every 4 global
    assert m.max_model_len == 8 * 8192  # YaRN factor 8 over 8,192 positions
    config = json.loads((DATA / f"{name}.json").read_text())
    del config["layer_types"]  # transformers' default pattern gives the same layers
    assert model_from_config(config, "olmo3").kv_groups == m.kv_groups
    assert model_from_config(config | {"sliding_window": None}, "olmo3").sliding_window == 4096  # Olmo3Config's default


def test_ernie4_5_by_hand():
    m = model("ERNIE-4.5-0.3B-PT")  # 18 layers of 1,024; 16 q heads over 2 KV heads of 128 (q wider than hidden)
    h = 1024
    assert m.params_total == 18 * (gqa(h, 16, 2, 128) + 3 * h * 3072 + 2 * h) + 103424 * h + h  # tied


# (file, layers, KV heads, head size, sliding layers): K and V, bf16
KV = [("GLM-4-9B-0414", 40, 2, 128, 0), ("GLM-4-32B-0414", 61, 2, 128, 0),
      ("c4ai-command-r-v01", 40, 64, 128, 0), ("c4ai-command-r-plus", 64, 8, 128, 0),
      ("starcoder2-3b", 30, 2, 128, 30), ("starcoder2-7b", 32, 4, 128, 32), ("starcoder2-15b", 40, 4, 128, 40),
      ("dbrx-instruct", 40, 8, 128, 0), ("Olmo-3-1025-7B", 32, 32, 128, 24), ("Olmo-3-1125-32B", 64, 8, 128, 48),
      ("ERNIE-4.5-0.3B-PT", 18, 2, 128, 0)]


@pytest.mark.parametrize("name,layers,kv_heads,head_dim,sliding", KV)
def test_kv_bytes_per_token_by_hand(name, layers, kv_heads, head_dim, sliding):
    m = model(name)
    assert m.kv_bytes_per_token == layers * 2 * kv_heads * head_dim * 2
    assert m.kv_bytes_per_token_full_layers == (layers - sliding) * 2 * kv_heads * head_dim * 2
    assert m.num_sliding_layers == sliding


TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)
TINY_CONFIGS = {
    "glm4": dict(TINY, head_dim=32, pad_token_id=0),
    "glm4-nobias-tied": dict(TINY, attention_bias=False, tie_word_embeddings=True, pad_token_id=0),
    "cohere": dict(TINY, use_qk_norm=True, attention_bias=True),
    "starcoder2": dict(TINY, sliding_window=128),
    "starcoder2-nobias-untied": dict(TINY, use_bias=False, tie_word_embeddings=False),
    "dbrx": dict(d_model=64, n_heads=4, n_layers=4, max_seq_len=512, vocab_size=256,
                 attn_config=dict(kv_n_heads=2, clip_qkv=8, rope_theta=10000.0),
                 ffn_config=dict(ffn_hidden_size=48, moe_num_experts=4, moe_top_k=2)),
    "olmo3": dict(TINY, sliding_window=128),
    "ernie4_5": dict(TINY, head_dim=32),
}


@pytest.mark.parametrize("key", sorted(TINY_CONFIGS))
def test_counts_equal_transformers_parameters(key):
    model_type = key.split("-")[0]
    config, hf = hf_model(model_type, dict(TINY_CONFIGS[key]))
    spec = model_from_config(config.to_dict(), key)
    hf_total = sum(p.numel() for p in hf.parameters())  # tied weights once
    assert spec.params_total == hf_total
    if spec.moe is not None:
        experts, k = spec.moe.num_experts, spec.moe.experts_per_token
        routed, idle = routed_expert_numel(hf, (experts, k))
        assert routed == spec.moe.num_moe_layers * experts * spec.expert_params
        assert spec.params_active == hf_total - idle
    else:
        assert spec.params_active == hf_total


def test_tiny_kv_groups_follow_the_configs():
    # starcoder2: the window on every layer (vLLM's model-level window); olmo3: 3 of 4 layers slide
    assert [(g.kind, g.num_layers) for g in model_from_config(
        {"model_type": "starcoder2", **TINY, "sliding_window": 128}, "s").kv_groups] == [("sliding", 4)]
    assert [(g.kind, g.num_layers) for g in model_from_config(
        {"model_type": "starcoder2", **TINY}, "s").kv_groups] == [("full", 4)]
    assert [(g.kind, g.num_layers) for g in model_from_config(
        {"model_type": "olmo3", **TINY, "sliding_window": 128}, "o").kv_groups] == [("full", 1), ("sliding", 3)]


def edited(name, **fields):
    config = json.loads((DATA / f"{name}.json").read_text())
    return {k: v for k, v in (config | fields).items() if v is not ...}


def dbrx_with(section, **fields):
    config = edited("dbrx-instruct")
    config[section] = {k: v for k, v in (config[section] | fields).items() if v is not ...}
    return config


@pytest.mark.parametrize("config,field,words", [
    (edited("GLM-4-9B-0414", intermediate_size=...), "intermediate_size", "missing"),
    (edited("GLM-4-32B-0414", num_key_value_heads=5), "num_key_value_heads", "does not divide"),
    (edited("GLM-4-9B-0414", rope_scaling={"rope_type": "wavelet"}), "rope_scaling", "rope type"),
    (edited("c4ai-command-r-plus", hidden_size=12290), "hidden_size", "not a multiple"),
    (edited("c4ai-command-r-v01", use_qk_norm="yes"), "use_qk_norm", "true or false"),
    (edited("starcoder2-3b", sliding_window="4096"), "sliding_window", "positive integer"),
    (edited("starcoder2-7b", num_hidden_layers=...), "num_hidden_layers", "missing"),
    (dbrx_with("ffn_config", moe_num_experts=...), "ffn_config.moe_num_experts", "missing"),
    (dbrx_with("ffn_config", moe_top_k=17), "ffn_config.moe_top_k", "more than"),
    (dbrx_with("attn_config", kv_n_heads=5), "attn_config.kv_n_heads", "does not divide"),
    (edited("dbrx-instruct", attn_config=[8]), "attn_config", "must be an object"),
    (edited("dbrx-instruct", ffn_config=...), "ffn_config", "is missing"),
    (edited("dbrx-instruct", tie_word_embeddings=True), "tie_word_embeddings", "refuses tied"),
    (edited("dbrx-instruct", d_model=6145), "d_model", "not a multiple"),
    (edited("Olmo-3-1025-7B", layer_types=["sliding_attention"] * 31), "layer_types", "lists 31 layers"),
    (edited("Olmo-3-1125-32B", layer_types=["chunked_attention"] * 64), "layer_types", "unknown kinds"),
    (edited("ERNIE-4.5-0.3B-PT", use_bias=True), "use_bias", "not modelled"),
    (edited("ERNIE-4.5-0.3B-PT", vocab_size=...), "vocab_size", "missing"),
])
def test_malformed_config_is_one_line_naming_file_and_field(tmp_path, config, field, words, refused_in_one_line):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    refused_in_one_line(path, field, words)


# tp to fit an H100's 80 GB: GLM-4-32B's 65 GB, Command R's 70 GB and OLMo 3 32B's 64 GB over 2,
# Command R+'s 208 GB and DBRX's 263 GB over 4
@pytest.mark.parametrize("name,tp", [
    ("GLM-4-9B-0414", 1), ("GLM-4-32B-0414", 2), ("c4ai-command-r-v01", 2), ("c4ai-command-r-plus", 4),
    ("starcoder2-3b", 1), ("starcoder2-7b", 1), ("starcoder2-15b", 1), ("dbrx-instruct", 4),
    ("Olmo-3-1025-7B", 1), ("Olmo-3-1125-32B", 2), ("ERNIE-4.5-0.3B-PT", 1),
])
def test_replay_serves_the_new_families(name, tp):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"), "--gpu",
                                      "h100-80gb", "--tp", str(tp), "--num-requests", "150", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 150


def test_inspect_prints_the_hand_counted_figures():
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / "Olmo-3-1125-32B.json"), "--json", "--tp", "2"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    h = 5120
    assert out["params_total"] == 64 * (gqa(h, 40, 8, 128) + 3 * h * 27648 + 2 * h + 48 * 128) + 2 * 100278 * h + h
    assert [(g["kind"], g["num_layers"], g["sliding_window"]) for g in out["kv_groups"]] == \
        [("full", 16, None), ("sliding", 48, 4096)]
    assert out["kv_bytes_per_token"] == 64 * 2 * 8 * 128 * 2
    assert out["kv_bytes_per_token_per_gpu"] == 64 * 2 * 4 * 128 * 2  # 4 KV heads a GPU
    assert out["kv_bytes_per_token_past_windows"] == 16 * 2 * 8 * 128 * 2

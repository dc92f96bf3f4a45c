"""The families added after the first public-config set (glm4_moe, phimoe, olmoe, granitemoe, olmo2,
gemma, granite, smollm3, mistral3): each released config.json (tests/models/data/) against its
published total and active parameters (source beside each), KV bytes per token by hand, the MTP
layer left out and said so, and the replay CLI on each.

Where the configs come from (no hub access here): GLM-4.5-Air verbatim from a ms-swift model dump
of zai-org/GLM-4.5-Air's config (transformers 4.54.1); GLM-4.5 with the same fields and the flagship's
values (GLM-4.5 report Table 1, slime's glm4.5-355B-A32B script, transformers' Glm4MoeConfig);
Granite 3.1 3B-A800M's shape fields as vendored by a planner's test fixture; the others rebuilt
from the HF repos' config.json fields as transformers' Config classes read them (Phi-3.5-MoE's
longrope short_factor / long_factor lists are left out: they move positions, not shapes).
"""

import json

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from tests.models.test_public_configs import BILLION, DATA, TRACE, model


# (file, published total in billions, source). Totals must agree within 0.5 %. A source marked
# "(recalled)" is the named page's figure as remembered, not re-read here (no internet in this
# sandbox); the others were found through the search tool.
PUBLISHED = [
    ("Phi-3.5-MoE-instruct", 41.9, "microsoft/Phi-3.5-MoE-instruct (HF page, safetensors): 41.9B params"),
    ("OLMoE-1B-7B-0924", 6.92, "allenai/OLMoE-1B-7B-0924 (HF page, safetensors): 6.92B params; OLMoE paper: 6.9B total (recalled)"),
    ("granite-3.1-3b-a800m-instruct", 3.3, "ibm-granite/granite-3.1-3b-a800m model card, architecture table: 3.3B (recalled)"),
    ("OLMo-2-1124-7B", 7.30, "allenai/OLMo-2-1124-7B (HF page, safetensors): 7.3B params (recalled)"),
    # Gemma report (arXiv 2403.08295) Table 2 counts 256,128 embedding rows; the config's 256,000
    ("gemma-7b", 0.786825216 + 7.751248896, "Gemma report Table 2: 7B: 786,825,216 embedding + 7,751,248,896 non-embedding"),
    ("gemma-2b", 0.524550144 + 1.981884416, "Gemma report Table 2: 2B: 524,550,144 embedding + 1,981,884,416 non-embedding"),
    ("granite-3.1-8b-instruct", 8.17, "ibm-granite/granite-3.1-8b-instruct (HF page, safetensors): 8.17B params (recalled)"),
    ("SmolLM3-3B", 3.08, "HF SmolLM3 blog (hf.co/blog/smollm3), training configuration: 3.08B parameters"),
    # with its Pixtral tower and projector (0.44B, test_vision.py); the language model alone is
    # Mistral Small 3 (2501, 23.6B) and is checked below
    ("Mistral-Small-3.1-24B-Instruct-2503", 24.0, "mistralai/Mistral-Small-3.1-24B-Instruct-2503 (HF page, safetensors): 24.0B params (recalled)"),
    # the checkpoint, with its MTP layer (test_glm_mtp_layer_and_the_published_figures)
    ("GLM-4.5", None, "zai-org/GLM-4.5 (HF page, safetensors): 358B params (with the MTP layer)"),
    ("GLM-4.5-Air", None, "zai-org/GLM-4.5-Air model card: 106B total (see the GLM test)"),
    # without the MTP layer (vLLM loads it only for speculative decoding); see test_qwen3_next.py
    ("Qwen3-Next-80B-A3B-Instruct", 80, "Qwen3-Next blog (recalled) and model card (a mirror, read here): 80B total"),
    # published to one digit only ("7B"): 6.94 B is checked by hand and to that digit in test_granitemoehybrid.py
    ("granite-4.0-h-tiny", None, "ibm-granite/granite-4.0-h-tiny model card (a copy, read here): 7B parameters"),
    # by hand in test_nemotron_h.py
    ("NVIDIA-Nemotron-Nano-9B-v2", 8.89, "nvidia/NVIDIA-Nemotron-Nano-9B-v2 (HF page, safetensors): 8.89B params (recalled)"),
    ("Nemotron-H-8B-Base-8K", 8.1, "nvidia/Nemotron-H-8B-Base-8K (HF page, safetensors): 8.1B params (recalled)"),
    # by hand in test_falcon_h1.py
    ("Falcon-H1-7B-Instruct", 7.59, "tiiuae/Falcon-H1-7B-Instruct (HF page, safetensors): 7.59B params (recalled)"),
    ("Falcon-H1-34B-Instruct", 33.6, "tiiuae/Falcon-H1-34B-Instruct (HF page, safetensors): 33.6B params (recalled)"),
    ("AI21-Jamba-Mini-1.6", 51.6, "ai21labs/AI21-Jamba-Mini-1.6 (HF page, safetensors): 51.6B params (recalled)"),
    ("AI21-Jamba-Large-1.6", 398, "ai21labs/AI21-Jamba-Large-1.6 model card: 398B total, 94B active (recalled)"),
]
FILES = [name for name, _, _ in PUBLISHED]


@pytest.mark.parametrize("name,published,source", [p for p in PUBLISHED if p[1] is not None])
def test_total_parameters_match_the_published_count(name, published, source):
    assert model(name).params_total / BILLION == pytest.approx(published, rel=0.005), source


@pytest.mark.parametrize("name,published,excluded,source", [
    ("Phi-3.5-MoE-instruct", 6.6, "nothing", "microsoft/Phi-3.5-MoE-instruct model card: 6.6B active parameters"),
    ("OLMoE-1B-7B-0924", 1.3, "nothing", "OLMoE paper (arXiv 2409.02060), Table 1: 1.3B active (recalled)"),
    ("granite-3.1-3b-a800m-instruct", 0.8, "embedding", "ibm-granite/granite-3.1-3b-a800m model card: 800M active (recalled)"),
    # GLM counts neither the embedding table nor the LM head (33.63 and 13.42 with both)
    ("GLM-4.5", 32, "embedding and head", "GLM-4.5 model card / report Table 1: 32B active"),
    ("GLM-4.5-Air", 12, "embedding and head", "GLM-4.5-Air model card: 12B active"),
])
def test_active_parameters_match_the_published_figure(name, published, excluded, source):
    m = model(name)
    table = m.vocab_size * m.hidden_size
    left_out = {"nothing": 0, "embedding": table, "embedding and head": 2 * table}[excluded]
    active = (m.params_active - left_out) / BILLION
    assert active == pytest.approx(published, rel=0.025), f"{active:.3f}B; {source}"


def glm_moe_layer(h, heads, kv, d, experts, expert_ffn, qk_norm):
    """One GLM-4.5 MoE decoder layer by hand: q/k/v (with biases), o, two norms, q/k norms,
    router (+ score bias), routed and one shared expert (3 matrices each)."""
    attention = h * heads * d + 2 * h * kv * d + heads * d * h + heads * d + 2 * kv * d
    return attention + 2 * h + (2 * d if qk_norm else 0) + h * experts + experts + (experts + 1) * 3 * h * expert_ffn


def test_glm_mtp_layer_and_the_published_figures():
    # GLM-4.5: 92 layers (3 dense of 12,288), 96 q heads, 8 KV heads of 128, 160 experts of 1,536
    glm = model("GLM-4.5")
    h, vocab = 5120, 151552
    dense = 5120 * 96 * 128 * 2 + 2 * 5120 * 8 * 128 + 96 * 128 + 2 * 8 * 128 + 2 * h + 2 * 128 + 3 * h * 12288
    moe = glm_moe_layer(h, 96, 8, 128, 160, 1536, True)
    serving = 3 * dense + 89 * moe + 2 * vocab * h + h
    assert glm.params_total == serving
    # the checkpoint also holds the MTP layer (num_nextn_predict_layers: 1): one more MoE layer,
    # eh_proj (2h -> h), enorm, hnorm and the shared head's norm, and its own embedding and head
    mtp = moe + 2 * h * h + 3 * h + 2 * vocab * h
    assert (serving + mtp) / BILLION == pytest.approx(358, rel=0.005)   # HF page: 358B
    # the card's 355B lies between the serving count (352.8B) and the serving count with the MTP
    # block without its embedding copies (356.8B): a rounded figure neither count reproduces to 0.5 %
    assert serving / BILLION < 355 < (serving + mtp - 2 * vocab * h) / BILLION
    air = model("GLM-4.5-Air")  # 46 layers (1 dense of 10,944), 128 experts of 1,408, no q/k norm
    h = 4096
    dense = h * 96 * 128 * 2 + 2 * h * 8 * 128 + 96 * 128 + 2 * 8 * 128 + 2 * h + 3 * h * 10944
    serving = dense + 45 * glm_moe_layer(h, 96, 8, 128, 128, 1408, False) + 2 * vocab * h + h
    assert air.params_total == serving
    # no published checkpoint total found; the card's 106B is 0.8 % under the serving count
    assert air.params_total / BILLION == pytest.approx(106, rel=0.01)


def test_mistral3_language_model_is_mistral_small_3():
    m = model("Mistral-Small-3.1-24B-Instruct-2503")
    h, layers = 5120, 40
    text = layers * (h * 4096 * 2 + 2 * h * 1024 + 3 * h * 32768 + 2 * h) + 2 * 131072 * h + h
    assert m.params_total - m.num_vision_params == text == m.params_active  # the tower: test_vision.py
    # mistralai/Mistral-Small-24B-Instruct-2501 (the same language model; HF page): 23.6B params (recalled)
    assert text / BILLION == pytest.approx(23.6, rel=0.005)


# (file, layers, KV heads, head size): K and V, bf16, every layer full attention
KV = [
    ("GLM-4.5", 92, 8, 128), ("GLM-4.5-Air", 46, 8, 128),
    ("Phi-3.5-MoE-instruct", 32, 8, 128),          # sliding_window 131,072 = its positions: full
    ("OLMoE-1B-7B-0924", 16, 16, 128), ("granite-3.1-3b-a800m-instruct", 32, 8, 64),
    ("OLMo-2-1124-7B", 32, 32, 128), ("gemma-7b", 28, 16, 256), ("gemma-2b", 18, 1, 256),
    ("granite-3.1-8b-instruct", 40, 8, 128), ("SmolLM3-3B", 36, 4, 128),
    ("Mistral-Small-3.1-24B-Instruct-2503", 40, 8, 128),
]


@pytest.mark.parametrize("name,layers,kv_heads,head_dim", KV)
def test_kv_bytes_per_token_by_hand(name, layers, kv_heads, head_dim):
    m = model(name)
    assert m.kv_bytes_per_token == layers * 2 * kv_heads * head_dim * 2
    assert m.num_sliding_layers == 0


def test_moe_shapes_by_hand():
    glm = model("GLM-4.5")
    assert (glm.moe.num_moe_layers, glm.moe.num_experts, glm.moe.experts_per_token) == (89, 160, 8)
    assert glm.moe.shared_expert_ffn_size == 1536 and glm.ffn_size == 12288  # the 3 dense layers
    phi = model("Phi-3.5-MoE-instruct")
    assert (phi.moe.num_moe_layers, phi.moe.num_experts, phi.moe.experts_per_token, phi.moe.expert_ffn_size) == \
        (32, 16, 2, 6400)
    granite = model("granite-3.1-3b-a800m-instruct")
    assert (granite.moe.num_experts, granite.moe.experts_per_token, granite.moe.expert_ffn_size) == (40, 8, 512)


@pytest.mark.parametrize("name,tp,extra", [
    ("GLM-4.5-Air", 4, []),
    ("GLM-4.5", 16, ["--max-model-len", "32768"]),  # 705 GB of bf16 weights: more than 8 x 80 GB
    ("Phi-3.5-MoE-instruct", 2, ["--max-model-len", "32768"]),
    ("OLMoE-1B-7B-0924", 1, []),
    ("granite-3.1-3b-a800m-instruct", 1, ["--max-model-len", "32768"]),
    ("OLMo-2-1124-7B", 1, []),
    ("gemma-7b", 1, []),
    ("gemma-2b", 1, []),
    ("granite-3.1-8b-instruct", 1, ["--max-model-len", "32768"]),
    ("SmolLM3-3B", 1, []),
    ("Mistral-Small-3.1-24B-Instruct-2503", 1, ["--max-model-len", "32768"]),
])
def test_replay_serves_the_new_families(name, tp, extra):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"),
                                      "--gpu", "h100-80gb", "--tp", str(tp), "--num-requests", "50", "--json", *extra])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 50


def test_inspect_prints_the_hand_counted_figures():
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / "gemma-2b.json"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["params_total"] == 18 * (2048 * 2048 * 2 + 2 * 2048 * 256 + 3 * 2048 * 16384 + 2 * 2048) + 256000 * 2048 + 2048
    assert out["kv_bytes_per_token"] == 18 * 2 * 256 * 2  # one KV head of 256

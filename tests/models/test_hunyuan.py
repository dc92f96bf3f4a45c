"""Tencent Hunyuan (`hunyuan_v1_dense`, `hunyuan_v1_moe`; families/hunyuan.py): the released shapes
(tests/models/data/) counted by hand and against the published totals, KV bytes per token by hand,
tiny configs against transformers' own modules, unmodelled options refused in one line, and the CLI
(inspect, replay of 200 requests).

Where the configs come from (no hub access here): Hunyuan-A13B-Instruct from a public copy of the
original release's config.json (a fork of Tencent's Hunyuan-A13B GitHub repo, models/config.json;
model_type "hunyuan" there, "hunyuan_v1_moe" as the HF repo reads since transformers added the
family: recalled) without its auto_map; its shape agrees with a public test fixture of the HF
config (hidden 4,096, 32 layers, 64 experts, moe_intermediate_size / moe_topk / num_shared_expert
lists of 3,072 / 8 / 1). Hunyuan-7B-Instruct from a public test fixture of its config.json (shape,
max_position_embeddings 262,144, use_qk_norm, use_cla false, rope dynamic alpha 1000) and the
HunyuanImage-2.1 reprompt model's config.json (a hunyuan_v1_dense 7B of the same shape: the token
ids, attention_head_dim, tie_word_embeddings true).
"""

import json

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import get_model, model_from_config
from tests.models.test_public_configs import BILLION, DATA, TRACE, model

# (file, published total in billions, source); within 0.5 %. "(recalled)": not re-read here.
PUBLISHED = [
    ("Hunyuan-A13B-Instruct", 80, "tencent/Hunyuan-A13B-Instruct model card: 80B total, 13B active (recalled; "
                                  "the GitHub README read here: 800亿总参数, 130亿激活参数)"),
    ("Hunyuan-7B-Instruct", 7.5, "tencent/Hunyuan-7B-Instruct (HF page, safetensors): 7.5B params (recalled)"),
]
FILES = [name for name, _, _ in PUBLISHED]

H, VOCAB, LAYERS = 4096, 128167, 32
ATTENTION = H * 32 * 128 + 2 * H * 8 * 128 + 32 * 128 * H + 2 * 128  # q, k, v, o; per-head q/k RMSNorms
EXPERT = 3 * H * 3072                                                 # gate, up, down


def a13b_layer(active_experts):
    return ATTENTION + 2 * H + H * 64 + (1 + active_experts) * EXPERT  # norms, router, shared + routed


def test_a13b_by_hand():
    m = model("Hunyuan-A13B-Instruct")
    total = LAYERS * a13b_layer(64) + VOCAB * H + H  # tied embeddings, final norm
    assert m.params_total == total == 80_393_183_232
    assert m.params_active == LAYERS * a13b_layer(8) + VOCAB * H + H == 12_747_448_320
    # the card's 13B active, to two digits (the embedding counted, as it is tied)
    assert m.params_active / BILLION == pytest.approx(13, rel=0.025)
    moe = m.moe
    assert (moe.num_experts, moe.experts_per_token, moe.expert_ffn_size, moe.num_moe_layers,
            moe.num_shared_experts, moe.shared_expert_ffn_size) == (64, 8, 3072, 32, 1, 3072)
    assert m.max_model_len == 32768  # rope dynamic, factor 1: unscaled


def test_7b_by_hand():
    m = model("Hunyuan-7B-Instruct")
    assert m.params_total == LAYERS * (ATTENTION + 2 * H + 3 * H * 14336) + VOCAB * H + H == 7_504_568_320
    assert m.max_model_len == 262144


@pytest.mark.parametrize("name,published,source", PUBLISHED)
def test_total_parameters_match_the_published_count(name, published, source):
    assert model(name).params_total / BILLION == pytest.approx(published, rel=0.005), source


@pytest.mark.parametrize("name", FILES)
def test_kv_bytes_per_token_by_hand(name):
    m = model(name)
    assert m.kv_bytes_per_token == LAYERS * 2 * 8 * 128 * 2 == 131_072  # K and V, 8 KV heads of 128, bf16
    assert m.num_sliding_layers == 0


def config(name):
    return json.loads((DATA / f"{name}.json").read_text())


def write(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_options_by_hand(tmp_path):
    a13b = config("Hunyuan-A13B-Instruct")
    base = model("Hunyuan-A13B-Instruct").params_total
    assert get_model(str(write(tmp_path, {**a13b, "use_qk_norm": False}))).params_total == base - LAYERS * 2 * 128
    assert get_model(str(write(tmp_path, {**a13b, "use_mixed_mlp_moe": False}))).params_total == base - LAYERS * EXPERT
    two = get_model(str(write(tmp_path, {**a13b, "num_shared_expert": 2})))  # an int: every layer
    assert two.params_total == base + LAYERS * EXPERT and two.moe.shared_expert_ffn_size == 2 * 3072
    dense = config("Hunyuan-7B-Instruct")
    biased = get_model(str(write(tmp_path, {**dense, "attention_bias": True, "mlp_bias": True})))
    assert biased.params_total - model("Hunyuan-7B-Instruct").params_total == \
        LAYERS * (32 * 128 + 2 * 8 * 128 + H + 2 * 14336 + H)
    no_head_dim = {k: v for k, v in dense.items() if k != "head_dim"}  # attention_head_dim (vLLM reads it too)
    assert get_model(str(write(tmp_path, no_head_dim))) == get_model(str(write(tmp_path, dense)))


@pytest.mark.parametrize("name,change,field,words", [
    ("Hunyuan-A13B-Instruct", {"use_cla": True}, "use_cla", "cross-layer attention"),
    ("Hunyuan-7B-Instruct", {"use_cla": True}, "use_cla", "not modelled"),
    ("Hunyuan-A13B-Instruct", {"use_mla": True}, "use_mla", "not modelled"),
    ("Hunyuan-A13B-Instruct", {"moe_topk": [8] * 31 + [4]}, "moe_topk", "differs between layers"),
    ("Hunyuan-A13B-Instruct", {"moe_intermediate_size": [3072] * 16}, "moe_intermediate_size", "one per layer"),
    ("Hunyuan-A13B-Instruct", {"num_experts": [64] * 32}, "num_experts", "is a list"),
    ("Hunyuan-A13B-Instruct", {"moe_layer_num_skipped": 1}, "moe_layer_num_skipped", "not 0"),
    ("Hunyuan-A13B-Instruct", {"moe_topk": 65}, "moe_topk", "more than 'num_experts' 64"),
    ("Hunyuan-7B-Instruct", {"hidden_act": "gelu"}, "hidden_act", "only 'silu'"),
    ("Hunyuan-7B-Instruct", {"rope_scaling": {"type": "ntk-by-parts"}}, "rope_scaling", "rope type"),
])
def test_unmodelled_options_are_refused_in_one_line(tmp_path, refused_in_one_line, name, change, field, words):
    refused_in_one_line(write(tmp_path, {**config(name), **change}), field, words)


@pytest.mark.parametrize("model_type,extra", [
    ("hunyuan_v1_dense", {}),
    ("hunyuan_v1_dense", {"attention_bias": True, "tie_word_embeddings": True}),
    ("hunyuan_v1_moe", {"num_experts": 8, "moe_topk": 2}),
    ("hunyuan_v1_moe", {"num_experts": 8, "moe_topk": [2, 2, 2], "attention_bias": True}),
])
def test_counts_equal_transformers_parameters(model_type, extra):
    # transformers' modules on the meta device: they always build the q/k norms (use_qk_norm true
    # here), one shared MLP of intermediate_size, and experts of intermediate_size (vLLM's
    # moe_intermediate_size and num_shared_expert default to those)
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                            max_position_embeddings=512, use_qk_norm=True, **extra)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
    fields = cfg.to_dict()
    fields.pop("quantization_config", None)
    assert model_from_config(fields, "tiny").params_total == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name,total", [("Hunyuan-A13B-Instruct", 80_393_183_232), ("Hunyuan-7B-Instruct", 7_504_568_320)])
def test_inspect(name, total):
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / f"{name}.json"), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert (info["params_total"], info["kv_bytes_per_token"]) == (total, 131_072)


# A13B: 160.8 GB of bf16 weights; TP 2 leaves no pool (74.9 GiB a GPU), TP 4 does
@pytest.mark.parametrize("name,tp", [("Hunyuan-7B-Instruct", 1), ("Hunyuan-A13B-Instruct", 4)])
def test_replay_serves_them(name, tp):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"), "--gpu",
                                      "h100-80gb", "--tp", str(tp), "--num-requests", "200", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 200

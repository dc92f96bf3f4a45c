"""config.json -> ModelSpec: round trips through a file, the families' layer rules, weight bytes
of quantized checkpoints by hand, and one clear line (file and field) for every malformed config."""

import dataclasses
import itertools
import json
import random

import pytest

from pagesim.models import MODELS, get_model
from pagesim.models.catalog import MODERN_CONFIGS
from pagesim.models.spec import MoESpec


def write(tmp_path, config, name="model"):
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return d / "config.json"


@pytest.mark.parametrize("name", sorted(MODERN_CONFIGS))
def test_config_file_round_trips_to_the_catalog_spec(tmp_path, name):
    spec = get_model(str(write(tmp_path, MODERN_CONFIGS[name], name)))
    assert dataclasses.replace(spec, name=name) == MODELS[name]


def test_gemma3_reads_the_nested_text_config_and_layer_types(tmp_path):
    nested = MODERN_CONFIGS["gemma-3-27b"]
    flat = {**nested["text_config"], "model_type": "gemma3_text"}
    # a text-only config: the language model of the multimodal one, without its vision tower
    g3 = MODELS["gemma-3-27b"]
    text_only = dataclasses.replace(g3, num_params=g3.num_params - g3.num_vision_params, num_vision_params=0)
    assert dataclasses.replace(get_model(str(write(tmp_path, flat))), name="gemma-3-27b") == text_only
    # newer transformers list the kind of every layer; the list wins over the pattern
    types = ["sliding_attention" if i % 3 else "full_attention" for i in range(62)]
    spec = get_model(str(write(tmp_path, {**flat, "layer_types": types}, "typed")))
    assert spec.num_sliding_layers == types.count("sliding_attention") == 41


def test_qwen2_moe_sparse_step_and_dense_layers(tmp_path):
    # Qwen2-MoE rule: layer i is sparse unless listed in mlp_only_layers or (i + 1) % step != 0
    config = {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 12,
              "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 256, "num_experts": 8,
              "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32,
              "decoder_sparse_step": 3, "mlp_only_layers": [2, 5]}
    spec = get_model(str(write(tmp_path, config)))
    sparse = [i for i in range(12) if i not in (2, 5) and (i + 1) % 3 == 0]  # 8, 11
    assert spec.moe.num_moe_layers == len(sparse) == 2 and spec.num_dense_layers == 10
    assert spec.moe.shared_expert_gate and spec.moe.shared_expert_ffn_size == 32


def test_deepseek_dense_first_layers_and_moe_frequency(tmp_path):
    config = {**MODERN_CONFIGS["deepseek-v2-lite"], "first_k_dense_replace": 3, "moe_layer_freq": 2}
    spec = get_model(str(write(tmp_path, config)))
    assert spec.moe.num_moe_layers == len([i for i in range(27) if i >= 3 and i % 2 == 0]) == 12


def test_quantized_weight_bytes_by_hand(tmp_path):
    base = MODERN_CONFIGS["llama-3.1-8b"]
    m = MODELS["llama-3.1-8b"]
    linear = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)  # attention + MLP weights
    rest = m.params_total - linear  # embeddings, LM head, norms stay bf16
    awq = get_model(str(write(tmp_path, {**base, "quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}}, "awq")))
    # 4 bits a weight, and per 128 weights an fp16 scale and a 4-bit zero point
    assert awq.weight_bytes == rest * 2 + round(linear * (0.5 + 2.5 / 128))
    gptq = get_model(str(write(tmp_path, {**base, "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": -1, "sym": True}}, "gptq")))
    assert gptq.weight_bytes == rest * 2 + linear // 2  # per-channel scales: negligible, not counted
    fp8 = get_model(str(write(tmp_path, {**base, "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}, "fp8")))
    assert fp8.weight_bytes == rest * 2 + round(linear * (1 + 4 / 128**2))  # an fp32 scale per block
    assert fp8.quant.fp8_compute and not awq.quant.fp8_compute
    assert awq.params_total == gptq.params_total == fp8.params_total == m.params_total


def test_mixtral_router_stays_unquantized(tmp_path):
    spec = get_model(str(write(tmp_path, {**MODERN_CONFIGS["mixtral-8x7b"], "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic"}})))
    router = 32 * 4096 * 8
    assert spec.quantized_params == spec.linear_params_total - router
    assert spec.weight_bytes == (spec.params_total - spec.quantized_params) * 2 + spec.quantized_params


MIXTRAL = MODERN_CONFIGS["mixtral-8x7b"]


@pytest.mark.parametrize("config,field,words", [
    ({k: v for k, v in MIXTRAL.items() if k != "num_local_experts"}, "num_local_experts", "missing"),
    ({**MIXTRAL, "num_experts_per_tok": 9}, "num_experts_per_tok", "more than"),
    ({k: v for k, v in MODERN_CONFIGS["qwen3-30b-a3b"].items() if k != "num_experts"}, "num_experts", "missing"),
    ({k: v for k, v in MODERN_CONFIGS["deepseek-v3"].items() if k != "n_routed_experts"}, "n_routed_experts", "missing"),
    ({k: v for k, v in MODERN_CONFIGS["deepseek-v3"].items() if k != "kv_lora_rank"}, "kv_lora_rank", "missing"),
    ({**MODERN_CONFIGS["mistral-7b"], "sliding_window": -4096}, "sliding_window", "positive integer"),
    ({**MODERN_CONFIGS["gemma-2-9b"], "sliding_window": None}, "sliding_window", "missing"),
    ({**MODERN_CONFIGS["llama-3.1-8b"], "quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method",
     "unknown quantization method"),
    ({**MODERN_CONFIGS["llama-3.1-8b"], "quantization_config": {"quant_method": "awq", "bits": 3}}, "bits", "4 or 8"),
    ({**MODERN_CONFIGS["llama-3.1-8b"], "rope_scaling": {"rope_type": "wobbly"}}, "rope_scaling", "rope type"),
    ({**MODERN_CONFIGS["qwen3-32b"], "layer_types": ["full_attention"] * 3}, "layer_types", "lists 3 layers"),
    ({**MODERN_CONFIGS["qwen3-32b"], "num_key_value_heads": 7}, "num_key_value_heads", "does not divide"),
    ({**MODERN_CONFIGS["qwen3-30b-a3b"], "mlp_only_layers": list(range(48))}, "mlp_only_layers", "no sparse layer"),
    ({**MODERN_CONFIGS["llama-3.1-8b"], "model_type": "mamba"}, "model_type", "supported"),
])
def test_malformed_config_is_one_line_naming_file_and_field(tmp_path, config, field, words, refused_in_one_line):
    refused_in_one_line(write(tmp_path, config, "bad"), field, words)


def test_bad_config_from_the_cli_exits_2_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    path = write(tmp_path, {k: v for k, v in MIXTRAL.items() if k != "num_local_experts"}, "bad")
    result = CliRunner().invoke(app, ["model", "inspect", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "num_local_experts" in result.output


# ----------------------------------------------------------------- expected distinct experts

@pytest.mark.parametrize("experts,k,tokens", [(4, 1, 3), (5, 2, 3), (6, 3, 2), (4, 2, 4)])
def test_expected_experts_touched_equals_exact_enumeration(experts, k, tokens):
    # every way B tokens can each pick a k-subset of E experts, equally likely
    subsets = list(itertools.combinations(range(experts), k))
    outcomes = list(itertools.product(subsets, repeat=tokens))
    exact = sum(len(set().union(*choice)) for choice in outcomes) / len(outcomes)
    moe = MoESpec(experts, k, 8, 1)
    assert moe.expected_experts_touched(tokens) == pytest.approx(exact, rel=1e-12)


def test_expected_experts_touched_against_monte_carlo():
    rng = random.Random(7)
    moe = MoESpec(128, 8, 768, 48)  # Qwen3-30B-A3B's routing
    for tokens in (1, 4, 32, 256):
        draws = [len({e for _ in range(tokens) for e in rng.sample(range(128), 8)}) for _ in range(2000)]
        mean = sum(draws) / len(draws)
        assert moe.expected_experts_touched(tokens) == pytest.approx(mean, rel=0.01), tokens
    assert moe.expected_experts_touched(1) == 8 and moe.expected_experts_touched(0) == 0

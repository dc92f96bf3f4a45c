"""Published config.json files pagesim was not written against (tests/models/data/, the fields of
each Hugging Face repo's config.json as released): total parameters against the published figure
(source beside each), KV bytes per token by hand, quantized weight bytes by hand, and the CLI on
them (inspect, replay)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core.errors import CannotServe
from pagesim.models import get_model
from pagesim.sim.specs import kv_cache_capacity

DATA = Path(__file__).parent / "data"
TRACE = Path(__file__).parents[2] / "traces" / "sharegpt.json"
BILLION = 1e9


def model(name):
    return get_model(str(DATA / f"{name}.json"))


# (file, published total in billions, source). Totals must agree within 0.5 %.
PUBLISHED = [
    ("Llama-3.3-70B-Instruct", 70.6, "meta-llama/Llama-3.3-70B-Instruct (HF page, safetensors): 70.6B params"),
    ("Llama-3.2-1B", 1.24, "meta-llama/Llama-3.2-1B (HF page, safetensors): 1.24B params"),
    ("Llama-3.2-3B-Instruct", 3.21, "meta-llama/Llama-3.2-3B-Instruct model card, model information table: 3.21B"),
    # Llama 4: Meta's blog "The Llama 4 herd" (Apr 2025) and the model cards count the vision
    # encoder, as pagesim does (test_gpt_oss_llama4.py: LLAMA4_VISION, 0.872B by hand from vision_config)
    ("Llama-4-Scout-17B-16E-Instruct", 109, "Llama 4 blog / model card: Scout 109B total (vision included)"),
    ("Llama-4-Maverick-17B-128E-Instruct", 400, "Llama 4 blog / model card: Maverick 400B total (vision included)"),
    ("Mistral-7B-Instruct-v0.3", 7.25, "mistralai/Mistral-7B-Instruct-v0.3 (HF page, safetensors): 7.25B params"),
    ("Mistral-Nemo-Instruct-2407", 12.2, "mistralai/Mistral-Nemo-Instruct-2407 (HF page, safetensors): 12.2B params"),
    ("Mixtral-8x22B-v0.1", 141, "mistral.ai/news/mixtral-8x22b: 141B parameters, 39B active"),
    ("Mixtral-8x7B-Instruct-v0.1-AWQ", 46.7, "Mixtral paper (Jiang et al. 2024): 46.7B total"),
    ("Qwen2.5-7B-Instruct", 7.61, "Qwen/Qwen2.5-7B-Instruct model card: Number of Parameters 7.61B"),
    ("Qwen2.5-7B-Instruct-AWQ", 7.61, "the same weights as Qwen/Qwen2.5-7B-Instruct: 7.61B"),
    ("Qwen2.5-7B-Instruct-GPTQ-Int4", 7.61, "the same weights as Qwen/Qwen2.5-7B-Instruct: 7.61B"),
    ("Qwen2.5-0.5B-Instruct", 0.494, "Qwen/Qwen2.5-0.5B-Instruct (HF page, safetensors): 494M params"),
    ("Qwen1.5-MoE-A2.7B", 14.3, "Qwen/Qwen1.5-MoE-A2.7B model card: 14.3B parameters in total, 2.7B activated"),
    ("Qwen2-57B-A14B", 57.4, "Qwen/Qwen2-57B-A14B (HF page, safetensors): 57.4B params"),
    ("Qwen3-8B", 8.2, "Qwen/Qwen3-8B model card: Number of Parameters 8.2B"),
    ("Qwen3-8B-FP8", 8.2, "Qwen/Qwen3-8B-FP8 model card: Number of Parameters 8.2B"),
    ("Qwen3-235B-A22B", 235, "Qwen/Qwen3-235B-A22B model card: 235B in total, 22B activated"),
    ("DeepSeek-R1", 671, "deepseek-ai/DeepSeek-R1 model card: 671B total, 37B activated"),
    ("DeepSeek-V2", 236, "DeepSeek-V2 paper (arXiv 2405.04434), abstract: 236B total, 21B activated"),
    # the indexer adds 0.85B to V3's 671.03B; the HF page's 685B (recalled) also counts the MTP module
    ("DeepSeek-V3.2-Exp", 671, "deepseek-ai/DeepSeek-V3.2-Exp: built on V3.1-Terminus, 671B total (recalled)"),
    # "gpt-oss-120b & gpt-oss-20b Model Card" (OpenAI, Aug 2025, arXiv 2508.10925), Table 1
    ("gpt-oss-20b", 20.91, "gpt-oss model card Table 1: gpt-oss-20b 20.91B total (the blog: 21B)"),
    ("gpt-oss-120b", 116.83, "gpt-oss model card Table 1: gpt-oss-120b 116.83B total (the blog: 117B)"),
    ("gemma-2-27b-it", 27.2, "google/gemma-2-27b-it (HF page, safetensors): 27.2B params"),
    # Gemma 3 technical report (arXiv 2503.19786) Table 1: vision encoder, embedding and
    # non-embedding parameters (the 1B model is text only); google/gemma-3-12b-it's HF page: 12.2B
    # params (recalled)
    ("gemma-3-1b-it", 0.302 + 0.698, "Gemma 3 report Table 1: 1B: 302M embedding + 698M non-embedding"),
    ("gemma-3-12b-it", 0.417 + 1.012 + 10.759,
     "Gemma 3 report Table 1: 12B: 417M vision encoder + 1,012M embedding + 10,759M non-embedding"),
    ("Phi-3-medium-4k-instruct", 14.0, "microsoft/Phi-3-medium-4k-instruct model card: 14B parameters"),
    ("Phi-3.5-mini-instruct", 3.82, "microsoft/Phi-3.5-mini-instruct (HF page, safetensors): 3.82B params"),
    ("Meta-Llama-3.1-8B-Instruct-FP8", 8.03, "meta-llama/Llama-3.1-8B model card (HF page): 8.03B params"),
    ("Meta-Llama-3.1-8B-Instruct-quantized.w4a16", 8.03, "meta-llama/Llama-3.1-8B (HF page): 8.03B params"),
]


def test_every_data_file_is_checked():
    from tests.models.test_modern_families import FILES as MODERN  # the families checked there
    from tests.models.test_public_families import FILES
    from tests.models.test_hunyuan import FILES as HUNYUAN_FILES
    from tests.models.test_minimax import FILES as MINIMAX_FILES
    from tests.models.test_qwen_vl import FILES as QWEN_VL_FILES
    from tests.models.test_nemotron3 import FILES as NEMOTRON3_FILES
    from tests.models.test_more_families import FILES as MORE_FILES

    assert sorted(p.stem for p in DATA.glob("*.json")) == sorted([name for name, _, _ in PUBLISHED] + FILES + MODERN
                                                                  + QWEN_VL_FILES + HUNYUAN_FILES + MINIMAX_FILES
                                                                  + NEMOTRON3_FILES + MORE_FILES)


@pytest.mark.parametrize("name,published,source", PUBLISHED)
def test_total_parameters_match_the_published_count(name, published, source):
    assert_published_total(name, published, source)


def assert_published_total(name: str, published: float, source: str) -> None:
    """The config's total parameters within 0.5 % of the published count (in billions)."""
    total = model(name).params_total / BILLION
    assert total == pytest.approx(published, rel=0.005), f"{total:.3f}B; {source}"


@pytest.mark.parametrize("name,published,embedding_counted,source", [
    ("Mixtral-8x22B-v0.1", 39, True, "mistral.ai/news/mixtral-8x22b: 39B active"),
    ("Qwen1.5-MoE-A2.7B", 2.7, True, "Qwen/Qwen1.5-MoE-A2.7B model card: 2.7B activated"),
    ("Qwen2-57B-A14B", 14, True, "Qwen/Qwen2-57B-A14B model card: 14B activated"),
    ("Qwen3-235B-A22B", 22, True, "Qwen/Qwen3-235B-A22B model card: 22B activated"),
    ("DeepSeek-R1", 37, False, "deepseek-ai/DeepSeek-R1 model card: 37B activated"),
    ("DeepSeek-V2", 21, False, "DeepSeek-V2 paper (arXiv 2405.04434), abstract: 21B activated"),
])
def test_active_parameters_match_the_published_figure(name, published, embedding_counted, source):
    # published to two digits; DeepSeek leaves the embedding table out (test_model_params.py)
    m = model(name)
    active = (m.params_active - (0 if embedding_counted else m.vocab_size * m.hidden_size)) / BILLION
    assert active == pytest.approx(published, rel=0.025), f"{active:.3f}B; {source}"


# (file, layers, KV heads, head size, sliding layers, window); MLA files: (latent + rotary key)
FULL_AND_SLIDING = [
    ("Llama-3.3-70B-Instruct", 80, 8, 128, 0, None),
    ("Llama-3.2-1B", 16, 8, 64, 0, None),
    ("Llama-3.2-3B-Instruct", 28, 8, 128, 0, None),
    ("Mistral-7B-Instruct-v0.3", 32, 8, 128, 0, None),       # sliding_window null: full attention
    ("Mistral-Nemo-Instruct-2407", 40, 8, 128, 0, None),     # head_dim 128, not 5120 / 32 = 160
    ("Mixtral-8x22B-v0.1", 56, 8, 128, 0, None),
    ("Qwen2.5-7B-Instruct", 28, 4, 128, 0, None),            # use_sliding_window false
    ("Qwen2.5-0.5B-Instruct", 24, 2, 64, 0, None),
    ("Qwen1.5-MoE-A2.7B", 24, 16, 128, 0, None),
    ("Qwen2-57B-A14B", 28, 4, 128, 0, None),
    ("Qwen3-8B", 36, 8, 128, 0, None),
    ("Qwen3-235B-A22B", 94, 4, 128, 0, None),
    ("gemma-2-27b-it", 46, 16, 128, 23, 4096),               # even layers slide
    ("gemma-3-1b-it", 26, 1, 256, 26 - 4, 512),              # layers 5, 11, 17, 23 global
    ("gemma-3-12b-it", 48, 8, 256, 48 - 8, 1024),            # head_dim from Gemma3TextConfig's default
    ("Phi-3-medium-4k-instruct", 40, 10, 128, 40, 2047),
    ("Phi-3.5-mini-instruct", 32, 32, 96, 0, None),          # window 262,144 >= 131,072 positions
]


@pytest.mark.parametrize("name,layers,kv_heads,head_dim,sliding,window", FULL_AND_SLIDING)
def test_kv_bytes_per_token_by_hand(name, layers, kv_heads, head_dim, sliding, window):
    m = model(name)
    assert m.kv_bytes_per_token == layers * 2 * kv_heads * head_dim * 2  # K and V, bf16, every layer
    assert (m.num_sliding_layers, m.sliding_window) == (sliding, window)
    assert m.kv_bytes_per_token_full_layers == (layers - sliding) * 2 * kv_heads * head_dim * 2


@pytest.mark.parametrize("name,layers", [("DeepSeek-R1", 61), ("DeepSeek-V2", 60)])
def test_mla_kv_bytes_by_hand(name, layers):
    assert model(name).kv_bytes_per_token == (512 + 64) * layers * 2


def test_a_window_past_the_max_length_is_full_attention():
    # Phi-3.5-mini's window (262,144) is longer than its 131,072 positions, so it never drops a
    # token: the same spec as the config without a window (it used to be refused)
    config = json.loads((DATA / "Phi-3.5-mini-instruct.json").read_text())
    windowless = get_model_from(config | {"sliding_window": None})
    assert model("Phi-3.5-mini-instruct").kv_groups == windowless.kv_groups
    assert get_model_from(config | {"sliding_window": 131_072}).num_sliding_layers == 0  # equal: still never drops
    assert get_model_from(config | {"sliding_window": 131_071}).num_sliding_layers == 32


def get_model_from(config):
    from pagesim.models import model_from_config

    return model_from_config(config, "phi-3.5-mini")


def linear_weights_llama_3_1_8b():
    return 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)


def test_compressed_tensors_weight_bytes_by_hand():
    # llm-compressor checkpoints: FP8 per-channel (W8A8) and int4 symmetric groups of 128 (W4A16)
    linear = linear_weights_llama_3_1_8b()
    fp8 = model("Meta-Llama-3.1-8B-Instruct-FP8")
    rest = fp8.params_total - linear  # embedding, LM head, norms stay bf16
    assert fp8.weight_bytes == rest * 2 + linear  # a byte a weight; per-channel scales not counted
    assert fp8.quant.fp8_compute and fp8.quant.bits == 8
    w4 = model("Meta-Llama-3.1-8B-Instruct-quantized.w4a16")
    assert w4.weight_bytes == rest * 2 + round(linear * (0.5 + 2 / 128))  # 4 bits + a bf16 scale per 128
    assert not w4.quant.fp8_compute and w4.quant.group_size == 128


def test_awq_gptq_fp8_checkpoints_by_hand():
    linear = 28 * (3584 * (3584 + 2 * 512) + 3584 * 3584 + 3 * 3584 * 18944)
    base = model("Qwen2.5-7B-Instruct")
    rest = base.params_total - linear
    for name in ("Qwen2.5-7B-Instruct-AWQ", "Qwen2.5-7B-Instruct-GPTQ-Int4"):  # scale and 4-bit zero per 128
        assert model(name).weight_bytes == rest * 2 + round(linear * (0.5 + 2.5 / 128)), name
    q3 = model("Qwen3-8B-FP8")
    linear = 36 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288)
    assert q3.weight_bytes == (q3.params_total - linear) * 2 + round(linear * (1 + 4 / 128**2))


CT = json.loads((DATA / "Meta-Llama-3.1-8B-Instruct-quantized.w4a16.json").read_text())
CT_GROUP = CT["quantization_config"]["config_groups"]["group_0"]


def with_groups(**groups):
    return {**CT, "quantization_config": {**CT["quantization_config"], "config_groups": groups}}


@pytest.mark.parametrize("config,field,words", [
    (with_groups(group_0={**CT_GROUP, "weights": {**CT_GROUP["weights"], "num_bits": 4, "type": "float"}}),
     "num_bits", "only 8-bit float"),
    (with_groups(group_0={**CT_GROUP, "weights": {**CT_GROUP["weights"], "group_size": None}}), "group_size",
     "missing"),
    (with_groups(group_0=CT_GROUP, group_1={**CT_GROUP, "weights": {**CT_GROUP["weights"], "num_bits": 8}}),
     "config_groups", "mixed precision"),
    (with_groups(), "config_groups", "must be an object"),
])
def test_bad_compressed_tensors_config_is_one_line(tmp_path, config, field, words, refused_in_one_line):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    refused_in_one_line(path, field, words)


def test_asymmetric_int_groups_count_their_zero_points(tmp_path):
    weights = {**CT_GROUP["weights"], "symmetric": False, "num_bits": 8}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(with_groups(group_0={**CT_GROUP, "weights": weights})))
    assert get_model(str(path)).quant.bytes_per_weight == 1 + (2 + 1) / 128


def test_tp_must_divide_the_attention_heads():
    # vLLM: "Total number of attention heads (28) must be divisible by tensor parallel size (8)",
    # though 8 GPUs could replicate its 4 KV heads
    m = model("Qwen2.5-7B-Instruct")
    assert m.kv_bytes_per_token_per_gpu(4) == m.kv_bytes_per_token // 4
    with pytest.raises(CannotServe, match="28 attention heads cannot be split over tp=8"):
        m.kv_bytes_per_token_per_gpu(8)
    result = CliRunner().invoke(app, ["model", "inspect", str(DATA / "Qwen2.5-7B-Instruct.json"), "--tp", "8"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "qwen2.5-7b-instruct: 28 attention heads" in result.output  # named by its file, not its folder


def test_the_no_pool_error_points_at_the_step_budget():
    # Mistral-Nemo's 1,024,000 positions make the default step budget that many tokens: its
    # weights fit one H100, the activations of such a step do not
    nemo = model("Mistral-Nemo-Instruct-2407")
    with pytest.raises(CannotServe, match="sized for a step of 1,024,000 tokens: lower --max-model-len"):
        kv_cache_capacity(nemo, "h100-80gb", max_num_batched_tokens=1_024_000)
    with pytest.raises(CannotServe, match="split the model over more GPUs"):
        kv_cache_capacity(model("DeepSeek-R1"), "h100-80gb", tp=2, max_num_batched_tokens=163_840)


@pytest.mark.parametrize("name,tp,extra", [
    ("Mistral-Nemo-Instruct-2407", 1, ["--max-model-len", "32768"]),
    ("Meta-Llama-3.1-8B-Instruct-FP8", 1, []),
    ("Phi-3.5-mini-instruct", 1, ["--max-model-len", "16384"]),
    ("gemma-3-12b-it", 1, ["--max-model-len", "32768"]),  # (131,072 with whole-prompt steps: no room for one)
    ("Qwen1.5-MoE-A2.7B", 2, []),
    ("DeepSeek-V2", 8, []),
])
def test_replay_serves_the_public_configs(name, tp, extra):
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(DATA / f"{name}.json"),
                                      "--gpu", "h100-80gb", "--tp", str(tp), "--num-requests", "40", "--json", *extra])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["completed"] == 40
    if extra:
        assert summary["config"]["max_model_len"] == int(extra[1])

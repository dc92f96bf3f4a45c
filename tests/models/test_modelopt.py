"""NVIDIA Model Optimizer (ModelOpt) checkpoints: weight bytes by hand, the KV cache vLLM gives them,
published sizes, the CLI on them, and one-line errors.

Data: tests/models/data/Llama-3.3-70B-Instruct-FP4/ is nvidia/Llama-3.3-70B-Instruct-FP4 in the older
layout (ModelOpt 0.23): config.json holds no quantization_config and hf_quant_config.json beside it
does. That hf_quant_config.json is as quoted verbatim from the release in a Go test of
sgl-project/ome (pkg/hfutil/modelconfig: "Verbatim hf_quant_config.json from
nvidia/Llama-3.3-70B-Instruct-FP4"): NVFP4, kv_cache_quant_algo FP8, group_size 16, exclude_modules
["lm_head"]. Its config.json is meta-llama/Llama-3.3-70B-Instruct's (tests/models/data/
Llama-3.3-70B-Instruct.json): the FP4 release keeps the base model's shapes; NVIDIA's copy may differ
in fields pagesim does not read (torch_dtype, transformers_version).

The newer layout (ModelOpt 0.31 on) puts the fields in config.json's quantization_config, flat:
quant_method "modelopt", quant_algo, ignore, kv_cache_scheme; the configs built below use exactly
the fields vLLM's ModelOptQuantConfigBase.from_config reads there (vllm/model_executor/layers/
quantization/modelopt.py), on released architectures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import get_model, with_kv_cache_dtype
from pagesim.models.config import ModelConfigError

DATA = Path(__file__).parent / "data"
FP4_DIR = DATA / "Llama-3.3-70B-Instruct-FP4"
TRACE = Path(__file__).parents[2] / "traces" / "sharegpt.json"
NVFP4 = 0.5 + 1 / 16  # E2M1 values packed two a byte, one E4M3 scale byte per 16


def llama_linear(layers, h, kv, ffn):
    """q, k, v, o (heads of 128, kv KV heads) and gate, up, down, over all layers."""
    return layers * (h * (h + 2 * kv * 128) + h * h + 3 * h * ffn)


L70 = llama_linear(80, 8192, 8, 28672)   # 68,451,041,280
L8 = llama_linear(32, 4096, 8, 14336)    # 6,979,321,856
EMB70, EMB8 = 128256 * 8192, 128256 * 4096


def flat(base: str, **quant) -> dict:
    """A released architecture (tests/models/data/<base>.json) with a config.json-style ModelOpt
    quantization_config."""
    config = json.loads((DATA / f"{base}.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "producer": {"name": "modelopt"}, **quant}
    return config


def load(tmp_path, config: dict, hf_quant: dict | None = None):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    if hf_quant is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return get_model(str(path))


def test_the_older_layout_reads_hf_quant_config_beside_config_json():
    m = get_model(str(FP4_DIR))
    q = m.quant
    assert (q.method, q.bits, q.group_size, q.bytes_per_weight, q.fp4_compute, q.fp8_compute) == \
        ("modelopt", 4, 16, 0.5625, True, False)
    assert L70 == 68_451_041_280 and m.quantized_params == L70
    # NVFP4 over the decoder's linear layers; embeddings, lm_head (excluded anyway) and norms in bf16
    norms = 80 * 2 * 8192 + 8192
    assert m.weight_bytes == round(L70 * NVFP4) + (2 * EMB70 + norms) * 2 == 42_709_041_152
    # the model cards' "reduces the number of bits per parameter from 16 to 4, reducing the disk
    # size and GPU memory requirements by approximately 3.5x" (nvidia/Llama-3.1-405B-Instruct-FP4,
    # the same wording as the 70B card): 2 bytes against 0.5625 per quantized weight
    assert 2 / q.bytes_per_weight == pytest.approx(3.56, abs=0.01)
    # the same directory's config.json read as a plain file path gives the same model
    assert get_model(str(FP4_DIR / "config.json")).weight_bytes == m.weight_bytes


def test_kv_cache_quant_algo_fp8_is_an_fp8_cache_under_auto():
    """vLLM resolves --kv-cache-dtype auto to fp8_e4m3 for a ModelOpt checkpoint whose
    kv_cache_quant_algo is FP8 (vllm/utils/torch_utils.py, resolve_kv_cache_dtype_string and
    get_kv_cache_quant_algo_string); an explicit dtype still wins."""
    m = get_model(str(FP4_DIR))
    assert m.kv_bytes_per_token == 2 * 8 * 128 * 80 * 1 == 163_840
    assert with_kv_cache_dtype(m, "auto").kv_bytes_per_token == 163_840
    assert with_kv_cache_dtype(m, "bfloat16").kv_bytes_per_token == 2 * 163_840


def test_config_json_layout_nvfp4_against_the_published_8b_size(tmp_path):
    """nvidia/Llama-3.1-8B-Instruct-NVFP4 (ModelOpt 0.35, so the config.json layout): its files total
    4.98 + 1.05 GB of safetensors (the HF file list, as a third-party deployment digest quotes it;
    recalled, not re-read here). By hand: 6,979,321,856 linear weights at 0.5625 bytes, embedding and
    lm_head in bf16."""
    m = load(tmp_path, flat("Meta-Llama-3.1-8B-Instruct-FP8", quant_algo="NVFP4", ignore=["lm_head"],
                            kv_cache_scheme={"dynamic": False, "num_bits": 8, "type": "float"}))
    assert m.quantized_params == L8 == 6_979_321_856
    norms = 32 * 2 * 4096 + 4096
    assert m.weight_bytes == round(L8 * NVFP4) + (2 * EMB8 + norms) * 2
    assert m.weight_bytes / 1e9 == pytest.approx(4.98 + 1.05, rel=0.01)
    assert m.kv_element_bytes == 1  # kv_cache_scheme: 8-bit floats


def test_w4a16_nvfp4_has_the_same_bytes_and_is_always_weight_only(tmp_path):
    """vLLM's ModelOptNvFp4W4A16LinearMethod: NVFP4 weights, 16-bit activations, the Marlin FP4 GEMM."""
    m = load(tmp_path, flat("Meta-Llama-3.1-8B-Instruct-FP8", quant_algo="W4A16_NVFP4", ignore=["lm_head"]))
    assert (m.quant.bytes_per_weight, m.quant.fp4_compute, m.quant.fp8_compute) == (NVFP4, False, False)
    assert m.kv_element_bytes == 2  # no kv_cache_scheme: the model's dtype
    dynamic = flat("Meta-Llama-3.1-8B-Instruct-FP8", quant_algo="NVFP4",
                   kv_cache_scheme={"dynamic": True, "num_bits": 8, "type": "float"})
    assert load(tmp_path, dynamic).kv_element_bytes == 2  # vLLM maps static 8-bit floats only


def test_fp8_is_w8a8_at_one_byte_and_a_null_kv_algo_keeps_the_cache(tmp_path):
    """nvidia/Llama-3.1-8B-Instruct-FP8's hf_quant_config.json as TensorRT-LLM's benchmarking docs
    quote it (docs/source/performance/perf-benchmarking.md): producer modelopt 0.23.0rc1,
    quant_algo FP8, kv_cache_quant_algo null."""
    config = json.loads((DATA / "Meta-Llama-3.1-8B-Instruct-FP8.json").read_text())
    del config["quantization_config"]
    m = load(tmp_path, config, {"producer": {"name": "modelopt", "version": "0.23.0rc1"},
                                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}})
    assert (m.quant.bytes_per_weight, m.quant.fp8_compute, m.quant.fp4_compute) == (1.0, True, False)
    assert m.weight_bytes == L8 + (2 * EMB8 + 32 * 2 * 4096 + 4096) * 2
    assert m.kv_element_bytes == 2


def test_excluded_attention_by_wildcard_stays_in_bf16(tmp_path):
    """ModelOpt writes fnmatch patterns ("*.self_attn.*"); a plain name matches as a substring
    (vLLM's is_layer_excluded): either keeps every layer's attention in the serving dtype."""
    attn = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096)
    for ignore in (["lm_head", "*.self_attn.*"], ["lm_head", "self_attn"], ["model.layers.*.self_attn*"]):
        m = load(tmp_path, flat("Meta-Llama-3.1-8B-Instruct-FP8", quant_algo="NVFP4", ignore=ignore))
        assert m.quant.kept_mixer_layers == 32, ignore
        assert m.quantized_params == L8 - attn
        assert m.part_weights("mixer") == (2.0, False, False) and m.part_weights("mlp") == (NVFP4, False, True)


def test_router_gates_listed_per_layer_change_nothing(tmp_path):
    """nvidia/Qwen3-235B-A22B-NVFP4's exclude_modules: every MoE router ("model.layers.<i>.mlp.gate",
    94 of them) and lm_head (quoted in the same sgl-project/ome test); vLLM builds routers
    unquantized anyway. By hand: attention and the 128 experts of 94 layers at 0.5625 bytes."""
    base = json.loads((DATA / "Qwen3-235B-A22B.json").read_text())
    gates = sorted(f"model.layers.{i}.mlp.gate" for i in range(94)) + ["lm_head"]
    m = load(tmp_path, base, {"producer": {"name": "modelopt", "version": "0.33.0"},
                              "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                                               "group_size": 16, "exclude_modules": gates}})
    attn = 4096 * (64 * 128 + 2 * 4 * 128) + 64 * 128 * 4096
    experts = 128 * 3 * 4096 * 1536
    assert m.quantized_params == 94 * (attn + experts) == 233_798_893_568
    assert m.quant.kept_mixer_layers == m.quant.kept_mlp_layers == 0


@pytest.mark.parametrize("quant,field,words", [
    ({"quant_algo": "MIXED_PRECISION"}, "quant_algo", "modelled: FP8, NVFP4, W4A16_NVFP4"),
    ({}, "quant_algo", "is None"),
    ({"quant_algo": "NVFP4", "group_size": 32}, "group_size", "one scale per 16 weights"),
    ({"quant_algo": "NVFP4", "group_size": "16"}, "group_size", "must be a positive integer"),
    ({"quant_algo": "NVFP4", "ignore": "lm_head"}, "ignore", "must be a list of module names"),
    ({"quant_algo": "NVFP4", "ignore": ["model.layers.0.self_attn.q_proj"]}, "quantization_config",
     "keeps the attention of 1 of 32 layers unquantized"),
    ({"quant_algo": "NVFP4", "ignore": ["*.mlp.experts.*"]}, "ignore", "keeps routed experts unquantized"),
    ({"quant_algo": "NVFP4", "ignore": ["lm_head", "model.embed_tokens", "mtp.*"]}, "ignore", None),  # nothing kept
])
def test_one_line_errors_name_the_file_and_the_field(tmp_path, quant, field, words):
    config = flat("Meta-Llama-3.1-8B-Instruct-FP8", **quant)
    if words is None:
        assert load(tmp_path, config).quant.kept_mlp_layers == 0
        return
    with pytest.raises(ModelConfigError) as e:
        load(tmp_path, config)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "config.json") in msg and f"'{field}'" in msg and words in msg


def test_errors_in_hf_quant_config_json_name_that_file(tmp_path):
    config = json.loads((FP4_DIR / "config.json").read_text())
    with pytest.raises(ModelConfigError) as e:
        load(tmp_path, config, {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "INT4_AWQ"}})
    msg = str(e.value)
    assert "hf_quant_config.json" in msg and "'quant_algo'" in msg and "\n" not in msg
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="hf_quant_config.json"):
        get_model(str(tmp_path / "config.json"))


def test_a_config_with_its_own_quantization_config_ignores_the_file_beside_it(tmp_path):
    m = load(tmp_path, json.loads((DATA / "Meta-Llama-3.1-8B-Instruct-FP8.json").read_text()),
             {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}})
    assert m.quant.method == "compressed-tensors"


@pytest.mark.parametrize("gpu", ["rtx-pro-6000-96gb", "h100-80gb"])
def test_replay_finishes_every_request(tmp_path, gpu):
    """Native FP4 GEMMs on the Blackwell RTX PRO 6000, Marlin-style weight-only ones on the H100."""
    model = tmp_path / "Llama-3.3-70B-Instruct-FP4"
    shutil.copytree(FP4_DIR, model)
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", str(model), "--gpu", gpu,
                                      "--num-requests", "50", "--max-model-len", "8192", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["completed"] == out["num_requests"] == 50 and out["num_rejected"] == 0

"""DeepSeek-V3.2-Exp (`deepseek_v32`): V3 with DeepSeek Sparse Attention. Parameters, KV bytes and
the sparse attention's cost terms by hand (docs/calibration.md, "Modern models"; the sources of
each figure are in docs/models.md)."""

import json

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core.step import BatchShape
from pagesim.models import ModelConfigError, model_from_config
from pagesim.models.spec import with_kv_cache_dtype
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.roofline import DEFAULT_ROOFLINE_CONSTANTS as C, RooflineCostModel
from tests.models.test_model_params import hf_model
from tests.models.test_public_configs import DATA, TRACE, model

NAME = "DeepSeek-V3.2-Exp"
LAYERS, H, HEADS, VOCAB = 61, 7168, 128, 129280
# the indexer: index_n_heads, index_head_dim, index_topk (config.json)
IX_HEADS, IX_DIM, TOPK = 64, 128, 2048
# vLLM's caches per token per layer: the bf16 latent and rotary key (--kv-cache-dtype auto), or
# fp8_ds_mla (512 fp8 + 4 fp32 scales + 64 bf16), and the indexer's 128 fp8 + one fp32 scale
LATENT_BF16, LATENT_FP8_DS_MLA, INDEXER_KEY = (512 + 64) * 2, 512 + 4 * 4 + 64 * 2, 128 + 4
H200_HBM, H200_FP16, H200_FP8 = 4.8e12, 989.5e12, 1979e12  # pagesim/sim/specs.py (datasheet)


def test_parameters_by_hand():
    attention = (H * 1536 + 1536 * HEADS * (128 + 64)  # q_a, q_b
                 + H * (512 + 64) + 512 * HEADS * (128 + 128)  # kv_a_proj_with_mqa, kv_b
                 + HEADS * 128 * H)  # o_proj
    indexer = 1536 * IX_HEADS * IX_DIM + H * IX_DIM + H * IX_HEADS + 2 * IX_DIM  # wq_b, wk, weights_proj, k_norm
    norms = 2 * H + 1536 + 512  # input and post-attention RMSNorms, q_a_layernorm, kv_a_layernorm
    dense = 3 * H * 18432
    expert = 3 * H * 2048
    moe = H * 256 + 256 + expert + 256 * expert  # router, its e_score_correction_bias, shared, routed
    total = 2 * VOCAB * H + H + LAYERS * (attention + indexer + norms) + 3 * dense + 58 * moe
    assert total == 671_877_944_064
    m = model(NAME)
    assert m.params_total == total
    assert indexer == 13_959_424 and m.params_total - model("DeepSeek-R1").params_total == LAYERS * indexer
    active = total - 58 * (256 - 8) * expert
    assert m.params_active == active
    # vLLM builds weights_proj unquantized (quant_config=None); wq_b and wk are FP8 with the rest
    assert m.quantized_params - model("DeepSeek-R1").quantized_params == LAYERS * (1536 * IX_HEADS * IX_DIM + H * IX_DIM)


def test_counts_equal_transformers_parameters():
    fields = dict(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                  n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                  first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=48, kv_lora_rank=32,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                  index_n_heads=4, index_head_dim=128, index_topk=64)
    config, hf = hf_model("deepseek_v32", fields)
    spec = model_from_config({k: v for k, v in config.to_dict().items() if k != "quantization_config"}, "tiny")
    assert spec.mla.indexer is not None
    assert spec.params_total == sum(p.numel() for p in hf.parameters())


def test_kv_bytes_per_token_by_hand():
    m = model(NAME)
    assert m.kv_bytes_per_token == LAYERS * (LATENT_BF16 + INDEXER_KEY) == 78_324
    assert m.kv_bytes_per_token_per_gpu(8) == 78_324  # the latent and the indexer key whole on every rank
    fp8 = with_kv_cache_dtype(m, "fp8")
    assert LATENT_FP8_DS_MLA == 656
    assert fp8.kv_bytes_per_token == LAYERS * (656 + 132) == 48_068
    # V3 (no indexer): the plain latent, fp8 one byte an element
    assert with_kv_cache_dtype(model("DeepSeek-R1"), "fp8").kv_bytes_per_token == LAYERS * 576


@pytest.mark.parametrize("context", [1000, 10_000])
def test_decode_attention_reads_at_most_topk_latents(context):
    # one sequence at TP 8 on an H200: every layer reads all `context` indexer keys and the latents
    # of min(context, 2048) tokens
    selected = min(context, TOPK)
    nbytes = LAYERS * (INDEXER_KEY * context + LATENT_BF16 * selected)
    assert nbytes == {1000: 78_324_000, 10_000: 224_437_056}[context]
    # the bytes outlast the FLOPs: the indexer's 2 x 64 x 128 FP8 per key, this GPU's 16 heads'
    # 2 x (576 + 512) per latent
    kv_bw, attn, attn_fp8 = H200_HBM * C.kv_read_efficiency, H200_FP16 * C.attention_compute_efficiency, \
        H200_FP8 * C.attention_compute_efficiency
    assert INDEXER_KEY / kv_bw > 2 * IX_HEADS * IX_DIM / attn_fp8
    assert LATENT_BF16 / kv_bw > 2 * 16 * (576 + 512) / attn
    roofline = RooflineCostModel(model(NAME), "h200-141gb", tp=8)
    shape = BatchShape(num_decode_seqs=1, decode_context_tokens=context)
    assert roofline.breakdown(shape)["decode_attention"] == pytest.approx(nbytes / kv_bw, rel=1e-12)
    calibrated = CalibratedCostModel(model(NAME), "h200-141gb", tp=8)
    a = calibrated.calibration.attention
    assert a.decode_s_per_kv_byte * LATENT_BF16 > a.prefill_s_per_flop * 2 * 16 * (576 + 512)
    expected = LAYERS * (a.decode_floor_s + a.decode_s_per_seq) + a.decode_s_per_kv_byte * nbytes
    assert calibrated.decode_attention_seconds(1, context) == pytest.approx(expected, rel=1e-12)
    # and the step prices the same read
    base = calibrated.iteration_time(BatchShape(num_decode_seqs=1))
    assert calibrated.iteration_time(shape) - base == pytest.approx(a.decode_s_per_kv_byte * nbytes, rel=1e-9)


def test_prefill_attends_to_at_most_topk_keys_a_query():
    tokens = 4096
    pairs = tokens * (tokens + 1) // 2
    selected = min(pairs, tokens * TOPK)
    assert (pairs, selected) == (8_390_656, 8_388_608)
    attn, attn_fp8 = H200_FP16 * C.attention_compute_efficiency, H200_FP8 * C.attention_compute_efficiency
    # the indexer over every pair (FP8), the sparse MLA over the selected ones in the latent space
    flops = LAYERS * pairs * 2 * IX_HEADS * IX_DIM / attn_fp8 + LAYERS * selected * 2 * 16 * (576 + 512) / attn
    roofline = RooflineCostModel(model(NAME), "h200-141gb", tp=8)
    shape = BatchShape(num_prefill_tokens=tokens, num_prefill_seqs=1, prefill_attn_pairs=pairs)
    cache_write_read = tokens * 2 * 78_324 / (H200_HBM * C.kv_read_efficiency)
    assert flops > cache_write_read
    assert roofline.breakdown(shape)["prefill_attention"] == pytest.approx(flops, rel=1e-12)


@pytest.mark.parametrize("fields,field,words", [
    ({"index_topk": None}, "index_topk", "missing field"),
    ({"q_lora_rank": None}, "q_lora_rank", "indexer projects its queries"),
    ({"index_head_dim": 96}, "index_head_dim", "not a multiple of 128"),
])
def test_malformed_indexer_is_refused(fields, field, words):
    config = json.loads((DATA / f"{NAME}.json").read_text()) | fields
    with pytest.raises(ModelConfigError, match=field) as e:
        model_from_config(config, "v32")
    assert words in str(e.value)


def test_cli_inspects_and_replays():
    path = str(DATA / f"{NAME}.json")
    result = CliRunner().invoke(app, ["model", "inspect", path, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert (info["params_total"], info["kv_bytes_per_token"]) == (671_877_944_064, 78_324)
    assert info["mla"]["indexer"] == {"num_heads": 64, "head_dim": 128, "topk": 2048}
    result = CliRunner().invoke(app, ["model", "inspect", path, "--tp", "8"])
    assert result.exit_code == 0 and "top 2,048 keys, indexer 64 x 128" in result.output, result.output
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", path, "--gpu", "h200-141gb", "--tp", "8",
                                      "--num-requests", "200", "--max-model-len", "32768", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["completed"] == 200

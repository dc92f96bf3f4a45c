"""Cost terms of modern models (MoE, expert parallelism, MLA, sliding windows, FP8) against hand
computations and against equivalent dense models, in both the calibrated and roofline models."""

import dataclasses
import json
from pathlib import Path

import pytest

from pagesim.models import MODELS
from pagesim.models.spec import MoESpec, with_kv_cache_dtype
from pagesim.sim.cost import make_cost_model
from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.roofline import DEFAULT_ROOFLINE_CONSTANTS as C, RooflineCostModel
from pagesim.sim.specs import get_gpu

ROOT = Path(__file__).resolve().parents[2]


def test_moe_of_one_expert_costs_the_dense_model_plus_its_router_and_routing_kernels():
    dense = MODELS["llama-3.1-8b"]
    moe = dataclasses.replace(dense, moe=MoESpec(1, 1, dense.ffn_size, dense.num_layers))
    a, b = CalibratedCostModel(dense, "h100-80gb"), CalibratedCostModel(moe, "h100-80gb")
    add = a.calibration.elementwise["add"]
    for tokens, block in ((1, 16), (7, 16), (300, 64), (2048, 128)):
        router = a.calibration.gemm.seconds(tokens, dense.hidden_size, 1)  # hidden -> 1 expert
        # top-k softmax (1 fp32 logit in, an int32 id and an fp32 weight out), the align kernel
        # (the id in, the sorted id and up to BM - 1 pads out), moe_sum (1 output in, 1 out, bf16)
        routing = [12 * tokens, 4 * tokens + 4 * (tokens + block - 1), 2 * tokens * dense.hidden_size * 2]
        hand = router + sum(add.floor_s + add.slope * b_ for b_ in routing)
        assert b.tokens_seconds(tokens) - a.tokens_seconds(tokens) == pytest.approx(dense.num_layers * hand, rel=1e-9)


def test_roofline_decode_of_one_token_reads_its_experts_only():
    m, tp = MODELS["mixtral-8x7b"], 2
    h, kv = 4096, 8 * 128
    attention = h * (h + 2 * kv) + h * h
    per_layer = attention + h * 8 + 2 * 3 * h * 14336  # router + the token's 2 of 8 experts
    hand = 32 * per_layer * 2 / tp / (get_gpu("h100-80gb").hbm_bandwidth * C.hbm_efficiency)
    cost = RooflineCostModel(m, "h100-80gb", tp)
    assert cost.breakdown(BatchShape(num_decode_seqs=1, decode_context_tokens=10))["linear"] == pytest.approx(hand)
    # a big batch touches every expert: the weight read tends to all 8
    big = cost.breakdown(BatchShape(num_prefill_tokens=64, num_prefill_seqs=1, prefill_attn_pairs=64 * 65 // 2))
    everything = 32 * (attention + h * 8 + 8 * 3 * h * 14336) * 2 / tp / (get_gpu("h100-80gb").hbm_bandwidth * C.hbm_efficiency)
    assert big["linear"] >= everything * 0.999


def test_layer_groups_spread_tokens_over_experts_by_hand():
    m = MODELS["qwen3-30b-a3b"]  # 128 experts of 768, top 8
    (group,) = layer_groups(m, 10, tp=2)
    up = next(g for g in group.gemms if g.op == "moe_experts_up")
    touched = 128 * (1 - (1 - 8 / 128) ** 10)
    assert up.count == pytest.approx(touched) and up.m == pytest.approx(10 * 8 / touched)
    assert (up.k, up.n) == (2048, 2 * 768 // 2)  # each expert split over TP
    assert group.ep_exchange_bytes == 0
    # expert parallelism over 2 GPUs, data-parallel attention: both ranks' tokens meet the experts
    (ep,) = layer_groups(m, 10, tp=1, ep=2)
    up = next(g for g in ep.gemms if g.op == "moe_experts_up")
    touched = 128 * (1 - (1 - 8 / 128) ** 20) / 2
    assert up.count == pytest.approx(touched) and up.m == pytest.approx(20 * 8 / 2 / touched)
    assert up.n == 2 * 768  # whole experts
    assert ep.ep_exchange_bytes == 20 * 2048 * 2 and ep.ep_ranks == 2


def test_dense_first_layers_are_their_own_group():
    groups = layer_groups(MODELS["deepseek-v3"], 4, tp=8)
    assert [g.num_layers for g in groups] == [3, 58]
    assert {g.op for g in groups[0].gemms} == {"mla_q_a", "mla_q_b", "mla_kv_a", "mla_kv_b", "attn_post_proj",
                                               "mlp_up_proj", "mlp_down_proj"}
    kv_a = next(g for g in groups[1].gemms if g.op == "mla_kv_a")
    assert (kv_a.k, kv_a.n) == (7168, 512 + 64)  # replicated, not split over TP


@pytest.mark.parametrize("cost_model", ["calibrated", "roofline"])
def test_mla_latent_reads_do_not_shrink_with_tp(cost_model):
    def per_ctx(model, tp):
        c = make_cost_model(cost_model, model, "h100-80gb", tp)
        step = lambda ctx: c.iteration_time(BatchShape(num_decode_seqs=1, decode_context_tokens=ctx))  # noqa: E731
        return (step(20_001) - step(1)) / 20_000

    # DeepSeek-V2-Lite's decode is latent-bound on H100: the same bytes on every TP rank
    assert per_ctx("deepseek-v2-lite", 2) == pytest.approx(per_ctx("deepseek-v2-lite", 1), rel=1e-6)
    # a GQA model's KV heads split over TP
    assert per_ctx("llama-3.1-8b", 2) == pytest.approx(per_ctx("llama-3.1-8b", 1) / 2, rel=1e-6)


@pytest.mark.parametrize("cost_model,options", [("calibrated", {}), ("calibrated", {"engine": "vllm-0.19"}),
                                                ("roofline", {})])
def test_sliding_window_reads_at_most_the_window(cost_model, options):
    mistral = MODELS["mistral-7b"]  # every layer slides over 4096 tokens
    full = dataclasses.replace(mistral, sliding_window=None, num_sliding_layers=0)
    s, f = (make_cost_model(cost_model, m, "a100-80gb", **options) for m in (mistral, full))

    def decode(c, n, ctx):
        return c.iteration_time(BatchShape(num_decode_seqs=n, decode_context_tokens=ctx))

    assert decode(s, 4, 4 * 1000) == pytest.approx(decode(f, 4, 4 * 1000), rel=1e-12)  # inside the window
    assert decode(s, 4, 4 * 20_000) == pytest.approx(decode(f, 4, 4 * 4096), rel=1e-12)  # capped
    # Gemma 2: half the layers slide; past the window only the global half grows
    gemma = make_cost_model(cost_model, "gemma-2-9b", "a100-80gb", **options)
    g_full = make_cost_model(cost_model, dataclasses.replace(MODELS["gemma-2-9b"], sliding_window=None,
                                                             num_sliding_layers=0), "a100-80gb", **options)
    grow = decode(gemma, 1, 10_000) - decode(gemma, 1, 6_000)
    assert grow == pytest.approx((decode(g_full, 1, 10_000) - decode(g_full, 1, 6_000)) / 2, rel=1e-9)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "gemma-2-9b", "deepseek-v2-lite", "qwen3-30b-a3b"])
@pytest.mark.parametrize("cost_model,options", [("calibrated", {}), ("calibrated", {"engine": "vllm-0.19"}),
                                                ("roofline", {})])
def test_decode_runs_equal_single_steps(name, cost_model, options):
    c = make_cost_model(cost_model, name, "h100-80gb", 1, **options)
    runs = c.decode_run_durations(8, 8 * 3000, 300)  # crosses Gemma's 4096-token window
    steps = [c.iteration_time(BatchShape(num_decode_seqs=8, decode_context_tokens=8 * 3000 + 8 * i)) for i in range(300)]
    assert runs == steps


def test_fp8_weights_compute_at_the_fp8_rate_where_the_gpu_has_one():
    bf16 = MODELS["llama-3.1-8b"]
    fp8 = dataclasses.replace(bf16, quant=dataclasses.replace(MODELS["deepseek-v3"].quant))
    prefill = BatchShape(num_prefill_tokens=8192, num_prefill_seqs=4, prefill_attn_pairs=4 * 2048 * 2049 // 2)
    h100 = [RooflineCostModel(m, "h100-80gb").breakdown(prefill)["linear"] for m in (bf16, fp8)]
    assert h100[1] == pytest.approx(h100[0] * 989.5 / 1979)  # compute-bound: H100's FP8 is twice FP16
    a100 = [RooflineCostModel(m, "a100-80gb").breakdown(prefill)["linear"] for m in (bf16, fp8)]
    assert a100[1] == pytest.approx(a100[0])  # no FP8 tensor cores: weight-only FP8 computes in FP16
    one = BatchShape(num_decode_seqs=1, decode_context_tokens=100)
    decode = [RooflineCostModel(m, "a100-80gb").breakdown(one)["linear"] for m in (bf16, fp8)]
    assert decode[1] == pytest.approx(decode[0] / 2, rel=0.01)  # memory-bound: half the weight bytes
    cal = [CalibratedCostModel(m, "h100-80gb").tokens_seconds(8192) for m in (bf16, fp8)]
    assert cal[1] < 0.8 * cal[0]


def test_fp8_kv_cache_halves_the_calibrated_context_read():
    base = CalibratedCostModel("llama-3.1-8b", "h100-80gb")
    fp8 = CalibratedCostModel(with_kv_cache_dtype(MODELS["llama-3.1-8b"], "fp8"), "h100-80gb")
    grow = [c.decode_attention_seconds(4, 40_000) - c.decode_attention_seconds(4, 0) for c in (base, fp8)]
    assert grow[1] == pytest.approx(grow[0] / 2)


def test_expert_parallelism_needs_a_moe_and_a_split():
    with pytest.raises(ValueError, match="mixture-of-experts"):
        CalibratedCostModel("llama-3.1-8b", "h100-80gb", ep=2)
    with pytest.raises(ValueError, match="do not split"):
        RooflineCostModel("mixtral-8x7b", "h100-80gb", ep=3)


def test_replay_of_a_moe_config_with_fp8_kv_and_ep(tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                                  "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                                  "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                                  "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960}))
    trace = str(ROOT / "traces" / "sharegpt.json")
    args = ["replay", trace, "--model", str(config), "--gpu", "rtx-pro-6000-96gb", "--num-requests", "30", "--json"]
    runs = {}
    for extra in ([], ["--kv-cache-dtype", "fp8"], ["--ep", "2"]):
        result = CliRunner().invoke(app, args + extra)
        assert result.exit_code == 0, result.output
        runs[" ".join(extra)] = json.loads(result.output)
    assert all(s["num_finished"] == 30 for s in runs.values())
    base, fp8, ep = runs[""], runs["--kv-cache-dtype fp8"], runs["--ep 2"]
    assert fp8["kv_token_slots"] == pytest.approx(2 * base["kv_token_slots"], rel=0.001)
    assert ep["kv_token_slots"] > base["kv_token_slots"]  # half the experts' weights per GPU
    assert ep["cost_model"]["ep"] == 2 and ep["config"]["ep"] == 2
    again = CliRunner().invoke(app, args + ["--ep", "2"])
    assert json.loads(again.output) == ep  # deterministic

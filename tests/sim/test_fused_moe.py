"""The fused-MoE expert term: per-expert padding of the routed rows to the kernel's BLOCK_SIZE_M
(against an exact binomial enumeration and hand values), and the expert GEMMs of Mixtral-8x7B at
TP 2 on H100 against vLLM's published fused_moe kernel times, which an engine profile's GPU-time
scale leaves as priced."""

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

import pagesim.sim.cost.calibrated as calibrated
from pagesim.models import MODELS, load_model_config
from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.engine import EngineCostModel, load_engine_profile
from pagesim.sim.cost.layer_ops import expected_padded_rows, layer_groups, moe_block_m, moe_routing_bytes

ROOT = Path(__file__).resolve().parents[2]
# the real runs' model configs (../shared/data/real_vllm/model_configs, or $PAGESIM_DATA_DIR/...)
MODEL_CONFIGS = Path(os.environ.get("PAGESIM_DATA_DIR", ROOT.parent / "shared" / "data")) / "real_vllm" / "model_configs"


def exact_padded_rows(trials: int, p: float, block: int) -> float:
    def pmf(n: int) -> float:  # in log space: comb(4096, n) overflows a float
        return math.exp(math.lgamma(trials + 1) - math.lgamma(n + 1) - math.lgamma(trials - n + 1)
                        + n * math.log(p) + (trials - n) * math.log1p(-p))
    return sum(pmf(n) * block * -(-n // block) for n in range(trials + 1))


def test_block_m_follows_the_tuned_h100_mixtral_configuration():
    assert [moe_block_m(m) for m in (1, 32, 48, 96, 128, 512, 1024, 4096)] == [16, 16, 32, 32, 64, 64, 128, 128]


def test_padded_rows_by_hand():
    # one token, top-2 of 8: an expert gets it with p = 1/4 and then computes one block of 16 rows
    assert expected_padded_rows(1, 0.25, 16) == pytest.approx(0.25 * 16)
    # two tokens: P(n > 0) = 1 - 0.75^2 = 0.4375; never more than one block
    assert expected_padded_rows(2, 0.25, 16) == pytest.approx(0.4375 * 16)
    # 64 tokens at p = 1/2, block 16: E[ceil(n/16)] = P(n>0) + P(n>16) + P(n>32) + P(n>48)
    assert expected_padded_rows(64, 0.5, 16) == pytest.approx(exact_padded_rows(64, 0.5, 16), rel=1e-9)
    assert expected_padded_rows(0, 0.5, 16) == 0.0
    assert expected_padded_rows(40, 1.0, 16) == 48  # a single expert takes every row: 3 blocks


@pytest.mark.parametrize("trials,p,block", [(128, 0.25, 64), (256, 1 / 16, 64), (500, 0.1, 32), (2048, 0.25, 128),
                                            (4096, 1 / 16, 128), (1116, 1 / 16, 128)])
def test_padded_rows_against_exact_enumeration(trials, p, block):
    # exact tails while the mean is small, a normal approximation above: within 0.5 % either way
    assert expected_padded_rows(trials, p, block) == pytest.approx(exact_padded_rows(trials, p, block), rel=5e-3)


# vLLM PR 24700 (github.com/vllm-project/vllm/pull/24700, H100, benchmarks/kernels/benchmark_moe.py
# --model mistralai/Mixtral-8x7B-Instruct-v0.1 -tp 2, the tuned configuration): fused_moe kernel
# time in us by batch size (both expert GEMMs with the routing, activation and sum kernels)
PUBLISHED_MIXTRAL_TP2_H100_US = {1: 144.03, 2: 229.28, 4: 351.10, 8: 434.98, 16: 471.49, 24: 478.27, 32: 487.35,
                                 48: 487.85, 64: 483.14, 96: 494.42, 128: 491.39, 256: 536.77, 512: 662.33,
                                 1024: 833.72, 1536: 1122.93}


@pytest.mark.skipif(not (MODEL_CONFIGS / "Mixtral-8x7B-v0.1").exists(), reason="shared model configs absent")
def test_mixtral_expert_gemms_against_published_kernel_times():
    model = load_model_config(str(MODEL_CONFIGS / "Mixtral-8x7B-v0.1"))
    kern = CalibratedCostModel(model, "h100-80gb", 2)
    errors = []
    for batch, published in PUBLISHED_MIXTRAL_TP2_H100_US.items():
        experts = [g for g in layer_groups(model, batch, 2)[0].gemms if g.op.startswith("moe_experts")]
        predicted = sum(kern.calibration.gemm_seconds(g, 2, 1.0) for g in experts) * 1e6
        errors.append(predicted / published - 1)
    assert max(abs(e) for e in errors) < 0.15, errors
    assert sum(abs(e) for e in errors) / len(errors) < 0.07, errors


def test_routing_kernels_of_mixtral_by_hand():
    """The three routing kernels vLLM's FusedMoE launches per layer around the expert GEMMs
    (topk_softmax, moe_align_block_size, moe_sum), for Mixtral-8x7B at TP 2 and 128 tokens."""
    m = MODELS["mixtral-8x7b"]
    # top-k softmax: 8 fp32 logits in, 2 int32 ids + 2 fp32 weights out per token
    # align: 256 routed ids in; 256 sorted ids + at most 8 x 63 pads out (BLOCK_SIZE_M 64 at 128 tokens)
    # moe_sum: 2 bf16 expert outputs of 4096 in, one out, per token
    assert moe_routing_bytes(m, 128, 2, 1) == (128 * 48, 4 * 256 + 4 * (256 + 8 * 63), 128 * 3 * 4096 * 2)
    # in an engine's CUDA graph each is one graphed kernel more per MoE layer, its bytes busy time
    with_routing = CalibratedCostModel(m, "h100-80gb", 2)
    add = with_routing.calibration.elementwise["add"]
    busy, floors, kernels, _ = with_routing.token_kernel_split(128)
    stripped = lambda *a: tuple(replace(g, routing_bytes=()) for g in layer_groups(*a))  # noqa: E731
    original, calibrated.layer_groups = calibrated.layer_groups, stripped
    try:
        busy0, floors0, kernels0, _ = with_routing.token_kernel_split(128)
    finally:
        calibrated.layer_groups = original
    assert kernels - kernels0 == 32 * 3
    assert floors - floors0 == pytest.approx(32 * 3 * add.floor_s, rel=1e-12)
    assert busy - busy0 == pytest.approx(32 * add.slope * sum(moe_routing_bytes(m, 128, 2, 1)), rel=1e-12)
    # so a full-graph decode step of 128 sequences pays 96 graph_kernel_s more than without them
    engine = EngineCostModel(m, "h100-80gb", 2, "vllm-0.15", max_num_seqs=128)
    step = BatchShape(num_decode_seqs=128, decode_context_tokens=128 * 1000)
    assert engine.features(step).linear[2] == kernels + 32  # and one attention kernel per layer


def test_engine_takes_the_expert_gemms_without_its_gpu_time_scale():
    """An engine profile's gpu_time_scale corrects the dense measurements to current cuBLAS and
    attention kernels; the fused-MoE expert GEMMs are priced by the curve as checked against the
    Triton kernel's own H100 times (above), so a profile's scale leaves them as they are."""
    m = MODELS["mixtral-8x7b"]
    kern = CalibratedCostModel(m, "h100-80gb", 2)
    cal, g = kern.calibration, kern.calibration.gemm
    # the expert GEMMs of 128 tokens by hand: 256 routed rows over the touched experts, each
    # computing a whole 128-row tile of the curve (more than its padded 64-row block)
    touched = 8 * (1 - 0.75 ** 128)
    rows = 256 / touched
    experts = 0.0
    for k, n in ((4096, 2 * 7168), (7168, 4096)):  # gate+up, down at TP 2
        mem = (k * n * 2 + rows * (k + n) * 2) * g.s_per_byte
        comp = 2 * 128 * k * n * g.s_per_flop
        experts += touched * (mem ** g.sharpness + comp ** g.sharpness) ** (1 / g.sharpness)
    experts *= 32
    # the kernels' busy time, from tokens_seconds (its floors and the 64 all-reduces taken off)
    _, floors, _, _ = kern.token_kernel_split(128)
    busy = kern.tokens_seconds(128) - floors - 64 * cal.all_reduce_seconds(2, 128 * 4096 * 2)
    busy += g.seconds(128, 4096, 32000 // 2) - g.floor_s  # the LM head, outside the layers
    base = load_engine_profile("vllm-0.15")
    step = BatchShape(num_decode_seqs=128, decode_context_tokens=128 * 1800)
    times = [EngineCostModel(m, "h100-80gb", 2, replace(base, params=replace(base.params, gpu_time_scale=s)),
                             max_num_seqs=128).iteration_time(step) for s in (1.0, 0.5)]
    # halving the scale halves every busy second but the experts'
    assert (times[0] - times[1]) / 0.5 == pytest.approx(busy - experts, rel=1e-9)
    assert 5e-3 < experts < busy  # (15.4 ms of the 32 layers' ~17 ms of kernel time)

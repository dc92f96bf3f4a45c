"""W4A4 NVFP4 GEMMs (ModelOpt's NVFP4 checkpoints): FP4 tensor cores where the GPU has them, and
weight-only 4-bit GEMMs elsewhere, as vLLM picks its kernels (vllm/model_executor/kernels/linear:
CUTLASS / FlashInfer NVFP4 GEMMs need cutlass_scaled_mm_supports_fp4, compute capability 100 or
more, i.e. Blackwell: the RTX PRO 6000 is SM120; Hopper and older fall back to Marlin FP4 with
16-bit activations). The FP4 rate: the RTX PRO 6000 Blackwell Server Edition datasheet's 4 PFLOPS
FP4 with sparsity, 2,015.2 TFLOPS dense."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.models import get_model
from pagesim.sim.cost.calibrated import CalibratedCostModel, shipped_calibration
from pagesim.sim.cost.calibration import WEIGHT_ONLY_TILE
from pagesim.sim.cost.layer_ops import Gemm, layer_groups
from pagesim.sim.cost.roofline import DEFAULT_ROOFLINE_CONSTANTS, RooflineCostModel
from pagesim.sim.specs import get_gpu

FP4_MODEL = Path(__file__).parents[1] / "models" / "data" / "Llama-3.3-70B-Instruct-FP4"
NVFP4 = 0.5625
K, N = 8192, 2 * 28672  # Llama-3.3-70B's gate+up projection on one GPU


def test_only_blackwell_has_an_fp4_rate():
    assert get_gpu("rtx-pro-6000-96gb").fp4_flops == pytest.approx(2015.2e12)
    assert get_gpu("rtx-pro-6000-96gb").fp4_flops == 4 * get_gpu("rtx-pro-6000-96gb").fp16_flops
    for name in ("a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "a40-48gb", "l40s-48gb", "rtx-4090-24gb"):
        assert not get_gpu(name).has_fp4, name


def curve_time(curve, m, rows, weight_bytes, flop_scale):
    """The calibrated curve's smooth maximum, by hand: bytes moved against rows x K x N FLOPs."""
    p = curve.sharpness
    mem = (K * N * weight_bytes + m * (K + N) * 2) * curve.s_per_byte
    comp = 2 * rows * K * N * curve.s_per_flop * flop_scale
    return (mem ** p + comp ** p) ** (1 / p)


@pytest.mark.parametrize("m", [8, 1000])
def test_fp4_cores_on_blackwell_weight_only_on_hopper_by_hand(m):
    g = Gemm("mlp_up_proj", m, K, N, weight_bytes=NVFP4, fp4=True)
    # RTX PRO 6000: the curve at a quarter of its FP16 compute time (503.8 / 2,015.2)
    rtx = CalibratedCostModel(get_model(str(FP4_MODEL)), "rtx-pro-6000-96gb")
    curve = rtx.calibration.gemm
    rows = -(-m // curve.tile) * curve.tile
    want = curve.floor_s + curve_time(curve, m, rows, NVFP4, 503.8 / 2015.2)
    got = rtx.calibration.gemm_seconds(g, 2, rtx._fp8_flop_scale, rtx._fp4_flop_scale)
    assert got == pytest.approx(want, rel=1e-12)
    # H100: no FP4 tensor cores, so the weight-only rule (test_weight_only_gemm.py): the fp16 time
    # scaled by the bytes moved, or 16-bit compute over 16-row tiles, whichever is longer
    h100 = CalibratedCostModel(get_model(str(FP4_MODEL)), "h100-80gb")
    curve = h100.calibration.gemm
    moved, fp16_moved = K * N * NVFP4 + m * (K + N) * 2, (K * N + m * (K + N)) * 2
    fp16 = curve_time(curve, m, -(-m // curve.tile) * curve.tile, 2, 1.0)  # the measured bf16 GEMM
    rows16 = -(-m // WEIGHT_ONLY_TILE) * WEIGHT_ONLY_TILE
    want = curve.floor_s + max(fp16 * moved / fp16_moved, 2 * rows16 * K * N * curve.s_per_flop)
    assert h100._fp4_flop_scale == 0.0
    got = h100.calibration.gemm_seconds(g, 2, h100._fp8_flop_scale, h100._fp4_flop_scale)
    assert got == pytest.approx(want, rel=1e-12)


def test_a_large_batch_is_faster_on_fp4_cores_than_weight_only():
    """Prefill-sized (4,096 tokens): compute-bound, so FP4 tensor cores (4x the bf16 rate) beat the
    weight-only kernel's bf16 compute on the same GPU."""
    cal = shipped_calibration("rtx-pro-6000-96gb")
    g = Gemm("mlp_up_proj", 4096, K, N, weight_bytes=NVFP4, fp4=True)
    native, weight_only = cal.gemm_seconds(g, 2, 0.5, 0.25), cal.gemm_seconds(g, 2, 0.5, 0.0)
    assert weight_only / native > 2.5


def test_the_model_flags_its_quantized_gemms_fp4():
    model = get_model(str(FP4_MODEL))
    (group,) = layer_groups(model, 64, 1, 1)
    by_op = {g.op: g for g in group.gemms}
    for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj"):
        assert (by_op[op].weight_bytes, by_op[op].fp4, by_op[op].fp8) == (NVFP4, True, False), op


def test_roofline_linear_compute_at_the_fp4_rate_where_there_is_one():
    model = get_model(str(FP4_MODEL))
    eff = DEFAULT_ROOFLINE_CONSTANTS.matmul_efficiency
    linear = model.quantized_params  # every decoder linear weight (lm_head apart)
    rtx = RooflineCostModel(model, "rtx-pro-6000-96gb")
    assert rtx._linear_s_per_token == pytest.approx(2 * linear / (2015.2e12 * eff), rel=1e-12)
    h100 = RooflineCostModel(model, "h100-80gb")
    assert h100._linear_s_per_token == pytest.approx(2 * linear / (989.5e12 * eff), rel=1e-12)
    hbm = 3350e9 * DEFAULT_ROOFLINE_CONSTANTS.hbm_efficiency
    assert h100._linear_weight_s == pytest.approx(linear * NVFP4 / hbm, rel=1e-12)

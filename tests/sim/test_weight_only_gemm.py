"""Weight-only low-bit GEMMs (4-bit AWQ / GPTQ / W4A16, MXFP4): the measured fp16 curve's time for
the shape scaled by the bytes moved, or the 16-bit compute over 16-row token tiles (vLLM's
mixed-input kernels), whichever is longer; not the fp16 curve's 64/128-row padded compute.

Reference: Frantar, Castro, Chen, Hoefler, Alistarh, "MARLIN: Mixed-Precision Auto-Regressive
Parallel Inference on Large Language Models" (2024): close to the ideal 4x speedup over FP16 for
batches up to 16-32 on large layers, i.e. the 4-bit weight read sets the time there."""

from __future__ import annotations

import pytest

from pagesim.sim.cost.calibrated import shipped_calibration
from pagesim.sim.cost.calibration import WEIGHT_ONLY_TILE
from pagesim.sim.cost.layer_ops import Gemm

AWQ_4BIT = 0.5 + 2.5 / 128  # 4-bit values, a fp16 scale and a 4-bit zero per 128 weights


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-80gb"])
def test_four_bit_weights_are_close_to_four_times_faster_at_small_batches(gpu):
    cal = shipped_calibration(gpu)
    for m in (1, 8, 16):
        fp16 = cal.gemm_seconds(Gemm("mlp_up_proj", m, 8192, 28672), 2, 1.0)
        w4 = cal.gemm_seconds(Gemm("mlp_up_proj", m, 8192, 28672, weight_bytes=AWQ_4BIT), 2, 1.0)
        # the bytes alone give 2 / 0.52 = 3.85 (less with the activations' bytes and the launch floor)
        assert 3.0 <= fp16 / w4 <= 3.85, (m, fp16 / w4)


def test_the_rule_by_hand():
    curve = shipped_calibration("h100-80gb").gemm
    assert WEIGHT_ONLY_TILE == 16 and curve.tile > 16
    p = curve.sharpness

    def fp16_time(m, k, n):  # the measured curve, less its floor
        mem = (k * n + m * (k + n)) * 2 * curve.s_per_byte
        comp = 2 * (-(-m // curve.tile) * curve.tile) * k * n * curve.s_per_flop
        return (mem ** p + comp ** p) ** (1 / p)

    # a small batch: the weight read, scaled from the fp16 time by the bytes moved
    k, n, m = 4096, 14336, 5
    got = curve.grouped_seconds(Gemm("mlp_up_proj", m, k, n, weight_bytes=AWQ_4BIT), 2, 1.0)
    moved, fp16_moved = k * n * AWQ_4BIT + m * (k + n) * 2, (k * n + m * (k + n)) * 2
    assert got == pytest.approx(curve.floor_s + fp16_time(m, k, n) * moved / fp16_moved, rel=1e-12)
    # a large batch: the 16-bit compute over its rows (1,000 -> 1,008 in 16-row tiles)
    m = 1000
    got = curve.grouped_seconds(Gemm("mlp_up_proj", m, k, n, weight_bytes=AWQ_4BIT), 2, 1.0)
    compute = 2 * 1008 * k * n * curve.s_per_flop
    moved, fp16_moved = k * n * AWQ_4BIT + m * (k + n) * 2, (k * n + m * (k + n)) * 2
    assert got == pytest.approx(curve.floor_s + max(compute, fp16_time(m, k, n) * moved / fp16_moved), rel=1e-12)
    # W8A8 FP8 keeps the curve as it is (FP8 tensor-core GEMMs): not a weight-only kernel
    m = 5
    fp8 = curve.grouped_seconds(Gemm("mlp_up_proj", m, k, n, weight_bytes=1, fp8=True), 2, 0.5)
    comp8 = 2 * curve.tile * k * n * curve.s_per_flop * 0.5
    mem8 = (k * n * 1 + m * (k + n) * 2) * curve.s_per_byte
    assert fp8 == pytest.approx(curve.floor_s + (mem8 ** p + comp8 ** p) ** (1 / p), rel=1e-12)

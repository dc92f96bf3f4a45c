"""Weight-only low-bit GEMMs (4-bit AWQ / GPTQ / W4A16, MXFP4) are priced at vLLM's mixed-input
kernels' 16-row token tile, not at the measured fp16 curve's 64/128-row tile.

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
        # the bytes alone give 2 / 0.52 = 3.85; the fp16 curve's smooth maximum of memory and
        # (tile-padded) compute, as measured, lifts its one-row time a little above that
        assert 3.0 <= fp16 / w4 <= 4.5, (m, fp16 / w4)


def test_rows_computed_by_hand():
    curve = shipped_calibration("h100-80gb").gemm
    assert WEIGHT_ONLY_TILE == 16 and curve.tile > 16
    k, n, m = 4096, 14336, 5
    got = curve.grouped_seconds(Gemm("mlp_up_proj", m, k, n, weight_bytes=AWQ_4BIT), 2, 1.0)
    mem = (k * n * AWQ_4BIT + m * (k + n) * 2) * curve.s_per_byte
    comp = 2 * 16 * k * n * curve.s_per_flop  # 5 rows computed as one 16-row tile
    p = curve.sharpness
    assert got == pytest.approx(curve.floor_s + (mem ** p + comp ** p) ** (1 / p), rel=1e-12)
    # W8A8 FP8 keeps the curve's tile (FP8 tensor-core GEMMs): not a weight-only kernel
    fp8 = curve.grouped_seconds(Gemm("mlp_up_proj", m, k, n, weight_bytes=1, fp8=True), 2, 0.5)
    comp8 = 2 * curve.tile * k * n * curve.s_per_flop * 0.5
    mem8 = (k * n * 1 + m * (k + n) * 2) * curve.s_per_byte
    assert fp8 == pytest.approx(curve.floor_s + (mem8 ** p + comp8 ** p) ** (1 / p), rel=1e-12)

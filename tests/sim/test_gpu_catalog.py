"""The GPUs the real runs used (issue 23, item 5): datasheet figures, FP8 rates, PCIe-only links,
and calibrated terms scaled from the nearest measured GPU, flagged as scaled."""

import math

import pytest

from pagesim.sim.cost.calibrated import CalibratedCostModel, nearest_measured_gpu, shipped_calibration
from pagesim.sim.specs import GB, GiB, TB, get_gpu


@pytest.mark.parametrize("name,memory_gib,bandwidth_gbs,fp16_tflops,fp8_tflops", [
    ("l40s-48gb", 48, 864, 362.05, 733),              # NVIDIA L40S datasheet (dense)
    ("rtx-pro-6000-96gb", 96, 1597, 503.8, 1007.6),   # RTX PRO 6000 Blackwell Server Edition
    ("rtx-4090-24gb", 24, 1008, 165.2, 330.3),        # Ada architecture whitepaper, FP32 accumulate
    ("h100-80gb", 80, 3350, 989.5, 1979),             # H100 SXM datasheet: 1,979 / 3,958 with sparsity
    ("h200-141gb", 141, 4800, 989.5, 1979),
])
def test_datasheet_figures(name, memory_gib, bandwidth_gbs, fp16_tflops, fp8_tflops):
    g = get_gpu(name)
    assert (g.memory_bytes, g.hbm_bandwidth, g.fp16_flops, g.fp8_flops) == \
        (memory_gib * GiB, bandwidth_gbs * GB, fp16_tflops * TB, fp8_tflops * TB)
    assert g.has_fp8


@pytest.mark.parametrize("name", ["a100-40gb", "a100-80gb", "a40-48gb"])
def test_ampere_has_no_fp8_tensor_cores(name):
    assert get_gpu(name).fp8_flops == 0 and not get_gpu(name).has_fp8


@pytest.mark.parametrize("name", ["l40s-48gb", "rtx-pro-6000-96gb", "rtx-4090-24gb"])
def test_pcie_only_gpus_talk_over_pcie(name):
    g = get_gpu(name)
    assert g.interconnect_bandwidth == g.pcie_bandwidth


@pytest.mark.parametrize("name,measured", [("l40s-48gb", "a100-80gb"), ("rtx-pro-6000-96gb", "a100-80gb"),
                                           ("rtx-4090-24gb", "a40-48gb")])
def test_unmeasured_gpus_are_scaled_from_the_nearest_measured_one(name, measured):
    target, base = get_gpu(name), get_gpu(measured)
    assert nearest_measured_gpu(target).name == measured
    # nearest in (log FP16 FLOP/s, log bandwidth) among the three measured GPUs, by hand
    def distance(m):
        return math.hypot(math.log(m.fp16_flops / target.fp16_flops), math.log(m.hbm_bandwidth / target.hbm_bandwidth))
    assert min(("a100-80gb", "h100-80gb", "a40-48gb"), key=lambda n: distance(get_gpu(n))) == measured
    cal = shipped_calibration(target)
    assert cal.source["scaled_from"] == measured
    assert cal.source["hbm_bandwidth_ratio"] == pytest.approx(base.hbm_bandwidth / target.hbm_bandwidth)
    assert cal.source["interconnect_ratio"] == pytest.approx(base.interconnect_bandwidth / target.interconnect_bandwidth)
    assert CalibratedCostModel("llama-3.1-8b", name).describe()["calibration_source"]["scaled_from"] == measured


def test_aliases():
    assert get_gpu("L40S").name == "l40s-48gb" and get_gpu("rtx-pro-6000").name == "rtx-pro-6000-96gb"
    assert get_gpu("rtx4090").name == "rtx-4090-24gb"

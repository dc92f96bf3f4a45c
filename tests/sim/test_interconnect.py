"""The GPU catalog's interconnect: vLLM's rule for when its custom all-reduce runs, NCCL's ring
over a PCIe link, and both in an engine step, against times written out by hand."""

from dataclasses import replace

import pytest

from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibrated import ring_all_reduce_line, shipped_calibration
from pagesim.sim.cost.engine import EngineCostModel
from pagesim.sim.specs import PCIE_HOST_STAGED, Interconnect, ModelSpec, get_gpu

MiB = 2**20
# Qwen3-32B's shape where it matters here: 64 layers, hidden 5120, bf16 (2 all-reduces a layer)
MODEL = ModelSpec("qwen3-32b-like", 64, 5120, 64, 8, 128, 25600, 151936, 40960, 32_000_000_000,
                  architecture="llama")


@pytest.mark.parametrize("gpu,tp,custom", [("h100-80gb", 2, True), ("h100-80gb", 8, True),
                                           ("l40s-48gb", 2, True), ("l40s-48gb", 4, False),
                                           ("rtx-pro-6000-96gb", 2, False), ("rtx-4090-24gb", 2, False)])
def test_custom_allreduce_needs_nvlink_or_two_gpus_with_p2p(gpu, tp, custom):
    # vLLM custom_all_reduce.py: disabled for > 2 GPUs without full NVLink, and without P2P
    assert get_gpu(gpu).custom_allreduce(tp) is custom


def test_host_staged_pcie_is_the_measured_machines_description():
    g = get_gpu("rtx-pro-6000-96gb")
    assert g.link == PCIE_HOST_STAGED and g.link.kind == "pcie" and not g.link.p2p
    assert g.collective_bandwidth == 16e9 and g.link.latency_s == 20e-6
    assert g.interconnect_bandwidth == 64e9  # the datasheet link stays as it is
    assert get_gpu("h100-80gb").collective_bandwidth == get_gpu("h100-80gb").interconnect_bandwidth


def test_ring_all_reduce_by_hand():
    g = get_gpu("rtx-pro-6000-96gb")
    # 2 GPUs, 1 MiB: 2 steps of 20 us + 2 (1/2) x 1 MiB over 16 GB/s = 40 + 65.536 us
    assert ring_all_reduce_line(g, 2).seconds(MiB) == pytest.approx(40e-6 + 65.536e-6, rel=1e-12)
    # 4 GPUs: 6 steps (120 us) + 1.5 MiB over 16 GB/s (98.304 us)
    assert ring_all_reduce_line(g, 4).seconds(MiB) == pytest.approx(120e-6 + 98.304e-6, rel=1e-12)
    # the scaled calibration prices NCCL on this GPU with it (its measured lines are NVLink's)
    cal = shipped_calibration(g)
    assert cal.all_reduce_seconds(2, MiB) == pytest.approx(105.536e-6, rel=1e-12)
    assert cal.source["all_reduce"] == "pcie ring"
    nvlink = shipped_calibration("h100-80gb")
    assert nvlink.all_reduce_seconds(2, MiB) < cal.all_reduce_seconds(2, MiB) / 3


def engine_step(link: Interconnect, seqs: int) -> tuple[float, float]:
    gpu = replace(get_gpu("rtx-pro-6000-96gb"), link=link)
    m = EngineCostModel(MODEL, gpu, 2, engine="vllm-0.19", max_num_seqs=128)
    f = m.features(BatchShape(num_decode_seqs=seqs, decode_context_tokens=seqs * 500))
    return f.fixed, f.linear[3]


def test_engine_prices_every_allreduce_of_a_pcie_step_as_nccl_on_the_link():
    # 64 sequences (a captured size: no padding); 128 all-reduces of 64 x 5120 x 2 = 655,360 bytes
    fixed, custom_calls = engine_step(PCIE_HOST_STAGED, 64)
    assert custom_calls == 0  # no custom all-reduce (no P2P), so the fitted NVLink latency is unused
    no_latency, _ = engine_step(replace(PCIE_HOST_STAGED, latency_s=0.0), 64)
    assert fixed - no_latency == pytest.approx(128 * 2 * 20e-6, rel=1e-9)  # 5.12 ms
    double_bw, _ = engine_step(replace(PCIE_HOST_STAGED, bandwidth=32e9), 64)
    assert fixed - double_bw == pytest.approx(128 * 655_360 * (1 / 16e9 - 1 / 32e9), rel=1e-9)  # 2.62 ms
    # with P2P the 2 GPUs run the custom all-reduce: the fitted latency per call, bytes over the link
    p2p_fixed, p2p_calls = engine_step(replace(PCIE_HOST_STAGED, p2p=True), 64)
    assert p2p_calls == 128
    # both move 1 x bytes per call over 16 GB/s (ring volume 2 (n - 1) / n = 1): the same fixed part
    assert p2p_fixed == pytest.approx(no_latency, rel=1e-12)

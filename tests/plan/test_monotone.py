"""Under the roofline model, a GPU with strictly more memory and bandwidth (and no less of
anything else) is never planned with a lower capacity."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pagesim.plan import GridPoint, SearchSettings, parse_slos
from pagesim.plan.cache import trace_hash
from pagesim.plan.planner import ConfigJob, plan_config
from pagesim.sim import specs
from tests.plan.common import SMALL_TRACE, TINY_RUNS


def capacity(gpu: str, slo: str) -> float:
    # seeds=1: the capacity is the first seed's search (plan_config); the other seeds' searches
    # only widen the interval around it, which nothing here reads (they were 45 % of the time)
    job = ConfigJob(GridPoint(gpu, 1, 16, "recompute", 256), TINY_RUNS, SearchSettings(start_rate=16.0, tolerance=0.05), parse_slos(slo), 10.0, 0.0,
                    SMALL_TRACE, trace_hash(SMALL_TRACE), None, seeds=1)
    result = plan_config(job)
    assert result.capacity is not None, result.reason
    return result.capacity


def dominates(big: specs.GPUSpec, small: specs.GPUSpec) -> bool:
    return (big.memory_bytes > small.memory_bytes and big.hbm_bandwidth > small.hbm_bandwidth
            and big.fp16_flops >= small.fp16_flops and big.interconnect_bandwidth >= small.interconnect_bandwidth
            and big.pcie_bandwidth >= small.pcie_bandwidth)


@pytest.fixture
def synthetic_gpus(monkeypatch):
    """a100-40gb scaled up in memory and bandwidth only, registered in the catalog for the test."""
    base = specs.GPUS["a100-40gb"]
    gpus = dict(specs.GPUS)
    for name, mem, bw in (("syn-b", 1.6, 1.5),):
        gpus[name] = replace(base, name=name, memory_bytes=int(base.memory_bytes * mem), hbm_bandwidth=base.hbm_bandwidth * bw)
    monkeypatch.setattr(specs, "GPUS", gpus)
    return gpus


@pytest.mark.parametrize("slo", ["ttft_p99=1.0,tpot_p99=0.05"])
def test_more_memory_and_bandwidth_never_plans_lower(synthetic_gpus, slo):
    names = ["a100-40gb", "syn-b", "a100-80gb", "h200-141gb"]
    caps = {g: capacity(g, slo) for g in names}
    pairs = [(big, small) for big in names for small in names if dominates(synthetic_gpus[big], synthetic_gpus[small])]
    assert len(pairs) == 5  # the check below covers catalog and synthetic pairs
    for big, small in pairs:
        assert caps[big] >= caps[small], (big, caps[big], small, caps[small])

"""Local processes and Ray give identical tables; the on-disk cache is reused by a wider grid."""

from __future__ import annotations

import importlib.util

import pytest

from pagesim.plan import expand_grid, make_plan, parse_slos
from tests.plan.common import COARSE, SMALL_TRACE, TINY_RUNS

SLOS = parse_slos("ttft_p99=0.5,tpot_p99=0.05")
GRID = expand_grid(["a100-40gb", "h100-80gb"], [1, 3], [16], ["recompute"], [256])  # tp 3: 32 heads do not split


def plan(grid, backend="local", jobs=1, cache_dir=None):
    return make_plan(model="llama-2-7b", trace=SMALL_TRACE, trace_path="small.json", target_rate=20.0, slos=SLOS,
                     grid=grid, settings=TINY_RUNS, search=COARSE, cache_dir=cache_dir, backend=backend, jobs=jobs,
                     seeds=1, longer_factor=0)


def outcome(result) -> dict:
    """Everything a configuration's search found (to_dict leaves out how many runs the cache gave)."""
    d = result.to_dict()
    assert "num_cached" not in d and d["points"]
    return d


@pytest.fixture(scope="module")
def local_plan():
    return plan(GRID, "local", jobs=2)


def test_infeasible_configuration_has_a_reason(local_plan):
    by_tp = {(r.point.gpu, r.point.tp): r for r in local_plan.results}
    assert by_tp[("a100-40gb", 3)].capacity is None
    assert "cannot be split over tp=3" in by_tp[("a100-40gb", 3)].reason
    assert by_tp[("a100-40gb", 1)].capacity and by_tp[("h100-80gb", 1)].capacity


def test_process_pool_equals_one_process(local_plan):
    assert plan(GRID, "local", jobs=1).table() == local_plan.table()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'pagesim[ray]')")
def test_ray_gives_the_same_table(local_plan):
    ray_plan = plan(GRID, "ray", jobs=2)
    assert ray_plan.table() == local_plan.table()
    assert [outcome(r) for r in ray_plan.results] == [outcome(r) for r in local_plan.results]


def test_a_wider_grid_reuses_the_cache(tmp_path, local_plan):
    narrow = expand_grid(["a100-40gb"], [1], [16], ["recompute"], [256])
    first = plan(narrow, cache_dir=tmp_path)
    assert first.results[0].num_simulated > 0  # (its full probes read the runs its scouts made: num_cached > 0)
    entries = sorted(p.name for p in tmp_path.rglob("*.json"))
    assert len(entries) == first.results[0].num_simulated
    wider = plan(narrow + expand_grid(["h100-80gb"], [1], [16], ["recompute"], [256]), cache_dir=tmp_path)
    reused, new = wider.results
    assert reused.num_simulated == 0
    assert reused.num_cached == first.results[0].num_simulated + first.results[0].num_cached
    assert new.num_simulated > 0
    assert outcome(reused) == outcome(first.results[0])
    # cached and fresh runs agree with a plan made without any cache
    assert wider.table() == [row for row in local_plan.table() if row["tp"] == 1]

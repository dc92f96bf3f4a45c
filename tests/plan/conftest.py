"""One small plan shared by the report tests (tests/plan/test_report_layout.py and
test_report_browser.py): planning it is the slow part, the tests only read it."""

from __future__ import annotations

import pytest

import pagesim.api
from tests.plan.common import SMALL_TRACE


@pytest.fixture(scope="package")
def light_plan(tmp_path_factory):
    """(Plan, its report folder): 2 GPUs x 2 preemption modes x 2 block sizes, 8 configurations.
    A light load on large GPUs: nothing is preempted, so swap and recompute give identical
    results (rows the report merges); the capacities still differ across GPUs. Tests that edit
    the Plan object put it back as they found it."""
    out = tmp_path_factory.mktemp("plan")
    plan = pagesim.api.plan(model="llama-2-7b", trace=SMALL_TRACE, target_rate=30, slo="ttft_p99=0.5,tpot_p99=0.05",
                            gpus=["a100-80gb", "h100-80gb"], preemption=["recompute", "swap"], block_size=[16, 32],
                            num_requests=60, min_duration=0, tolerance=0.1, start_rate=16, jobs=1, out=out,
                            min_measured=50, max_requests=1280, seeds=1, check_longer=0)
    return plan, out

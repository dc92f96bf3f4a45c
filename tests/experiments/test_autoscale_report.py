"""pagesim.experiments.autoscale --smoke: the report is written, and its numbers keep the orders
that hold by construction (an autoscaled fleet holds between min and max GPUs the whole run)."""

from __future__ import annotations

import json

import pytest

from pagesim.experiments import autoscale


@pytest.mark.slow
def test_smoke_report(tmp_path):
    out = tmp_path / "autoscale.md"
    autoscale.main(["--smoke", "--out", str(out)])
    data = json.loads(out.with_suffix(".json").read_text())
    for name in autoscale.TRACES:
        runs = data[name]["runs"]
        high = runs[f"fixed {autoscale.MAX}"]
        assert high["gpu_hours"] == pytest.approx(autoscale.MAX * high["end_s"] / 3600)
        for label, r in runs.items():
            assert r["num_finished"] <= r["num_requests"] == data[name]["requests"]
            assert 0.0 <= r["slo_attainment"] <= 1.0
            if label.startswith("autoscaled"):
                # min replicas (one GPU each) are held the whole run, never more than max
                hours = r["end_s"] / 3600
                assert autoscale.MIN * hours * (1 - 1e-9) <= r["gpu_hours"] <= autoscale.MAX * hours * (1 + 1e-9)
                assert autoscale.MIN <= r["peak_replicas"] <= autoscale.MAX
        assert (tmp_path / "autoscale" / f"{name}.png").stat().st_size > 0
    assert "| fixed 1 |" in out.read_text()

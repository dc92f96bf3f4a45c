"""The autoscaler's decisions against sequences worked out by hand from its stated rule."""

from __future__ import annotations

import pytest

from pagesim.cluster.autoscale import AutoscalePolicy, Autoscaler, GpuHours
from pagesim.cluster.routers.base import ReplicaLoad


def loads(*waiting, kv=0.0):
    return [ReplicaLoad(i, waiting=w, kv_usage=kv) for i, w in enumerate(waiting)]


def test_scales_up_over_the_threshold_then_waits_out_the_cooldown():
    scaler = Autoscaler(AutoscalePolicy(up_at=4, down_at=1, max_replicas=3, cooldown_s=30))
    assert scaler.decide(0.0, loads(10), starting=0) == 1  # 10 waiting on 1 replica > 4
    assert scaler.decide(10.0, loads(10), starting=0) == 0  # within 30 s of the last change
    assert scaler.decide(40.0, loads(5, 5), starting=0) == 1  # 5 per replica > 4, 2 < 3
    assert scaler.decide(80.0, loads(9, 9, 9), starting=0) == 0  # at max_replicas
    assert [d[:2] for d in scaler.decisions] == [(0.0, 1), (40.0, 1)]


def test_waits_for_starting_replicas_before_asking_for_more():
    scaler = Autoscaler(AutoscalePolicy(up_at=4, down_at=1, max_replicas=4, cooldown_s=0))
    assert scaler.decide(0.0, loads(20), starting=1) == 0
    assert scaler.decide(1.0, loads(20), starting=0) == 1


def test_scales_down_below_the_threshold_but_never_under_the_minimum():
    scaler = Autoscaler(AutoscalePolicy(up_at=4, down_at=1, min_replicas=2, cooldown_s=0))
    assert scaler.decide(0.0, loads(0, 1, 0), starting=0) == -1  # 1/3 < 1 and 3 > 2
    assert scaler.decide(1.0, loads(0, 0), starting=0) == 0  # at min_replicas


def test_kv_metric_is_the_mean_usage():
    scaler = Autoscaler(AutoscalePolicy(metric="kv", up_at=0.8, down_at=0.2, cooldown_s=0))
    assert scaler.decide(0.0, loads(0, 0, kv=0.9), starting=0) == 1
    assert scaler.policy.load(loads(0, 0, kv=0.5)) == pytest.approx(0.5)


@pytest.mark.parametrize("changes, problem", [
    ({"metric": "latency"}, "metric"), ({"min_replicas": 0}, "min_replicas"), ({"down_at": 5.0}, "flap"),
    ({"interval_s": 0.0}, "interval_s"), ({"startup_s": float("nan")}, "startup_s")])
def test_bad_policies_are_refused_with_the_field_named(changes, problem):
    with pytest.raises(ValueError, match=problem):
        AutoscalePolicy(**changes)


def test_gpu_hours_count_from_the_request_until_drained():
    hours = GpuHours()
    hours.take(0, 2, 0.0)  # two GPUs from t=0
    hours.take(1, 2, 1800.0)  # two more from half an hour in
    hours.release(1, 3600.0)
    assert hours.total_hours(7200.0) == pytest.approx(2 * 2 + 2 * 0.5)

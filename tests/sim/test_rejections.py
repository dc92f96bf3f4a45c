"""Runs that cannot serve some or all requests end normally, with every request accounted for as
finished or rejected with a reason. Expected outcomes are worked out here from the lengths and
the pool (the rejection rule by hand), not taken from an earlier run."""

from __future__ import annotations

import math

import pytest

from pagesim.core import CoreError
from pagesim.core.errors import CannotServe
from pagesim.plan.run import simulate
from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest

# the second prompt alone is longer than OPT's 2048-token context
TWO = Trace({}, [TraceRequest(prompt_len=10, output_len=5), TraceRequest(prompt_len=100_000, output_len=5)])
SMALL = Trace({}, [TraceRequest(prompt_len=p, output_len=o) for p, o in [(30, 20), (200, 50), (7, 3), (1000, 900)]])


def replay(trace, **changes):
    cfg = ReplayConfig(**{"num_requests": len(trace), **changes})
    return Replay(cfg, trace, cost_model=ConstantCostModel(0.01)).run()


def accounted(result) -> dict[int, str]:
    s = result.summary
    assert s["num_finished"] + s["num_rejected"] == s["num_requests"]
    assert sum(s["reject_reasons"].values()) == s["num_rejected"]
    return {r.request_id: r.status for r in result.metrics.requests}


@pytest.mark.parametrize("rate", [0.01, 1000.0])
def test_last_request_rejected_while_the_engine_is_idle(rate):
    # At 0.01 req/s the first request has long finished when the second arrives and is rejected:
    # nothing is left to wake the engine, which must still see that every request is done.
    result = replay(TWO, rate=rate)
    assert accounted(result) == {0: "finished", 1: "rejected"}
    assert list(result.summary["reject_reasons"]) == ["prompt 100000 + max_tokens 5 exceeds max_model_len 2048"]


@pytest.mark.parametrize("changes, reason", [
    ({"num_gpu_blocks": 0}, "the pool has 0 usable"),
    ({"max_num_seqs": 0}, "exceed max_num_seqs 0"),
    ({"n": 1000, "max_num_seqs": 256}, "1000 sequences exceed max_num_seqs 256"),
])
@pytest.mark.parametrize("policy", ["paged", "orca-oracle"])
def test_every_request_rejected_ends_normally(changes, reason, policy):
    result = replay(SMALL, policy=policy, **changes)
    assert set(accounted(result).values()) == {"rejected"}
    assert result.summary["num_steps"] == 0
    assert all(reason in r or "do not fit in an empty pool" in r for r in result.summary["reject_reasons"])


def test_a_block_bigger_than_the_kv_memory():
    # the paged system (vLLM) refuses to start: not one request of max_model_len fits; a reservation
    # baseline starts and rejects every request, each with its reason
    with pytest.raises(CannotServe, match="vLLM would refuse to start"):
        replay(SMALL, policy="paged", block_size=100_000)
    result = replay(SMALL, policy="orca-oracle", block_size=100_000)
    assert set(accounted(result).values()) == {"rejected"} and result.summary["num_steps"] == 0
    assert all("the pool has 0 usable" in r or "do not fit in an empty pool" in r
               for r in result.summary["reject_reasons"])


def test_a_pool_that_fits_some_requests_rejects_exactly_the_others():
    pool = 20  # blocks of 16 tokens, no watermark below 100 blocks
    result = replay(SMALL, num_gpu_blocks=pool, rate=5.0)
    expected = {i: "rejected" if math.ceil((r.prompt_len + r.output_len - 1) / 16) > pool else "finished"
                for i, r in enumerate(SMALL.requests)}
    assert accounted(result) == expected
    assert list(expected.values()).count("rejected") == 1  # the 1000 + 900 token request


def test_planner_records_cannot_serve_and_lets_bugs_surface(monkeypatch):
    # A model that leaves no KV pool is a documented outcome: an infeasible record.
    record = simulate(ReplayConfig(model="opt-175b", gpu="a100-40gb", num_requests=2), TWO)
    assert "leaves no KV pool" in record["error"]
    # A rejected request is counted, not an error.
    record = simulate(ReplayConfig(num_requests=2, rate=0.01), TWO)
    assert record["error"] is None and record["num_rejected"] == 1
    # A broken core invariant is a bug: it must propagate, never pass for "not sustainable".
    def broken(self):
        raise CoreError("refcount went negative")

    monkeypatch.setattr(Replay, "run", broken)
    with pytest.raises(CoreError):
        simulate(ReplayConfig(num_requests=2), TWO)
    monkeypatch.setattr(Replay, "run", lambda self: {}["missing"])
    with pytest.raises(KeyError):
        simulate(ReplayConfig(num_requests=2), TWO)

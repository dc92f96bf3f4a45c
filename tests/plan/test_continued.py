"""Continued probes (pagesim.plan.continued): one replay judged at checkpoints, against records
built by hand (an M/D/1 system, by the Lindley recursion) and by brute force over the same replay
run without pauses, and the simulated work of a probe that extends, counted."""

from __future__ import annotations

import math

import pytest

from pagesim.plan import steady
from pagesim.plan.continued import ContinuedReplay
from pagesim.plan.run import checkpoint_record, probe_steady, scout_probe
from pagesim.plan.search import ROUNDING, SearchSettings, scouted_search
from pagesim.plan.slo import parse_slos
from pagesim.sim.cost.base import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest

from tests.plan.test_steady import MU, OUTPUT, SERVICE_S, STEP_S, TRACE, md1_run

WARMUP = 0.2


def md1_replay(rate: float, cap: int, slos=None) -> ContinuedReplay:
    cfg = ReplayConfig(model="opt-125m", gpu="a100-40gb", rate=rate, num_requests=cap, max_num_seqs=1, seed=0)
    return ContinuedReplay(cfg, TRACE, slos, WARMUP, cost_model=ConstantCostModel(STEP_S))


def lindley(arrivals: list[float]) -> list[tuple[float, float, float]]:
    """(start, first token, finish) of FCFS customers served one at a time for SERVICE_S: the
    prefill step gives the first token one step after the start."""
    free, out = 0.0, []
    for a in arrivals:
        start = max(a, free)
        free = start + SERVICE_S
        out.append((start, start + STEP_S, free))
    return out


def test_a_checkpoint_of_the_md1_system_is_its_hand_built_record():
    rate, cap = 0.75 * MU, 3000
    replay = md1_replay(rate, cap)
    arrivals = [r.arrival_time for r in replay.sim.requests]
    times = lindley(arrivals)
    for n in (400, 1000):  # the second continues the first's replay
        record = checkpoint_record(rate, replay.checkpoint(n))
        warmup = WARMUP * n / rate
        measured = [i for i in range(n) if arrivals[i] >= warmup]
        last_finish = times[n - 1][2]
        assert record["num_requests"] == record["num_finished"] == n and record["num_rejected"] == 0
        assert record["num_measured"] == len(measured)
        assert record["window_s"] == pytest.approx(arrivals[n - 1] - warmup)
        assert record["mean_service_s"] == pytest.approx(SERVICE_S)
        assert record["request_throughput"] == pytest.approx(n / (last_finish - arrivals[0]))
        assert record["output_token_throughput"] == pytest.approx(n * OUTPUT / (last_finish - arrivals[0]))
        assert record["mean_output_len"] == OUTPUT and record["num_preemptions"] == 0
        # one request at a time, in one block, held after each of its steps but the last (the
        # step log counts blocks after the step's update, which frees a finished request's)
        assert record["mean_kv_utilization"] == pytest.approx((OUTPUT - 1) / OUTPUT / record["num_kv_blocks"])
        assert record["peak_kv_utilization"] == pytest.approx(1 / record["num_kv_blocks"])
        assert record["latencies"]["ttft"] == pytest.approx([times[i][1] - arrivals[i] for i in measured])
        assert record["latencies"]["e2e"] == pytest.approx([times[i][2] - arrivals[i] for i in measured])
        assert record["latencies"]["tpot"] == pytest.approx([STEP_S] * len(measured))
        stays = [(arrivals[i], times[i][2]) for i in range(n)]  # later arrivals come after the window
        trend = steady.in_system_trend(stays, warmup, arrivals[n - 1])
        assert record["trend"] == pytest.approx(trend.to_dict())
        # what it simulated: every arrival up to the n-th departure, and the one that started the
        # next step if the server went idle there (where the replay pauses)
        assert replay.sim.num_submitted == max(n + 1, sum(1 for a in arrivals if a <= last_finish))


def test_a_probe_that_extends_simulates_its_final_length_once():
    # just below the service rate with an SLO that never binds: the queue's trend needs
    # several extensions to decide; restarted, a probe simulates every length it ran
    rate, cap = 0.95 * MU, 20_000
    slos = parse_slos("tpot_p50=100")
    replay = md1_replay(rate, cap, slos)
    continued = probe_steady(lambda n: checkpoint_record(rate, replay.checkpoint(n)), 300, cap, slos, 0.02)
    restarted = probe_steady(md1_run(rate), 300, cap, slos, 0.02)
    assert len(continued.runs) >= 3, continued.runs  # at least two extensions
    final = continued.runs[-1]
    assert replay.sim.num_submitted <= 1.01 * final  # the last drain lets in a few more, no second run
    assert sum(restarted.runs) >= 1.5 * final  # what restarting costs: every length again
    # M/D/1 serves in arrival order one at a time, so later arrivals change nothing for earlier
    # ones: here continued and restarted runs judge the same records
    assert (continued.runs, continued.sustainable, continued.steady) == (restarted.runs, restarted.sustainable,
                                                                        restarted.steady)
    assert {k: v for k, v in continued.stats.items() if k != "stopped_by"} == restarted.stats  # (md1_run: no watch)


# A batching system under KV pressure with async output (tokens reach the client a step late):
# later arrivals share the batch and the pool with the judged requests.
MIXED = Trace({"name": "mixed"}, [TraceRequest(prompt_len=20 + 37 * i % 90, output_len=8 + 23 * i % 70)
                                  for i in range(17)])


def batching_cfg(cap: int) -> ReplayConfig:
    return ReplayConfig(model="opt-125m", gpu="a100-40gb", rate=6.0, num_requests=cap, max_num_seqs=8,
                        num_gpu_blocks=40, seed=3)


def async_cost() -> ConstantCostModel:
    cost = ConstantCostModel(0.02)
    cost.output_delay_steps = 1
    return cost


def test_a_checkpoint_is_the_uninterrupted_replays_first_requests():
    cap, n = 900, 500
    replay = ContinuedReplay(batching_cfg(cap), MIXED, None, WARMUP, cost_model=async_cost())
    for earlier in (120, 250):  # pauses before: they must change nothing
        replay.checkpoint(earlier)
    record = checkpoint_record(6.0, replay.checkpoint(n))
    direct = ContinuedReplay(batching_cfg(cap), MIXED, None, WARMUP, cost_model=async_cost())
    assert checkpoint_record(6.0, direct.checkpoint(n)) == record

    # brute force: the same replay run through without a pause, every step kept
    sim = Replay(batching_cfg(cap), MIXED, cost_model=async_cost(), keep_steps=True)
    departed_at = []  # the clock at each departure
    sim.on_progress = lambda _done: departed_at.append(sim.env.now)
    full = sim.run()
    done = full.metrics.requests
    last = max(i for i, r in enumerate(done) if r.request_id < n)  # the last judged departure
    judged = [r for r in done[:last + 1] if r.request_id < n]
    assert len(judged) == n and record["num_preemptions"] == sum(r.num_preemptions for r in judged) > 0
    warmup = WARMUP * n / 6.0
    measured = sorted((r for r in judged if r.arrival_time >= warmup), key=lambda r: r.request_id)
    assert record["latencies"]["ttft"] == [r.ttft for r in measured]  # delivered a step late, as the full run's
    assert record["latencies"]["e2e"] == [r.e2e_latency for r in measured]
    finished = [r for r in judged if r.status == "finished"]
    span = max(r.finish_time for r in finished) - min(r.arrival_time for r in judged)
    assert record["request_throughput"] == pytest.approx(len(finished) / span)
    steps = [s for s in full.metrics.step_log.records() if s.time <= departed_at[last]]
    assert len(steps) < len(full.metrics.step_log)  # later steps are not the judged requests'
    assert record["mean_kv_utilization"] == pytest.approx(sum(s.kv_utilization * s.duration for s in steps) /
                                                          sum(s.duration for s in steps))
    assert record["peak_kv_utilization"] == pytest.approx(max(s.kv_blocks_used for s in steps) / 40)


def test_a_stopped_checkpoint_is_a_certain_failure_whatever_paused_before():
    # overloaded 3x: mean TTFT under one service time fails for sure long before all leave
    rate, cap, n = 3 * MU, 6000, 4000
    slos = parse_slos(f"ttft_mean={SERVICE_S}")
    replay = md1_replay(rate, cap, slos)
    replay.checkpoint(100)
    stopped = replay.checkpoint(n)
    assert stopped.stopped is not None and stopped.stopped.name == "ttft_mean"
    assert len(stopped.requests) < n  # stopped early, partial
    direct = md1_replay(rate, cap, slos).checkpoint(n)
    assert checkpoint_record(rate, direct) == checkpoint_record(rate, stopped)
    # certain: even if every judged request still to leave had TTFT 0, the mean stays over
    ttfts = [r.ttft for r in stopped.requests if r.arrival_time >= stopped.warmup_s]
    assert sum(ttfts) > SERVICE_S * sum(1 for r in replay.sim.requests[:n] if r.arrival_time >= stopped.warmup_s)
    assert not math.isnan(sum(ttfts))


@pytest.mark.parametrize("num_requests", [300, 3000])
def test_the_search_over_continued_probes_finds_the_md1_knee(num_requests):
    # the knee of tests/plan/test_steady.py (Pollaczek-Khinchine: mean TTFT <= one step + 2
    # services up to 16 req/s), found by the planner's search with every probe continued
    w, cap = 2.0, 20_000
    knee = (2 * w / (1 + 2 * w)) * MU
    slos = parse_slos(f"ttft_mean={STEP_S + w * SERVICE_S}")

    def run(rate: float):
        replay = md1_replay(rate, cap, slos)
        return lambda n: checkpoint_record(rate, replay.checkpoint(n))

    found = scouted_search(lambda rate: probe_steady(run(rate), num_requests, cap, slos, 0.03),
                           lambda rate: scout_probe(run(rate), num_requests, slos, 0.03),
                           SearchSettings(start_rate=1.0, tolerance=0.03))
    assert found.rate == pytest.approx(knee, rel=0.05), found.rate
    assert found.upper.rate / found.rate - 1 <= 0.03 * (1 + ROUNDING)
    assert found.lower.sustainable and not found.upper.sustainable and found.scouts

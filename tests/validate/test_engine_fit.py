"""`calibrate engine`'s fit (pagesim.engine_fit): a synthetic run made by pagesim itself with
known engine parameters is recovered; the linearised windows add up to the simulated latencies."""

import random
from dataclasses import replace

import numpy as np
import pytest

from pagesim.engine_fit import PARAMS, FitRun, MeasuredRequest, fit_engine, replay_with, stage_rows
from pagesim.sim.cost.engine import EngineParams, load_engine_profile
from pagesim.sim.engine import ReplayConfig, with_policy_presets
from pagesim.validate import fit_errors
from pagesim.workload.trace import Trace, TraceRequest

TRUE = EngineParams(gpu_time_scale=0.8, graph_kernel_s=3e-6, allreduce_latency_s=8e-6, cpu_step_s=1.2e-3,
                    cpu_per_seq_s=4e-6, request_host_s=0.03)
BASE = load_engine_profile("vllm-0.15")


def synthetic_run(name: str, rate: float, seed: int, count: int = 250) -> FitRun:
    rng = random.Random(seed)
    t, records = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        records.append(TraceRequest(prompt_len=rng.randint(50, 600), output_len=rng.randint(20, 300), arrival_time=t))
    trace = Trace({}, records)
    cfg = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "model": "llama-2-7b", "gpu": "h100-80gb",
                                              "rate": None, "num_requests": None, "max_num_seqs": 64,
                                              "max_num_batched_tokens": 2048, "engine": "vllm-0.15"}))
    truth = FitRun(name, cfg, trace, [])
    windows = replay_with(truth, TRUE, BASE)
    measured = [MeasuredRequest(rid, ttft, e2e, records[rid].output_len) for rid, (ttft, e2e) in windows.simulated.items()]
    return replace(truth, measured=measured)


def test_windows_add_up_to_the_simulated_latencies():
    run = synthetic_run("a", 6.0, 1, count=120)
    windows = replay_with(run, TRUE, BASE)
    theta = np.array([getattr(TRUE, p) for p in PARAMS[:-1]])
    e2e = windows.e2e[:, :-1] @ theta + windows.e2e[:, -1] + TRUE.request_host_s
    ttft = windows.ttft[:, :-1] @ theta + windows.ttft[:, -1] + TRUE.request_host_s
    sim = np.array([windows.simulated[m.request_id] for m in windows.measured])
    assert np.allclose(e2e, sim[:, 1], rtol=1e-6) and np.allclose(ttft, sim[:, 0], rtol=1e-6)
    rows, fixed, measured, labels = stage_rows(windows)
    full = np.append(theta, TRUE.request_host_s)
    for row, f, m in zip(rows, fixed, measured):  # measured == simulated here: the rows are exact
        assert row @ full + f == pytest.approx(m, rel=1e-6)


def test_known_parameters_are_recovered_from_a_synthetic_run():
    runs = [synthetic_run("light", 3.0, 2), synthetic_run("heavy", 9.0, 3)]
    fitted = fit_engine(runs, BASE, max_iterations=5)
    # host time is told apart by TTFT; the step terms together by ITL and E2E
    assert fitted.params.request_host_s == pytest.approx(TRUE.request_host_s, rel=0.15)
    for run in runs:
        windows = replay_with(run, fitted.params, BASE)
        errors = fit_errors(run, windows.simulated)
        for metric in ("e2e_mean", "ttft_mean", "itl_mean"):
            assert abs(errors[metric]["error"]) < 0.03, (run.name, metric, errors[metric])

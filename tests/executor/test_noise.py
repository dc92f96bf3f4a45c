"""Noise control on the executor clock (executor/noise.py) as run_trace and the profiler apply it,
and the profiler's new shapes: mixed steps, repetitions until the median is known."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from typer.testing import CliRunner

from executor.engine import EngineConfig, LLMEngine
from executor.models.loader import load_model
from executor.noise import NoiseControl
from executor.profiler import ProfileGrid, profile_engine
from executor.run import RunConfig, run_trace
from pagesim.cli import app
from pagesim.workload.trace import load_trace
from tests.executor.test_run_inputs import ALPACA, one_error


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    return load_model("random:llama-tiny", seed=0)


@pytest.fixture
def step_log(monkeypatch):
    """Every LLMEngine.step call: (engine, was the collector enabled inside it). The engine itself,
    not its id: a freed warm-up engine's id can be reused by the run's engine."""
    calls = []
    real = LLMEngine.step

    def step(self, clock):
        calls.append((self, gc.isenabled()))
        return real(self, clock)

    monkeypatch.setattr(LLMEngine, "step", step)
    return calls


def test_step_holds_the_collector_off_and_restores_it():
    assert gc.isenabled()
    with NoiseControl().step():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with NoiseControl().step():
            raise KeyError("x")
    assert gc.isenabled()
    with NoiseControl(gc_during_steps=True).step():
        assert gc.isenabled()


def test_pinning_binds_the_process_and_a_foreign_cpu_is_refused():
    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match="pin_cpu 4096"):
        NoiseControl(pin_cpu=4096).apply()
    cpu = max(before)
    try:
        NoiseControl(pin_cpu=cpu, warmup_steps=0).apply()
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
        gc.unfreeze()


@pytest.mark.parametrize("warmup, gc_during", [(0, False), (3, True)])
def test_run_trace_warms_up_off_the_record_and_keeps_gc_out_of_steps(lm, step_log, warmup, gc_during):
    trace = load_trace(ALPACA)
    cfg = RunConfig(rate=1000.0, num_requests=4, clock="cpu", warmup_steps=warmup, gc_during_steps=gc_during)
    summary, metrics = run_trace(lm, trace, EngineConfig(num_gpu_blocks=64, max_model_len=128), cfg)
    gc.unfreeze()
    engines = list(dict.fromkeys(e for e, _ in step_log))
    run_engine = engines[-1]
    recorded = metrics.num_steps
    assert sum(1 for e, _ in step_log if e == run_engine) == recorded
    assert len(step_log) - recorded == warmup  # the warm-up steps ran, on another engine, unrecorded
    assert all(enabled == gc_during for e, enabled in step_log if e == run_engine)
    assert summary["num_requests"] == 4
    assert summary["run"]["warmup_steps"] == warmup and summary["run"]["gc_during_steps"] == gc_during


def test_profiler_measures_mixed_steps_and_repeats_noisy_shapes(lm):
    grid = ProfileGrid(prefill=[(1, 8), (2, 4)], decode=[(2, 8)], mixed=[(1, 8, 3, 16), (2, 4, 1, 9)],
                       swap_blocks=[1, 2, 8], copy_blocks=[1], reps=2, max_reps=5, target_ci=0.0)
    data = profile_engine(lm, grid, clock="cpu", noise=NoiseControl(warmup_steps=1))
    gc.unfreeze()
    mixed = [s for s in data["steps"] if s["kind"] == "mixed"]
    for rec, (n, t, b, c) in zip(mixed, grid.mixed):
        shape = rec["shape"]
        assert shape["num_prefill_seqs"] == n and shape["num_prefill_tokens"] == n * t
        assert shape["prefill_attn_pairs"] == n * t * (t + 1) // 2
        assert shape["num_decode_seqs"] == b and b * c <= shape["decode_context_tokens"] <= b * (c + grid.max_reps)
    # target_ci 0 is never reached: every shape and block move repeats up to max_reps
    assert all(len(r["samples"]) == grid.max_reps for r in data["steps"] + data["swaps"] + data["copies"])
    assert [r["shape"]["num_swap_blocks"] for r in data["swaps"]] == [1, 1, 2, 2, 8, 8]
    assert data["noise_control"] == {"pin_cpu": None, "gc_during_steps": False, "warmup_steps": 1}
    loose = ProfileGrid(prefill=[(1, 8)], decode=[(1, 8)], mixed=[], swap_blocks=[], copy_blocks=[], reps=2,
                        max_reps=5, target_ci=float("inf"))
    data = profile_engine(lm, loose, clock="cpu", noise=NoiseControl(warmup_steps=0))
    gc.unfreeze()
    assert [len(r["samples"]) for r in data["steps"]] == [2, 2]  # converged at once: reps only


def test_cli_refuses_bad_shapes_files_and_cpus_before_loading(tmp_path, monkeypatch):
    from executor.models import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    bad = tmp_path / "shapes.csv"
    bad.write_text("num_prefill_tokens,seconds\n1,0.1\n")
    line = one_error(CliRunner().invoke(app, ["profile", "--model", "random:llama-tiny", "--out", str(tmp_path / "p.json"),
                                              "--shapes-from", str(bad)]))
    assert str(bad) in line and "row 1 (header)" in line
    line = one_error(CliRunner().invoke(app, ["profile", "--model", "random:llama-tiny", "--out", str(tmp_path / "p.json"),
                                              "--pin-cpu", "4096"]))
    assert "--pin-cpu 4096" in line
    line = one_error(CliRunner().invoke(app, ["run", ALPACA, "--model", "random:llama-tiny", "--pin-cpu", "4096"]))
    assert "--pin-cpu 4096" in line

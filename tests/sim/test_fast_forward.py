"""The simulator's fast path (runs of plain decode steps taken in one go) against the slow path
(one schedule/update per step): the written requests.csv, steps.csv, waste.csv and summary.json
must be byte-identical, in every configuration that changes what a step can do. The roofline
cost model is used throughout, so a run's step durations depend on the context it accumulates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pagesim.sim import engine as engine_module
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest, load_trace
from tests.sim.runs_taken import runs_taken

ROOT = Path(__file__).resolve().parents[2]


def _subset(name: str, count: int, max_total: int | None = None) -> Trace:
    trace = load_trace(ROOT / "traces" / name)
    reqs = [r for r in trace.requests if max_total is None or r.prompt_len + r.output_len <= max_total]
    return Trace(dict(trace.metadata), reqs[:count])


SHAREGPT = _subset("sharegpt.json", 400, max_total=1024)  # shorter requests keep the slow path quick
# prompts one token longer than the chunked-prefill budget: every last prefill chunk is a single
# token, which looks like a decode step but produces the request's first token
ONE_TOKEN_TAIL = Trace({}, [TraceRequest(prompt_len=257, output_len=20 + 7 * i) for i in range(20)])

BASE = ReplayConfig(num_requests=100, rate=2.0, seed=3)

CASES = {
    # name: (config changes, trace, what must have happened)
    "paged-recompute": (dict(preemption="recompute", num_gpu_blocks=120, rate=4.0), SHAREGPT, ("preemptions",)),
    "paged-swap": (dict(preemption="swap", num_gpu_blocks=120, rate=4.0), SHAREGPT, ("preemptions", "swaps")),
    "paged-auto-n3": (dict(preemption="auto", num_gpu_blocks=260, n=3, num_requests=50), SHAREGPT, ("preemptions", "swaps")),
    "paged-chunked": (dict(chunked_prefill=True, max_num_batched_tokens=256, num_gpu_blocks=160, rate=4.0), SHAREGPT,
                      ("preemptions",)),
    "chunked-one-token-tail": (dict(chunked_prefill=True, max_num_batched_tokens=256, rate=0.5, num_requests=20),
                               ONE_TOKEN_TAIL, ()),
    "orca-max": (dict(policy="orca-max", num_requests=60), SHAREGPT, ()),
    "orca-pow2-n2": (dict(policy="orca-pow2", n=2, num_requests=60), SHAREGPT, ("copies",)),
    "orca-pow2": (dict(policy="orca-pow2"), SHAREGPT, ()),
    "orca-oracle": (dict(policy="orca-oracle"), SHAREGPT, ()),
    "static": (dict(policy="static", num_requests=60), SHAREGPT, ()),
    "prefix-caching-chat": (dict(prefix_caching=True, num_gpu_blocks=200, rate=3.0, num_requests=80),
                            _subset("sharegpt_chat.json", 400), ("prefix_hits",)),
    "gamma-arrivals": (dict(burstiness=0.3, rate=3.0, num_gpu_blocks=200), SHAREGPT, ()),
    "waste-sampling": (dict(waste_interval_s=0.25, num_gpu_blocks=160, rate=3.0), SHAREGPT, ("waste",)),
}


def _run(cfg: ReplayConfig, trace: Trace, fast: bool, out: Path, monkeypatch):
    sim = Replay(cfg, trace, fast_forward=fast)
    counts = {"advance_decode": 0, "schedule": 0}
    # (steps scheduled one at a time are counted where the engine records each, as the scheduler
    # may be compiled: scripts/compile.py; its methods cannot be replaced)
    advance, schedule = engine_module.advance_decode, sim.metrics.record_step

    def counted_advance(*args, **kwargs):
        counts["advance_decode"] += 1
        return advance(*args, **kwargs)

    def counted_schedule(*args, **kwargs):
        counts["schedule"] += 1
        return schedule(*args, **kwargs)

    monkeypatch.setattr(engine_module, "advance_decode", counted_advance)
    sim.metrics.record_step = counted_schedule
    result = sim.run()
    result.metrics.write(out, result.summary)
    return sim, result, counts


@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_writes_the_same_bytes(name, tmp_path, monkeypatch):
    changes, trace, must = CASES[name]
    cfg = dataclasses.replace(BASE, **changes)
    sim_f, fast, counts_f = _run(cfg, trace, True, tmp_path / "fast", monkeypatch)
    sim_s, slow, counts_s = _run(cfg, trace, False, tmp_path / "slow", monkeypatch)

    files = sorted(p.name for p in (tmp_path / "slow").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "fast").iterdir())
    for f in files:
        assert (tmp_path / "fast" / f).read_bytes() == (tmp_path / "slow" / f).read_bytes(), f

    # the slow path takes one schedule() per step; the fast path took runs instead
    s = slow.summary
    assert counts_s["advance_decode"] == 0 and counts_s["schedule"] == s["num_steps"]
    assert counts_f["advance_decode"] >= 10
    assert counts_f["schedule"] + counts_f["advance_decode"] < s["num_steps"] / 2, (counts_f, s["num_steps"])
    assert s["num_finished"] > 0.8 * s["num_requests"]

    what = {
        "preemptions": s["num_preemptions"],
        "swaps": s["num_swapped_blocks"],
        "prefix_hits": sim_s.scheduler.kv.prefix_hits if cfg.prefix_caching else 0,
        "waste": len(slow.metrics.waste),
        "copies": s["num_copied_blocks"],
    }
    for key in must:
        assert what[key] > 0, (key, what)
    if cfg.n:
        assert all(r.num_seqs == cfg.n for r in slow.metrics.requests if r.status == "finished")


# Sparse arrivals: batches decode with nobody waiting, so runs go on past the steps in which
# groups finish (plan_decode's absorb_finishes), up to the next arrival.
ABSORBING = {
    "paged": dict(rate=0.5, num_requests=80),
    "paged-swap-tight": dict(preemption="swap", num_gpu_blocks=120, rate=1.0, num_requests=80),
    "vllm-v1-async-output": dict(policy="vllm-v1", engine="vllm-0.15", rate=0.5, num_requests=80),
}


@pytest.mark.parametrize("name", list(ABSORBING))
def test_runs_past_finishes_write_the_same_bytes(name, tmp_path, monkeypatch):
    cfg = dataclasses.replace(BASE, **ABSORBING[name])
    runs = runs_taken(monkeypatch)
    for fast, folder in ((True, "fast"), (False, "slow")):
        result = Replay(cfg, SHAREGPT, fast_forward=fast).run()
        result.metrics.write(tmp_path / folder, result.summary)
    for f in sorted(p.name for p in (tmp_path / "slow").iterdir()):
        assert (tmp_path / "fast" / f).read_bytes() == (tmp_path / "slow" / f).read_bytes(), f
    assert sum(len(run.finishes or ()) for run in runs) >= 10  # (finishes in mid-run: absorbed)

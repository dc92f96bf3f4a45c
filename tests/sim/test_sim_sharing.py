"""The simulator's sharing: beam search from the measured ancestry model, the memory-saving
metric in a replay, and prefix caching on a shared-prefix workload.

Beam tests use tests/sim/data/beam_ancestry_synthetic.json (a plain beam search over random
log-probs, tests/sim/make_beam_ancestry.py), never the real SmolLM2 measurements.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pagesim.core import PoolConfig, Request, SamplingParams, SchedulerConfig, StepResult, make_scheduler
from pagesim.metrics import StepRecord
from pagesim.sim import beam_model
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.requests import build_requests
from pagesim.workload.trace import Trace, TraceRequest, load_trace

ROOT = Path(__file__).resolve().parents[2]
SYNTHETIC = Path(__file__).parent / "data" / "beam_ancestry_synthetic.json"
ALPACA = load_trace(ROOT / "traces" / "alpaca.json")
BASE = ReplayConfig(num_requests=150, rate=30.0, beam_ancestry=str(SYNTHETIC))


def _brute(scheduler) -> tuple[int, int]:
    tables = [s.block_table for g in scheduler.running for s in g.seqs]
    return sum(map(len, tables)), len({b for t in tables for b in t})


def _replay(checked: bool = False, **changes):
    sim = Replay(dataclasses.replace(BASE, **changes), ALPACA, fast_forward=not checked)
    if checked:  # every step through record_step: compare each record with the block tables
        record = sim.metrics.record_step

        def record_and_check(out, now, duration, scheduler):
            record(out, now, duration, scheduler)
            # the step just recorded, read alone (metrics.steps rebuilds every record: quadratic)
            rec = StepRecord(*sim.metrics.step_log.row(sim.metrics.num_steps - 1))
            brute.append(_brute(scheduler))
            assert (rec.kv_blocks_logical, rec.kv_blocks_used) == brute[-1]

        brute = []
        sim.metrics.record_step = record_and_check
        result = sim.run()
        # and metrics.steps, the public list, holds the same counts
        assert [(r.kv_blocks_logical, r.kv_blocks_used) for r in result.metrics.steps] == brute
        return sim, result
    return sim, sim.run()


def test_step_samples_give_the_drawn_ancestry():
    """Through the real core: after a step, the beam ranked i (by cumulative log-prob) holds the
    tokens of the beam ranked parents[i] before it, plus one."""
    rng = random.Random(5)
    k = 4
    sched = make_scheduler("paged", PoolConfig(200, 0, 4), SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64,
                                                                           max_model_len=64))
    group = sched.add_request(Request(0, 6, SamplingParams(beam_width=k, max_tokens=30, ignore_eos=True)))
    out = sched.schedule(0.0)
    first = beam_model.first_samples(group.seqs[0], k, 0)
    # distinct tokens mark each line of descent
    sched.update(out, StepResult(samples={0: [s._replace(token_id=100 + i) for i, s in enumerate(first)]}), 0.0)
    for step in range(20):
        ranked = sorted(group.seqs, key=lambda s: -s.cumulative_logprob)
        before = [list(s.token_ids) for s in ranked]  # (parents append in place)
        lowest = ranked[-1].cumulative_logprob
        parents = tuple(rng.randrange(k) for _ in range(k))
        out = sched.schedule(float(step))
        samples = beam_model.step_samples(group.seqs, parents, 0)
        marked = [s._replace(token_id=1000 * step + i) for i, s in enumerate(samples)]
        sched.update(out, StepResult(samples={0: marked}), float(step))
        after = sorted(group.seqs, key=lambda s: -s.cumulative_logprob)
        assert len(after) == k
        for i, seq in enumerate(after):
            assert seq.token_ids[:-1] == before[parents[i]]
            assert seq.token_ids[-1] == 1000 * step + i
        assert all(s.cumulative_logprob < lowest for s in after)
        # the core shares exactly the blocks the lines of descent have in common
        kv = sched.kv
        assert kv.num_logical_blocks == sum(len(s.block_table) for s in group.seqs)
        assert kv.num_used_blocks == len({b for s in group.seqs for b in s.block_table})


def test_beam_replay_is_deterministic_and_matches_block_tables():
    sim_a, a = _replay(checked=True, beam_width=4)
    _, b = _replay(checked=True, beam_width=4)
    assert [dataclasses.astuple(s) for s in a.metrics.steps] == [dataclasses.astuple(s) for s in b.metrics.steps]
    assert a.summary["num_finished"] == 150
    assert all(r.num_seqs == 4 for r in a.metrics.requests)
    # every beam group ends with its 4 beams, each of its full output length
    assert sim_a.scheduler.kv.device.num_refs == 0
    assert any(s.kv_blocks_logical > s.kv_blocks_used for s in a.metrics.steps)
    # another seed draws other ancestries
    _, c = _replay(beam_width=4, seed=1)
    assert c.summary["memory_saving"] != a.summary["memory_saving"]


def test_parallel_sampling_replay_matches_block_tables_and_beams_share_more():
    _, par = _replay(checked=True, n=4)
    _, beam = _replay(beam_width=4)
    assert 0 < par.summary["memory_saving"] < beam.summary["memory_saving"]
    _, single = _replay()
    assert single.summary["memory_saving"] == 0.0


def test_reservation_baseline_runs_beams_without_saving():
    _, res = _replay(beam_width=2, policy="orca-oracle", num_requests=60)
    assert res.summary["num_finished"] == 60
    assert res.summary["memory_saving"] == 0.0


def test_unmeasured_width_and_missing_file_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"beam width 3 was not measured .*measured widths: 2, 4, 6"):
        Replay(dataclasses.replace(BASE, beam_width=3), ALPACA)
    missing = tmp_path / "none.json"
    with pytest.raises(FileNotFoundError, match="none.json: no beam-ancestry measurements"):
        Replay(dataclasses.replace(BASE, beam_width=2, beam_ancestry=str(missing)), ALPACA)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="x"), "field 'format'"),
    (lambda d: d["runs"][2].update(beam_width=1), "run 2: field 'beam_width' must be >= 2"),
    (lambda d: d["runs"][1]["steps"][3].append(0), "run 1: field 'steps' step 3"),
    (lambda d: d["runs"][0]["steps"][0].__setitem__(0, 7), "run 0: field 'steps' step 0"),
    (lambda d: d["runs"][4].pop("prompt_len"), "run 4: field 'prompt_len'"),
])
def test_bad_ancestry_file_names_run_and_field(tmp_path, mutate, message):
    data = json.loads(SYNTHETIC.read_text())
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(beam_model.AncestryError, match=f"bad.json: {message}"):
        beam_model.load_ancestry(path)


def test_model_draws_the_measured_vectors_and_validates_on_held_out_runs():
    data = beam_model.load_ancestry(SYNTHETIC)
    model = beam_model.BeamAncestryModel.fit(data.runs)
    rng = random.Random(0)
    drawn = Counter(model.draw(4, rng) for _ in range(20000))
    measured = Counter(v for r in data.runs if r.beam_width == 4 for v in r.steps)
    total = sum(measured.values())
    # the empirical distribution: only measured vectors, at their measured frequencies
    assert set(drawn) <= set(measured)
    for vector, count in measured.most_common(3):
        assert drawn[vector] / 20000 == pytest.approx(count / total, abs=0.02)
    report = beam_model.validate(data)
    for k in (2, 4, 6):
        r = report[k]
        assert r["test_runs"] == 3
        assert r["saving_model"] == pytest.approx(r["saving_measured"], abs=0.05), r
        assert r["distinct_parents_model"] == pytest.approx(r["distinct_parents_measured"], abs=0.3), r


def test_build_requests_overrides_n_and_beam_width():
    trace = Trace({}, [TraceRequest(10, 5, n=3), TraceRequest(10, 5, beam_width=2), TraceRequest(10, 5)])

    def params(**kw):
        reqs, _ = build_requests(trace, rate=1.0, **kw)
        return [(r.sampling.n, r.sampling.beam_width) for r in reqs]

    assert params() == [(3, 1), (1, 2), (1, 1)]
    assert params(beam_width=4) == [(1, 4), (1, 4), (1, 4)]
    assert params(n=2) == [(2, 1), (2, 1), (2, 1)]
    assert params(n=1) == [(1, 1), (1, 2), (1, 1)]  # n=1 only resets n; the record's beams stay
    assert params(beam_width=1) == [(3, 1), (1, 1), (1, 1)]
    with pytest.raises(ValueError, match="cannot be combined"):
        params(n=2, beam_width=2)


def test_prefix_caching_skips_the_shared_prefix_compute():
    """5-shot translation: with caching, each request after the first computes only what
    follows the cached prefix blocks; prefill tokens drop by exactly the tokens served from
    the cache, and each such request's cached tokens are the prefix's whole blocks."""
    trace = load_trace(ROOT / "traces" / "translation_5shot.json")
    cfg = ReplayConfig(model="llama-13b", gpu="a100-80gb", rate=10.0, num_requests=200)
    cold = Replay(cfg, trace).run()
    warm_sim = Replay(dataclasses.replace(cfg, prefix_caching=True), trace)
    warm = warm_sim.run()
    assert cold.summary["num_preemptions"] == warm.summary["num_preemptions"] == 0
    cold_prefill = sum(s.num_prefill_tokens for s in cold.metrics.steps)
    warm_prefill = sum(s.num_prefill_tokens for s in warm.metrics.steps)
    saved = warm.summary["prefill_tokens_saved"]
    assert cold_prefill - warm_prefill == saved
    prefix_blocks = 341 // 16
    hits = [r.cached_prompt_tokens for r in warm.metrics.requests]
    assert max(hits) >= prefix_blocks * 16 and Counter(h >= prefix_blocks * 16 for h in hits)[True] >= 190
    assert warm.summary["prefix_hit_rate"] > 0.9
    assert cold.summary["prefix_hit_rate"] is None
    assert warm.summary["memory_saving"] > 0.5  # the prefix blocks are shared by every running request


def test_replay_cli_prints_memory_saving_for_n_and_beam_width():
    from typer.testing import CliRunner

    from pagesim.cli import app

    runner = CliRunner()
    trace = str(ROOT / "traces" / "alpaca.json")
    table = runner.invoke(app, ["replay", trace, "--n", "4", "--num-requests", "60"])
    assert table.exit_code == 0, table.output
    assert "memory saving" in table.output
    beam = runner.invoke(app, ["replay", trace, "--beam-width", "4", "--num-requests", "60", "--beam-ancestry", str(SYNTHETIC),
                               "--json"])
    assert beam.exit_code == 0, beam.output
    summary = json.loads(beam.output)
    assert summary["config"]["beam_width"] == 4 and summary["memory_saving"] > 0.2
    bad = runner.invoke(app, ["replay", trace, "--beam-width", "5", "--beam-ancestry", str(SYNTHETIC)])
    assert bad.exit_code == 2 and "beam width 5 was not measured" in bad.output

"""A configuration's plan in stages (pagesim.plan.planner.Stage): the other seeds' searches and the
operating point run as tasks of their own, side by side on the local workers, with the results of
one process."""

from __future__ import annotations

import pytest

from pagesim.plan import expand_grid, make_plan, parse_slos
from pagesim.plan.workers import run_in_workers
from tests.plan.common import COARSE, SMALL_TRACE, TINY_RUNS
from tests.plan.stage_tasks import rendezvous  # (a module the workers can import)


def test_follow_up_tasks_keep_every_worker_busy(tmp_path):
    # one first task; its answer brings two more, which can only both say "together" if they run at once
    def follow(index, answer):
        return [("a", str(tmp_path)), ("b", str(tmp_path))] if answer == "first" else []

    answers = dict(run_in_workers(rendezvous, [("first", str(tmp_path))], workers=2, follow=follow))
    assert answers == {0: "first", 1: "together", 2: "together"}


def test_a_single_configuration_in_stages_equals_one_process():
    grid = expand_grid(["a100-40gb"], [1], [16], ["recompute"], [256])

    def plan(jobs: int):
        return make_plan(model="llama-2-7b", trace=SMALL_TRACE, trace_path="small.json", target_rate=20.0,
                         slos=parse_slos("ttft_p99=0.5,tpot_p99=0.05"), grid=grid, settings=TINY_RUNS, search=COARSE,
                         cache_dir=None, jobs=jobs, seeds=3, longer_factor=0)

    one, two = plan(1), plan(2)
    assert len(one.results[0].seed_capacities) == 3 and None not in one.results[0].seed_capacities
    assert two.table() == one.table()
    assert two.results[0].to_dict() == one.results[0].to_dict()


def test_the_operating_point_starts_at_the_longest_length_any_seeds_passes_near_it_needed(monkeypatch):
    # Probes replaced by a rule (no simulation): every seed sustains below 10 req/s, and a pass
    # there is decided at 160 requests for the plan's seed, 320 and 640 for the next two. The
    # search (start 2, 5 %) finds 9.93 req/s; 19 req/s then needs 2 replicas,
    # an operating point at 9.5 req/s, within NEAR (25 %) of every seed's passes at 9.93. So its
    # probe starts at 640 requests, the third seed's length (the first seed's alone: 160).
    from pagesim.plan import run as run_module
    from pagesim.plan.grid import GridPoint
    from pagesim.plan.planner import ConfigJob, plan_config
    from pagesim.plan.run import Evaluation, RateEvaluator

    need = {0: 160, 1: 320, 2: 640}  # seed offset -> the length a pass is decided on
    started = {}  # rate -> the length its probe started at

    def checkpoint(self, rate, num_requests, seed=None):
        return {"rate": rate, "seed": self.settings.seed if seed is None else seed}

    def probe(run, first, max_requests, slos, tolerance, min_measured):
        record = run(first)
        rate, offset = record["rate"], record["seed"] - TINY_RUNS.seed
        runs, ok = [first], rate < 10.0
        while ok and runs[-1] < need[offset]:
            runs.append(2 * runs[-1])
        started.setdefault((rate, offset), first)
        return Evaluation(rate, ok, {}, "flat", [] if ok else ["ttft_p99"], None,
                          {"window_s": 100.0, "mean_service_s": 1.0}, runs)

    monkeypatch.setattr(RateEvaluator, "checkpoint", checkpoint)
    monkeypatch.setattr(run_module, "probe_steady", probe)
    job = ConfigJob(GridPoint("a100-80gb", 1, 16, "recompute", 256), TINY_RUNS, COARSE,
                    parse_slos("ttft_p99=0.5"), 19.0, 0.0, SMALL_TRACE, "digest", None, seeds=3, longer_factor=0)
    result = plan_config(job)
    assert result.capacity == pytest.approx(9.93, abs=0.01)
    assert result.replicas == 2 and result.operating.rate == 9.5
    assert started[(9.5, 0)] == 640 and result.operating.runs == [640]

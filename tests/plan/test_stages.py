"""A configuration's plan in stages (pagesim.plan.planner.Stage): the other seeds' searches and the
operating point run as tasks of their own, side by side on the local workers, with the results of
one process."""

from __future__ import annotations

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

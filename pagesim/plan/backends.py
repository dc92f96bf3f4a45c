"""Run the per-configuration searches in parallel: local processes (default) or a Ray cluster.

Both call the same deterministic `plan_config` on the same jobs and return results in job order,
so they give identical tables for the same inputs. The on-disk run cache is shared through the
filesystem (a multi-node Ray cluster without a shared filesystem caches per node).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable

from pagesim.plan.planner import ConfigJob, ConfigResult, FirstSearch, StageAnswer, assemble, operating_stage, \
    plan_config, run_stage, search_first_seed, stages

BACKENDS = ("local", "ray")
Progress = Callable[[ConfigResult], None]


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot run here (its package is missing)."""


def run_jobs(jobs: list[ConfigJob], backend: str = "local", num_workers: int | None = None,
             on_result: Progress | None = None) -> list[ConfigResult]:
    if backend == "local":
        return run_local(jobs, num_workers, on_result)
    if backend == "ray":
        return run_ray(jobs, num_workers, on_result)
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def run_local(jobs: list[ConfigJob], num_workers: int | None = None, on_result: Progress | None = None) -> list[ConfigResult]:
    """Worker processes (pagesim.plan.workers; default: the CPU count); 1 runs in this process.
    Each configuration is a first task (its first seed's search) and then its stages
    (pagesim.plan.planner.Stage): the other seeds' searches, queued as the first task ends, so
    more workers than configurations are kept busy, and the operating point, queued as the last
    of them ends (its probe starts from their run lengths); the results are plan_config's."""
    # (at most every configuration's stages at once: its first search, then one task per seed)
    workers = max(1, min(num_workers or os.cpu_count() or 1, sum(max(1, job.seeds) for job in jobs) or 1))
    results: list[ConfigResult | None] = [None] * len(jobs)
    if workers == 1 or not jobs:
        for i, job in enumerate(jobs):
            results[i] = plan_config(job)
            if on_result:
                on_result(results[i])
        return results
    from contextlib import closing

    from pagesim.plan.workers import run_in_workers

    # Every job searches the same trace: it goes to each worker once, as it starts, not with every task.
    trace = jobs[0].trace
    kept = all(job.trace is trace for job in jobs)
    strip = _without_trace if kept else (lambda job: job)
    firsts: dict[int, FirstSearch] = {}
    answers: dict[int, list[StageAnswer | None]] = {}  # job index -> its stages' answers, in stages' order
    owner: dict[int, tuple[int, int]] = {}  # task index -> (job index, stage number)
    queued = [0]  # tasks queued after the first searches (their indices follow the jobs')

    def queue(job: int, todo: list) -> list:
        base = len(jobs) + queued[0]
        queued[0] += len(todo)
        owner.update({base + k: (job, len(answers[job]) + k) for k in range(len(todo))})
        answers[job] += [None] * len(todo)
        return [("stage", stage) for stage in todo]

    def operating(job: int) -> list:
        return queue(job, [operating_stage(strip(jobs[job]), firsts[job], answers[job])])

    def follow(index: int, answer) -> list:
        if index < len(jobs):  # a first search: its seeds' searches next (or the operating point)
            firsts[index], answers[index] = answer, []
            if answer.early is not None:
                return []
            todo = stages(strip(jobs[index]), answer)
            return queue(index, todo) if todo else operating(index)
        job, k = owner[index]
        answers[job][k] = answer
        seeds = max(0, jobs[job].seeds - 1)
        if len(answers[job]) == seeds and None not in answers[job]:  # every seed answered
            return operating(job)
        return []

    calls = run_in_workers(_task_with_kept_trace if kept else _task, [("first", strip(job)) for job in jobs], workers,
                           setup=(_keep_trace, trace) if kept else None, follow=follow)
    with closing(calls):
        for index, _ in calls:
            job = index if index < len(jobs) else owner[index][0]
            if results[job] is None and job in firsts and _complete(firsts[job], answers[job], jobs[job]):
                results[job] = assemble(jobs[job], firsts[job], answers[job])
                if on_result:
                    on_result(results[job])
    return results


def _complete(first: FirstSearch, answers: list, job: ConfigJob) -> bool:
    """Every stage of the job has answered: none when its first search decided it, else each
    seed's search and then the operating point."""
    return first.early is not None or (len(answers) == max(0, job.seeds - 1) + 1 and None not in answers)


def run_ray(jobs: list[ConfigJob], num_workers: int | None = None, on_result: Progress | None = None) -> list[ConfigResult]:
    """One Ray task per configuration. `ray.init()` connects to the cluster named by RAY_ADDRESS
    (or one already initialized in this process); otherwise it starts a local one with
    `num_workers` CPUs, shut down again at the end."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailable("the ray backend needs Ray: pip install 'pagesim[ray]'") from None
    started = False
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:
            ray.init(num_cpus=num_workers or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_plan_with_trace)
        # The trace goes into the object store once, not once per task.
        trace_ref = ray.put(jobs[0].trace) if jobs else None
        pending = {remote.remote(_without_trace(job), trace_ref): i for i, job in enumerate(jobs)}
        results: list[ConfigResult | None] = [None] * len(jobs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                results[i] = ray.get(ref)
                if on_result:
                    on_result(results[i])
        return results
    finally:
        if started:
            ray.shutdown()


_worker_trace = None  # a local worker's copy of the plan's trace (_keep_trace)


def _keep_trace(trace) -> None:
    global _worker_trace
    _worker_trace = trace


def _task(task: tuple):
    """A local worker's task: ("first", job) -> FirstSearch, or ("stage", stage) -> its answer."""
    kind, what = task
    return search_first_seed(what) if kind == "first" else run_stage(what)


def _task_with_kept_trace(task: tuple):
    kind, what = task
    if kind == "first":
        return _task((kind, replace(what, trace=_worker_trace)))
    return _task((kind, replace(what, job=replace(what.job, trace=_worker_trace))))


def _without_trace(job: ConfigJob) -> ConfigJob:
    return replace(job, trace=None)


def _plan_with_trace(job: ConfigJob, trace) -> ConfigResult:
    # Ray hands a top-level ObjectRef argument over as its value.
    return plan_config(replace(job, trace=trace))

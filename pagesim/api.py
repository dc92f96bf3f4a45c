"""The Python API: `pagesim.replay`, `pagesim.plan` and `pagesim.load_trace` (docs/api.md).
`pagesim.api.plan` is pagesim.plan.api.plan (it lives with the planner).

Options are named as the command line's flags (`--num-requests` is `num_requests=`), and
`pagesim replay` builds its run through `prepare_replay` here, so a notebook and the CLI run
the same simulation from the same options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from typing import TYPE_CHECKING, Callable

from pagesim.workload.trace import Trace, load_trace

if TYPE_CHECKING:  # the heavy modules load when a function runs, not when pagesim is imported
    import pandas

    from pagesim.metrics import MetricsRecorder
    from pagesim.sim.engine import Replay, ReplayConfig

TraceLike = Trace | str | os.PathLike

# CLI flag (as a Python name) -> ReplayConfig field, where the two differ
RENAMED_OPTIONS = _RENAMED = {"swap_space": "swap_space_gib", "warmup": "warmup_s", "force": "force_profile"}


def replay_options() -> list[str]:
    """The option names `replay` accepts: those of `pagesim replay`'s flags."""
    from pagesim.sim.engine import ReplayConfig

    config_to_flag = {v: k for k, v in _RENAMED.items()}
    return [config_to_flag.get(f.name, f.name) for f in fields(ReplayConfig)]


def replay_config(**options) -> ReplayConfig:
    """A ReplayConfig from CLI-named options, or from ReplayConfig's own field names (those of
    summary.json's `config`, so `replay(trace, **summary["config"])` re-creates a run);
    `rate=0` means the trace's own arrival times."""
    from pagesim.sim.engine import ReplayConfig

    valid = replay_options()
    unknown = sorted(set(options) - set(valid) - set(_RENAMED.values()))
    if unknown:
        raise TypeError(f"unknown replay option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    both = sorted(flag for flag, field in _RENAMED.items() if flag in options and field in options)
    if both:
        raise TypeError(f"replay option(s) given twice: {', '.join(f'{k} and {_RENAMED[k]}' for k in both)}")
    values = {_RENAMED.get(k, k): v for k, v in options.items()}
    if "rate" in values:
        values["rate"] = values["rate"] or None
    for name in ("policy", "preemption"):  # the CLI hands enums
        if name in values:
            values[name] = getattr(values[name], "value", values[name])
    for name in ("beam_ancestry", "profile"):
        if values.get(name) is not None:
            values[name] = str(values[name])
    from pagesim.sim.engine import with_policy_presets

    return ReplayConfig(**with_policy_presets(values))


def prepare_replay(trace: TraceLike, keep_steps: bool = True, **options) -> Replay:
    """The simulation `replay` runs, built but not started (the CLI attaches a progress bar).
    keep_steps=False: no per-step records (nothing will write steps.csv)."""
    from pagesim.sim.engine import Replay

    loaded = trace if isinstance(trace, Trace) else load_trace(trace)
    return Replay(replay_config(**options), loaded, keep_steps=keep_steps)


@dataclass
class ReplayRun:
    """A finished replay: the summary (summary.json's dict) and the per-request and per-step
    records, as DataFrames with requests.csv's and steps.csv's columns."""

    config: ReplayConfig
    summary: dict
    metrics: MetricsRecorder

    @property
    def requests(self) -> pandas.DataFrame:
        import pandas

        from pagesim.metrics import REQUEST_FIELDS

        frame = pandas.DataFrame([r.row() for r in self.metrics.requests], columns=list(REQUEST_FIELDS))
        frame["turn"] = pandas.to_numeric(frame["turn"])  # (no session anywhere: NaN, as read_csv reads it)
        return frame

    @property
    def steps(self) -> pandas.DataFrame:
        import pandas

        return pandas.DataFrame(self.metrics.step_log.columns())  # (columns in STEP_FIELDS order)

    def write(self, out_dir: str | os.PathLike, steps: str = "all") -> None:
        """requests.csv, steps.csv and summary.json, as `pagesim replay --out` writes them
        (atomically: see pagesim.results); steps: which steps.csv rows, as `--steps` chooses."""
        from pagesim.results import results_folder

        with results_folder(out_dir) as folder:
            self.metrics.write(folder, self.summary, steps)


def finish_replay(sim: Replay, trace: TraceLike) -> ReplayRun:
    """Run a prepared replay; the summary names the trace file when there is one."""
    result = sim.run()
    summary = result.summary if isinstance(trace, Trace) else dict(result.summary, trace=str(trace))
    return ReplayRun(result.config, summary, result.metrics)


def replay(trace: TraceLike, *, progress: Callable[[int], None] | None = None, **options) -> ReplayRun:
    """Simulate serving `trace` (a Trace or a trace file) and return the run.

    >>> run = pagesim.replay("traces/sharegpt.json", num_requests=100, rate=2.0)
    >>> run.summary["mean_normalized_latency"], run.requests.ttft.median()

    Options are `pagesim replay`'s flags (see `replay_options()`), or the field names of a
    summary's `config` (`replay(trace, **summary["config"])` re-creates that run);
    progress(num_done) is called as requests finish."""
    sim = prepare_replay(trace, **options)
    sim.on_progress = progress
    return finish_replay(sim, trace)


def __getattr__(name: str):
    # pagesim.api.plan is pagesim.plan.api.plan: it lives with the planner, so that the package
    # pagesim.plan (callable as pagesim.plan(...)) never imports this module (no import cycle)
    if name == "plan":
        from pagesim.plan.api import plan

        return plan
    raise AttributeError(f"module 'pagesim.api' has no attribute {name!r}")

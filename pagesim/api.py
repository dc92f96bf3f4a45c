"""The Python API: `pagesim.replay`, `pagesim.plan` and `pagesim.load_trace` (docs/api.md).

Options are named as the command line's flags (`--num-requests` is `num_requests=`), and
`pagesim replay` builds its run through `prepare_replay` here, so a notebook and the CLI run
the same simulation from the same options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from pagesim.workload.trace import Trace, load_trace

if TYPE_CHECKING:  # the heavy modules load when a function runs, not when pagesim is imported
    import pandas

    from pagesim.metrics import MetricsRecorder
    from pagesim.plan.planner import Plan
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

        return pandas.DataFrame([r.row() for r in self.metrics.requests], columns=list(REQUEST_FIELDS))

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


def _listed(value) -> list:
    return [value] if isinstance(value, (str, int)) else list(value)


def plan(*, model: str, trace: TraceLike, target_rate: float, slo: str | Sequence,
         gpus: str | Sequence[str] = ("a100-40gb", "a100-80gb", "h100-80gb", "h200"),
         tp: int | Sequence[int] = 1, block_size: int | Sequence[int] = 16,
         preemption: str | Sequence[str] = "recompute", max_num_seqs: int | Sequence[int] = 256,
         max_num_batched_tokens: int | None = None, num_requests: int = 1000, max_requests: int = 40_000,
         seeds: int = 3, check_longer: float = 10.0, min_duration: float = 60.0,
         warmup_fraction: float = 0.2, tolerance: float = 0.02, start_rate: float = 1.0, min_rate: float = 0.01,
         min_headroom: float = 0.0, prices: str | os.PathLike | None = None, cost_model: str = "calibrated",
         profile: str | os.PathLike | None = None, force: bool = False, seed: int = 0, jobs: int | None = None,
         backend: str = "local", cache_dir: str | os.PathLike | None = None, out: str | os.PathLike | None = None,
         on_result: Callable | None = None) -> Plan:
    """Capacity plan, as `pagesim plan` makes it (docs/plan.md): for each configuration (every
    combination of gpus x tp x block_size x preemption x max_num_seqs) the highest rate one
    replica sustains within the SLOs, then replicas and cost for target_rate. `slo` is the
    flag's text (`"ttft_p99=2,tpot_p99=0.1"`) or a list of SLO objects. Nothing is cached unless
    cache_dir is given; with `out`, the report is written there too. Returns the Plan
    (`.recommendation`, `.ranking`, `.results`)."""
    from pagesim.plan import RunSettings, SearchSettings, expand_grid, load_prices, make_plan, parse_slos
    from pagesim.plan.report import write_report
    from pagesim.sim.specs import get_model

    loaded = trace if isinstance(trace, Trace) else load_trace(trace)
    slos = parse_slos(slo) if isinstance(slo, str) else list(slo)
    grid = expand_grid(_listed(gpus), _listed(tp), _listed(block_size), _listed(preemption), _listed(max_num_seqs))
    settings = RunSettings(get_model(model).name, num_requests, min_duration, warmup_fraction, max_num_batched_tokens,
                           cost_model=cost_model, profile=str(profile) if profile else None, seed=seed,
                           force_profile=force, max_requests_per_probe=max_requests)
    search = SearchSettings(start_rate=start_rate, tolerance=tolerance, min_rate=min_rate)
    trace_path = str(trace) if not isinstance(trace, Trace) else str(trace.metadata.get("name") or "in-memory trace")
    result = make_plan(model=settings.model, trace=loaded, trace_path=trace_path,
                       target_rate=target_rate, slos=slos, grid=grid, settings=settings, search=search,
                       min_headroom=min_headroom, prices=load_prices(prices), cache_dir=cache_dir, backend=backend,
                       jobs=jobs, command="pagesim.plan(...)", on_result=on_result, seeds=seeds,
                       longer_factor=check_longer)
    if out is not None:
        from pagesim.results import results_folder

        with results_folder(out) as staging:  # as `pagesim plan --out` writes it (locked, atomic)
            write_report(result, staging)
    return result

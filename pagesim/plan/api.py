"""`pagesim.plan(...)`, the Python face of `pagesim plan` (docs/api.md); also `pagesim.api.plan`.
It lives here, with the planner, so that the package never imports pagesim.api."""

from __future__ import annotations

import os
from typing import Callable, Sequence

from pagesim.core.config import SERVING_DEFAULTS
from pagesim.plan.planner import Plan
from pagesim.workload.requests import WORKLOAD_DEFAULTS
from pagesim.workload.trace import Trace, load_trace

TraceLike = Trace | str | os.PathLike


def _listed(value) -> list:
    return [value] if isinstance(value, (str, int)) else list(value)


def plan(*, model: str, trace: TraceLike, target_rate: float, slo: str | Sequence,
         gpus: str | Sequence[str] = ("a100-40gb", "a100-80gb", "h100-80gb", "h200"),
         tp: int | Sequence[int] = 1, block_size: int | Sequence[int] = 16,
         preemption: str | Sequence[str] = SERVING_DEFAULTS.preemption, max_num_seqs: int | Sequence[int] = 256,
         max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
         chunked_prefill: bool | None = None, num_requests: int = WORKLOAD_DEFAULTS.num_requests,
         max_requests: int = 40_000, min_measured: int = 1000, seeds: int = 3, check_longer: float = 10.0, min_duration: float = 60.0,
         warmup_fraction: float = 0.2, tolerance: float = 0.02, start_rate: float = 1.0, min_rate: float = 0.01,
         min_headroom: float = 0.0, prices: str | os.PathLike | None = None, cost_model: str = "calibrated",
         profile: str | os.PathLike | None = None, force: bool = False, seed: int = WORKLOAD_DEFAULTS.seed, jobs: int | None = None,
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
                           force_profile=force, max_requests_per_probe=max_requests,
                           min_measured_requests=min_measured, max_model_len=max_model_len,
                           chunked_prefill=chunked_prefill)
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

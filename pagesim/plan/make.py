"""make_plan: every configuration of a plan searched, priced and checked (what `pagesim plan` and
pagesim.plan(...) run)."""

from __future__ import annotations

from pagesim.plan.backends import run_jobs
from pagesim.plan.cache import DEFAULT_CACHE_DIR, trace_hash
from pagesim.plan.grid import GridPoint, RunSettings
from pagesim.plan.planner import ConfigJob, Plan, check_longer, price_results
from pagesim.plan.prices import PriceTable, load_prices
from pagesim.plan.search import SearchSettings
from pagesim.plan.slo import SLO
from pagesim.workload.trace import Trace


def make_plan(*, model: str, trace: Trace, trace_path: str, target_rate: float, slos: list[SLO],
              grid: list[GridPoint], settings: RunSettings, search: SearchSettings = SearchSettings(),
              min_headroom: float = 0.0, prices: PriceTable | None = None, cache_dir=DEFAULT_CACHE_DIR,
              backend: str = "local", jobs: int | None = None, command: str = "", on_result=None,
              seeds: int = 3, longer_factor: float = 10.0, fleet: tuple = ()) -> Plan:
    """Search every configuration (in parallel on `backend`), price them, check the recommendation
    on longer runs (longer_factor x; 0: no check), and return the Plan. fleet: FleetShapes
    (pagesim.plan.fleet) each feasible configuration's fleet is also sized for by simulating the cluster."""
    if not target_rate > 0:
        raise ValueError("target rate must be > 0")
    if not 0 <= min_headroom < 1:
        raise ValueError("minimum headroom must be in [0, 1)")
    prices = prices or load_prices()
    digest = trace_hash(trace)
    cache = None if cache_dir is None else str(cache_dir)
    if seeds < 1:
        raise ValueError("seeds must be >= 1")
    work = [ConfigJob(p, settings, search, slos, target_rate, min_headroom, trace, digest, cache, seeds, longer_factor,
                      tuple(fleet)) for p in grid]
    results = run_jobs(work, backend, jobs, on_result)
    price_results(results, prices, target_rate)
    plan = Plan(model=model, trace_path=trace_path, trace_digest=digest, trace_name=str(trace.metadata.get("name", "")),
                target_rate=target_rate, slos=slos, settings=settings, search=search, min_headroom=min_headroom,
                prices=prices, command=command, results=results, backend=backend, seeds=seeds,
                longer_factor=longer_factor)
    best = plan.recommendation
    if best is not None and longer_factor > 0:
        best.longer = check_longer(work[next(i for i, r in enumerate(results) if r is best)], best)
    return plan

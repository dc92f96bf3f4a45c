"""Capacity planning (`pagesim plan`): for each serving configuration, the highest rate one
replica sustains within latency SLOs (a bracketing search over simulated runs), then the replicas
and cost to serve a target rate, and a report. See docs/plan.md.

The package's names are read from their modules when first used (pagesim.lazy_names), so a
command that needs one part (replay's overload note: pagesim.plan.overload) does not load the
planner."""

from __future__ import annotations

import sys
import types

from pagesim.lazy_names import lazy_getattr

_HOMES = {
    "make_plan": "make", "run_jobs": "backends", "DEFAULT_CACHE_DIR": "cache", "trace_hash": "cache",
    "GridPoint": "grid", "RunSettings": "grid", "expand_grid": "grid",
    "ConfigJob": "planner", "ConfigResult": "planner", "Plan": "planner", "check_longer": "planner",
    "plan_config": "planner", "price_results": "planner",
    "PriceTable": "prices", "load_prices": "prices", "SearchSettings": "search", "bracket_search": "search",
    "SLO": "slo", "parse_slos": "slo",
}
__getattr__ = lazy_getattr(__name__, _HOMES, globals())

__all__ = ["make_plan", "parse_slos", "expand_grid", "RunSettings", "SearchSettings", "GridPoint", "Plan",
           "ConfigResult", "plan_config", "bracket_search", "load_prices", "SLO"]


class _CallablePackage(types.ModuleType):
    """`pagesim.plan(...)` is the API's plan function (pagesim.plan.api.plan), while `pagesim.plan`
    stays this package: importing a submodule binds the package to the `plan` attribute of
    pagesim, so the package itself answers the call."""

    def __call__(self, **options) -> Plan:
        from pagesim.plan.api import plan

        return plan(**options)


sys.modules[__name__].__class__ = _CallablePackage

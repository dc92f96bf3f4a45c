"""pagesim: paged KV-cache serving, simulated and real.

`pagesim.core` holds the engine core (requests, KV managers, scheduler), `pagesim.sim` the SimPy
simulator, `pagesim.workload` traces and arrivals. The Python API (docs/api.md):

    import pagesim
    run = pagesim.replay("traces/sharegpt.json", num_requests=100)
    run.summary, run.requests, run.steps          # dict, DataFrame, DataFrame
    plan = pagesim.plan(model="llama-2-7b", trace="traces/sharegpt.json", target_rate=20,
                        slo="ttft_p99=2,tpot_p99=0.1", gpus=["a100-80gb"])
    trace = pagesim.load_trace("traces/alpaca.json")

Importing pagesim loads none of torch, simpy or pandas: each function imports what it needs.
"""

from importlib import import_module

from pagesim._compiled import use_sources_where_stale

__version__ = "0.1.0"
__all__ = ["replay", "plan", "load_trace", "__version__"]


def __getattr__(name: str):
    if name in ("replay", "load_trace"):
        return getattr(import_module("pagesim.api"), name)
    if name == "plan":
        # the subpackage pagesim.plan, made callable as pagesim.api.plan (see its __init__)
        return import_module("pagesim.plan")
    raise AttributeError(f"module 'pagesim' has no attribute {name!r}")


use_sources_where_stale()

"""Cost models: how many seconds one engine step takes.

`base` (BatchShape, the CostModel interface, ConstantCostModel), `roofline` (datasheet peaks times
estimated efficiencies), `calibrated` (operator terms fitted to measured GPU timings, the default;
its fitting is `fit`, its data reader `measurements`), `profiled` (fitted to the executor's own
profile), `registry`, the one place that knows their names, and `names`, their names alone.
Importing this package loads no cost model: the names below are imported when first read (a
command's help names the defaults without loading the models), and no numpy at all: `profiled`,
`fit` and `lsq` are imported only where used.
"""

from pagesim.lazy_names import lazy_getattr
from pagesim.sim.cost.names import DEFAULT_COST_MODEL

_HOMES = {"BatchShape": "base", "ConstantCostModel": "base", "CostModel": "base", "prefill_attn_pairs": "base",
          "COST_MODELS": "registry", "make_cost_model": "registry", "register_cost_model": "registry"}

__all__ = ["DEFAULT_COST_MODEL", *_HOMES]


__getattr__ = lazy_getattr(__name__, _HOMES, globals())

"""Cost models: how many seconds one engine step takes.

`base` (BatchShape, the CostModel interface, ConstantCostModel), `roofline` (datasheet peaks times
estimated efficiencies), `calibrated` (operator terms fitted to measured GPU timings, the default;
its fitting is `fit`, its data reader `measurements`), `profiled` (fitted to the executor's own
profile), and `registry`, the one place that knows their names. Importing this package loads no
numpy: `profiled`, `fit` and `lsq` are imported only where used.
"""

from pagesim.sim.cost.base import BatchShape, ConstantCostModel, CostModel, prefill_attn_pairs
from pagesim.sim.cost.registry import COST_MODELS, DEFAULT_COST_MODEL, make_cost_model, register_cost_model

__all__ = ["BatchShape", "ConstantCostModel", "CostModel", "prefill_attn_pairs", "COST_MODELS", "DEFAULT_COST_MODEL",
           "make_cost_model", "register_cost_model"]

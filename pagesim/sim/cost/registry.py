"""The cost models by name: the one place that knows them (`--cost-model NAME`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from pagesim.sim.cost.base import ConstantCostModel, CostModel
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.engine import PAPER_ENGINE, EngineCostModel, load_engine_profile
from pagesim.sim.cost.roofline import DEFAULT_ROOFLINE_CONSTANTS, RooflineConstants, RooflineCostModel
from pagesim.sim.cost.names import DEFAULT_COST_MODEL  # noqa: F401 (re-exported)
from pagesim.sim.specs import GPUSpec, ModelSpec, get_gpu, get_model

# DEFAULT_COST_MODEL is used wherever a command does not name one. The calibrated model covers
# every catalog GPU (measured or scaled through its specs); the roofline stays selectable.

CostModelFactory = Callable[..., CostModel]


def _make_roofline(model, gpu, tp, profile_path=None,
                   constants: RooflineConstants = DEFAULT_ROOFLINE_CONSTANTS, ep: int = 1, **overrides) -> CostModel:
    # Overrides name RooflineConstants fields, e.g. make_cost_model(..., hbm_efficiency=0.8).
    return RooflineCostModel(model, gpu, tp, replace(constants, **overrides), ep=ep)


def _make_calibrated(model, gpu, tp, profile_path=None, calibration=None, engine=PAPER_ENGINE,
                     max_num_seqs: int = 256, ep: int = 1) -> CostModel:
    # the paper-era engine is the calibrated terms as measured; a current engine recombines them
    profile = load_engine_profile(engine)
    if profile.measured_eager:
        return CalibratedCostModel(model, gpu, tp, calibration, ep=ep)
    return EngineCostModel(model, gpu, tp, profile, calibration, max_num_seqs=max_num_seqs, ep=ep)


def _make_constant(model, gpu, tp, profile_path=None, seconds: float = 0.01) -> CostModel:
    return ConstantCostModel(seconds)


def _make_profiled(model, gpu, tp, profile_path=None, **kwargs) -> CostModel:
    # Fitted from the executor's profile file; imported here so the other models do not load numpy.
    from pagesim.sim.cost.profiled import make_profiled

    return make_profiled(model, gpu, tp, profile_path=profile_path, **kwargs)


COST_MODELS: dict[str, CostModelFactory] = {
    "calibrated": _make_calibrated,
    "roofline": _make_roofline,
    "constant": _make_constant,
    "profiled": _make_profiled,
}


def register_cost_model(name: str, factory: CostModelFactory) -> None:
    """Add or replace a cost model. `factory(model, gpu, tp, profile_path=None, **kwargs)`."""
    COST_MODELS[name.lower()] = factory


def make_cost_model(name: str, model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1,
                    profile_path: str | None = None, **kwargs) -> CostModel:
    """Build a cost model by name ('calibrated', 'roofline', 'constant', 'profiled'); extra kwargs go to it
    (the calibrated and roofline models take ep=N, expert parallelism over N GPUs)."""
    try:
        factory = COST_MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; known: {', '.join(sorted(COST_MODELS))}") \
            from None
    return factory(get_model(model), get_gpu(gpu), tp, profile_path=profile_path, **kwargs)

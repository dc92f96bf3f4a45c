"""What the hybrid families' cost tests compare to price a mixer's own all-reduces (Jamba's
x_proj, MiniMax's lightning variance): the roofline, calibrated and engine models of a spec at
64 tokens with them, and again with them taken out (ModelSpec.mixer_all_reduces and
layer_ops.mixer_all_reduce_bytes emptied for the rest of the test)."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.models import ModelSpec
from pagesim.sim.cost import layer_ops
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.engine import EngineCostModel
from pagesim.sim.cost.roofline import RooflineCostModel

TOKENS = 64


@dataclass
class Priced:
    roof: RooflineCostModel  # with the mixer's all-reduces
    cal: CalibratedCostModel  # (pure: its layer_seconds reads the spec as it is when asked)
    engine: EngineCostModel
    layers_with: list  # cal.layer_seconds(TOKENS) with them, and without
    layers_without: list
    token_part_with: tuple  # engine._token_part(TOKENS, True) with them, and without
    token_part_without: tuple
    roof_without: RooflineCostModel


def priced_with_and_without(spec: ModelSpec, gpu: str, tp: int, monkeypatch) -> Priced:
    roof, cal, engine = RooflineCostModel(spec, gpu, tp), CalibratedCostModel(spec, gpu, tp), EngineCostModel(spec, gpu, tp)
    layers_with, token_part_with = cal.layer_seconds(TOKENS), engine._token_part(TOKENS, True)
    monkeypatch.setattr(ModelSpec, "mixer_all_reduces", property(lambda self: (0, 0)))
    monkeypatch.setattr(layer_ops, "mixer_all_reduce_bytes", lambda *args: ())
    return Priced(roof, cal, engine, layers_with, cal.layer_seconds(TOKENS), token_part_with,
                  EngineCostModel(spec, gpu, tp)._token_part(TOKENS, True), RooflineCostModel(spec, gpu, tp))

"""Step cost of Falcon-H1's parallel-mixer layers (Falcon-H1-7B-Instruct, h100-80gb): every layer
runs the attention GEMMs AND the Mamba2 GEMMs, the rotary kernel AND the conv and gated norm, and
three TP all-reduces (attention's o_proj and the mixer's out_proj are row-parallel each, vLLM's
FalconH1ParallelHybrid sums their reduced outputs; then the MLP's); both the attention and the
recurrent kernel run in every layer. The replay CLI on it, and prefix caching refused as for
every model with state layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.models import load_model_config
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.engine import EngineCostModel
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.linear_attn import state_work
from pagesim.sim.cost.roofline import RooflineCostModel

from tests.sim.hybrid_replay import replays_and_refuses_prefix_caching

CONFIG = Path(__file__).parents[1] / "models" / "data" / "Falcon-H1-7B-Instruct.json"


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_layer_groups_hold_both_mixers_by_hand(spec):
    (group,) = layer_groups(spec, 64, tp=2)
    assert group.num_layers == 44
    assert [(x.op, x.m, x.k, x.n) for x in group.gemms] == [
        # attention: q (12 / 2 heads of 128) and k, v (1 of the 2 KV heads each), o
        ("attn_pre_proj", 64, 3072, 768 + 2 * 128), ("attn_post_proj", 64, 768, 3072),
        # Mamba2: in_proj z and x (2 x 1,536), B and C (the 1 group replicated: 2 x 256), dt (12 heads); out_proj
        ("mamba_in_proj", 64, 3072, 2 * 1536 + 2 * 256 + 12), ("mamba_out_proj", 64, 1536, 3072),
        # gated MLP: gate and up (2 x 12,288 / 2), down
        ("mlp_up_proj", 64, 3072, 12288), ("mlp_down_proj", 64, 6144, 3072)]
    shape = group.shape
    assert shape.rotary and shape.blocks == 2 and shape.all_reduces == 3
    assert shape.elementwise_operators[0] == ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act",
                                              "add")
    assert group.mixer_bytes == (2 * 64 * 2048 * 2, 3 * 64 * 1536 * 2)  # conv over x, B, C; the gate


def test_linear_params_all_reduces_and_kernels_by_hand(spec):
    h = 3072
    attention, mamba = 2 * h * 1536 + 2 * h * 256, h * (2 * 3072 + 512 + 24) + 3072 * h
    assert spec.linear_params == 44 * (attention + mamba + 3 * h * 12288)
    assert spec.num_blocks == 88 and spec.num_tp_all_reduces == 132 and spec.num_mixer_kernels == 88
    engine = EngineCostModel(spec, "h100-80gb", 2)
    assert (engine.blocks, engine.layers) == (132, 88)
    roof = RooflineCostModel(spec, "h100-80gb", 2)
    assert roof._allreduce_fixed_s == pytest.approx(132 * roof._collective_latency_s, rel=1e-12)
    cal = CalibratedCostModel(spec, "h100-80gb", 2)
    a = cal.calibration.attention
    assert cal._dec_floor == pytest.approx(88 * a.decode_floor_s, rel=1e-12)
    # attention over all 44 layers, the recurrent kernel over all 44 too
    assert spec.attention_flops_per_pair == 2 * 12 * 256 * 44
    assert state_work(spec, 2).decode_bytes_per_seq == 44 * 2 * spec.linear_attn.state_bytes_per_layer(2)


def test_replay_cli_runs_and_refuses_prefix_caching():
    replays_and_refuses_prefix_caching(CONFIG, block_note="block size 1568")

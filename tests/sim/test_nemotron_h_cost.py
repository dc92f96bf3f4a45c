"""Step cost of Nemotron-H's one-block layers (NVIDIA-Nemotron-Nano-9B-v2, h100-80gb): each layer is
a Mamba2 mixer, an attention mixer or an MLP alone, so its GEMMs are that block's only (an MLP
layer: up and down, no gate, relu2), one norm, one residual add and one TP all-reduce a layer;
the replay CLI on it, and prefix caching refused as for every model with state layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.models import load_model_config
from pagesim.sim.cost.engine import EngineCostModel
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.roofline import RooflineCostModel

from tests.sim.hybrid_replay import replays_and_refuses_prefix_caching

CONFIG = Path(__file__).parents[1] / "models" / "data" / "NVIDIA-Nemotron-Nano-9B-v2.json"


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_layer_groups_are_one_block_each_by_hand(spec):
    groups = layer_groups(spec, 64, tp=2)
    shapes = [(g.num_layers, [(x.op, x.m, x.k, x.n) for x in g.gemms]) for g in groups]
    assert shapes == [
        # attention: q (40 / 2 heads of 128) and k, v (4 of the 8 KV heads each), o
        (4, [("attn_pre_proj", 64, 4480, 2560 + 2 * 512), ("attn_post_proj", 64, 2560, 4480)]),
        # Mamba2: in_proj z and x (2 x 5,120), B and C (2 x 4 groups x 128), dt (64 heads); out_proj
        (27, [("mamba_in_proj", 64, 4480, 2 * 5120 + 2 * 4 * 128 + 64), ("mamba_out_proj", 64, 5120, 4480)]),
        # relu2 MLP: up (15,680 / 2, no gate beside it) and down
        (25, [("mlp_up_proj", 64, 4480, 7840), ("mlp_down_proj", 64, 7840, 4480)]),
    ]
    attention, mamba, mlp = (g.shape for g in groups)
    assert [s.blocks for s in (attention, mamba, mlp)] == [1, 1, 1]
    assert mlp.elementwise_operators == (("input_layernorm", "mlp_act", "add"), 0)
    assert attention.elementwise_operators == (("input_layernorm", "attn_rope", "add"), 0)
    assert not mamba.rotary and not mlp.rotary
    # relu2 reads and writes the up projection's output: 2 x 64 x 7,840 x 2 bytes (a gated one reads 3)
    assert mlp.elementwise_bytes("mlp_act", 64) == 2 * 64 * 7840 * 2
    assert groups[1].mixer_bytes == (2 * 64 * 6144 * 2, 3 * 64 * 5120 * 2)  # conv over x, B, C; gated norm


def test_linear_params_and_all_reduces_by_hand(spec):
    h = 4480
    mamba = h * (2 * 10240 + 2 * 8 * 128 + 128) + 10240 * h
    assert spec.linear_params == 27 * mamba + 25 * 2 * h * 15680 + 4 * (2 * h * 5120 + 2 * h * 1024)
    assert spec.num_blocks == 56  # one all-reduce a layer, not two
    assert EngineCostModel(spec, "h100-80gb", 2).blocks == 56
    roof = RooflineCostModel(spec, "h100-80gb", 2)
    assert roof._allreduce_fixed_s == pytest.approx(56 * roof._collective_latency_s, rel=1e-12)


def test_replay_cli_runs_and_refuses_prefix_caching():
    replays_and_refuses_prefix_caching(CONFIG)

"""Step cost of Nemotron 3's one-block MoE layers (NVIDIA-Nemotron-3-Nano-30B-A3B, h100-80gb): an
'E' layer is a norm and a MoE alone: the router (hidden -> 128, replicated), the shared expert
(up and down, no gate, split over TP) and the routed experts as one fused kernel of ungated relu2
experts (up: hidden -> moe_intermediate_size, not twice it), with the routing kernels, one
residual add and one TP all-reduce; shapes by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.models import load_model_config
from pagesim.sim.cost.engine import EngineCostModel
from pagesim.sim.cost.layer_ops import FUSED_MOE_OPS, layer_groups
from pagesim.sim.specs import profile_activation_bytes

CONFIG = Path(__file__).parents[1] / "models" / "data" / "NVIDIA-Nemotron-3-Nano-30B-A3B.json"
H = 2688


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_layer_groups_by_hand(spec):
    groups = layer_groups(spec, 64, tp=2)
    assert [g.num_layers for g in groups] == [6, 23, 23]  # attention, Mamba2, MoE: no dense MLP group
    attention, mamba, moe = groups
    # attention: q (32 / 2 heads of 128) and k, v (one of the 2 KV heads each), o
    assert [(x.op, x.k, x.n) for x in attention.gemms] == [("attn_pre_proj", H, 2048 + 2 * 128),
                                                           ("attn_post_proj", 2048, H)]
    # Mamba2: z and x (2 x 2,048), B and C (2 x 4 groups x 128), dt (32 heads); out_proj
    assert [(x.op, x.k, x.n) for x in mamba.gemms] == [("mamba_in_proj", H, 2 * 2048 + 2 * 4 * 128 + 32),
                                                       ("mamba_out_proj", 2048, H)]
    touched = 128 * (1 - (1 - 6 / 128) ** 64)  # distinct experts 64 tokens route to, top 6 of 128
    up, down = FUSED_MOE_OPS
    assert [(x.op, x.m, x.k, x.n) for x in moe.gemms[:3]] == [
        ("moe_router", 64, H, 128), ("moe_shared_up", 64, H, 3712 // 2), ("moe_shared_down", 64, 3712 // 2, H)]
    assert [(x.op, x.k, x.n) for x in moe.gemms[3:]] == [(up, H, 1856 // 2), (down, 1856 // 2, H)]  # no gate
    for gemm in moe.gemms[3:]:
        assert gemm.count == pytest.approx(touched, rel=1e-12)
        assert gemm.m * gemm.count == pytest.approx(64 * 6, rel=1e-12)  # every routed (token, expert) row once
    assert len(moe.routing_bytes) == 3 and moe.ep_exchange_bytes == 0
    shape = moe.shape
    assert shape.blocks == 1 and shape.all_reduces == 1 and not shape.rotary
    assert shape.elementwise_operators == (("input_layernorm", "mlp_act", "add"), 0)
    # relu2 reads and writes the up outputs of each token's 6 experts and the shared one, half a GPU's
    assert shape.elementwise_bytes("mlp_act", 64) == 2 * 64 * (6 * 1856 + 3712) // 2 * 2


def test_gemm_flops_match_the_parameter_count(spec):
    """At TP 1 every GEMM row times its weights, over all layers, is 2 FLOPs a weight a token runs
    through: spec.linear_params, from the parameter count (top 6 of the routed experts)."""
    tokens = 100
    flops = sum(g.num_layers * sum(2 * x.m * x.count * x.k * x.n for x in g.gemms)
                for g in layer_groups(spec, tokens, tp=1))
    assert flops == pytest.approx(2 * tokens * spec.linear_params, rel=1e-12)
    mamba = H * (2 * 4096 + 2 * 8 * 128 + 64) + 4096 * H
    moe = H * 128 + 2 * H * 3712 + 6 * 2 * H * 1856
    assert spec.linear_params == 23 * mamba + 6 * (2 * H * 4096 + 2 * H * 256) + 23 * moe


def test_blocks_and_fused_moe_activations(spec):
    assert spec.num_blocks == 52 and EngineCostModel(spec, "h100-80gb", 1).blocks == 52  # one all-reduce a layer
    # the fused MoE's caches per routed pair: up output, activation (1,856 each, no gate) and down output
    t = 8192
    assert profile_activation_bytes(spec, 1, t, 256) >= t * 6 * (2 * 1856 + H) * 2
    assert profile_activation_bytes(spec, 1, t, 256) < t * 6 * (3 * 1856 + H) * 2  # not the gated 3 x 1,856

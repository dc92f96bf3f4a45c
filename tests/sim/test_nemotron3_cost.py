"""Step cost of Nemotron 3's one-block MoE layers (NVIDIA-Nemotron-3-Nano-30B-A3B, h100-80gb): an
'E' layer is a norm and a MoE alone: the router (hidden -> 128, replicated), the shared expert
(up and down, no gate, split over TP) and the routed experts as one fused kernel of ungated relu2
experts (up: hidden -> moe_intermediate_size, not twice it), with the routing kernels, one
residual add and one TP all-reduce; shapes by hand."""

from __future__ import annotations

import json
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


# ------------------------------------------------------------------ latent MoE (Nemotron 3 Super)

L = 1024  # the Nano's shapes with moe_latent_size 1,024: not a released model (no Super config.json was found)


@pytest.fixture(scope="module")
def latent(tmp_path_factory):
    path = tmp_path_factory.mktemp("latent") / "config.json"
    path.write_text(json.dumps({**json.loads(CONFIG.read_text()), "moe_latent_size": L}))
    return load_model_config(path)


def test_latent_layer_by_hand_at_tp2(latent):
    moe = layer_groups(latent, 64, tp=2)[2]
    up, down = FUSED_MOE_OPS
    # router and shared expert on the hidden width, split as before; the two latent projections replicated
    # (whole on each GPU); the routed experts between them, latent-wide: up k = 1,024, down n = 1,024
    assert [(x.op, x.m, x.k, x.n) for x in moe.gemms if x.count == 1] == [
        ("moe_router", 64, H, 128), ("moe_shared_up", 64, H, 3712 // 2), ("moe_shared_down", 64, 3712 // 2, H),
        ("moe_latent_in", 64, H, L), ("moe_latent_out", 64, L, H)]
    assert [(x.op, x.k, x.n) for x in moe.gemms[4:6]] == [(up, L, 1856 // 2), (down, 1856 // 2, L)]
    assert [x.op for x in moe.gemms] == ["moe_router", "moe_shared_up", "moe_shared_down", "moe_latent_in", up, down,
                                         "moe_latent_out"]
    # moe_sum reads each token's 6 latent expert outputs and writes one latent vector
    assert moe.routing_bytes[2] == 64 * (6 + 1) * L * 2
    # vLLM sums the routed output over TP in the latent width before fc2_latent_proj: one more all-reduce
    assert moe.mixer_all_reduce_bytes == (64 * L * 2,) and latent.mixer_all_reduces == (23, L)
    assert layer_groups(latent, 64, tp=1)[2].mixer_all_reduce_bytes == ()
    # expert parallelism over 2 GPUs at TP 1: the exchange moves latent vectors of both ranks' tokens
    assert layer_groups(latent, 64, tp=1, ep=2)[2].ep_exchange_bytes == 2 * 64 * L * 2


def test_latent_gemm_flops_match_the_parameter_count(latent):
    tokens = 100
    flops = sum(g.num_layers * sum(2 * x.m * x.count * x.k * x.n for x in g.gemms)
                for g in layer_groups(latent, tokens, tp=1))
    # the active matmul weights from the parameter counts: every active weight but the embedding row,
    # the norms, Mamba's conv / A / D / dt / norm and the router's bias; LM head apart (not a layer GEMM)
    assert flops == pytest.approx(2 * tokens * latent.linear_params, rel=1e-12)
    mamba = H * (2 * 4096 + 2 * 8 * 128 + 64) + 4096 * H
    moe = H * 128 + 2 * H * 3712 + 2 * H * L + 6 * 2 * L * 1856
    assert latent.linear_params == 23 * mamba + 6 * (2 * H * 4096 + 2 * H * 256) + 23 * moe
    other = 23 * (H + 5 * 6144 + 3 * 64 + 4096) + 6 * H + 23 * (H + 128) + H  # norms, Mamba's non-matmul, router bias
    assert latent.linear_params == latent.params_active - 2 * 131072 * H - other


def test_latent_fused_moe_activations(latent, spec):
    t = 8192  # per routed pair: up output and activation (1,856 each), the down output now 1,024 wide
    assert profile_activation_bytes(latent, 1, t, 256) >= t * 6 * (2 * 1856 + L) * 2
    assert profile_activation_bytes(latent, 1, t, 256) < profile_activation_bytes(spec, 1, t, 256)

"""Step cost of MiniMax-M1's lightning-attention layers on h200-141gb at TP 8 (70 of its 80 layers;
pagesim/models/lightning.py, pagesim/sim/cost/linear_attn.py): the three GEMMs split over TP, the
elementwise kernels vLLM runs eagerly, the recurrent kernel's state work by hand (decode: the
state read and written once a layer, memory-bound; prefill: vLLM's blocked lightning_attention),
and the all-reduce of the norm's variance every lightning layer adds at TP > 1, in the roofline,
calibrated and engine models. Every term is a roofline: nothing of it was measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.models import load_model_config
from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.linear_attn import state_work
from pagesim.sim.cost.roofline import RooflineCostModel
from tests.sim.mixer_all_reduces import priced_with_and_without

CONFIG = Path(__file__).parents[1] / "models" / "data" / "MiniMax-M1.json"
H200_BW = 4800e9  # bytes/s (datasheet)
HEADS, D, W = 8, 128, 1024  # per GPU at TP 8: 64 / 8 lightning heads of 128; W = 8 x 128


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_lightning_layer_groups_by_hand(spec):
    groups = layer_groups(spec, 64, tp=8)
    assert [g.num_layers for g in groups] == [10, 70]
    softmax, lightning = groups
    assert [(x.op, x.m, x.k, x.n) for x in lightning.gemms[:3]] == [
        ("la_qkv_proj", 64, 6144, 3 * W), ("la_output_gate", 64, 6144, W), ("la_out_proj", 64, W, 6144)]
    assert lightning.gemms[3:] == softmax.gemms[2:]  # the same MoE after either mixer
    assert not lightning.shape.rotary and softmax.shape.rotary and lightning.shape.all_reduces == 2
    w = 64 * W  # elements of q (or k, v, the gate, the output) for 64 tokens on one GPU
    assert lightning.mixer_bytes == (
        3 * w * (2 + 4),       # qkv (bf16) cast to fp32
        3 * w * 8,             # SiLU, fp32 in and out
        3 * w * 8,             # q, k, v copied heads-first
        w * 4 + 2 * w * 8,     # the norm: variance read; normalize and weight, read and written
        2 * w * 2,             # sigmoid of the gate (bf16)
        w * (2 + 4 + 4),       # gate x norm output (bf16 x fp32 -> fp32)
        w * (4 + 2))           # cast back to bf16
    assert lightning.mixer_all_reduce_bytes == (64 * 1 * 2,)  # the variance, one value a token
    assert softmax.mixer_all_reduce_bytes == () and layer_groups(spec, 64, tp=1)[1].mixer_all_reduce_bytes == ()


def test_state_work_by_hand(spec):
    w = state_work(spec, 8)
    # decode: the state, 8 heads x 128 x 128 bf16 = 262,144 bytes a layer, read and written in 70 layers
    assert w.decode_bytes_per_seq == 70 * 2 * 262_144 == 36_700_160
    assert w.decode_flops_per_seq == 70 * HEADS * 5 * D * D  # k v^T, + decayed S, q S: 5 FLOPs an element
    # prefill, a head and token: diagonal blocks 2 d (256 + 32) = 73,728, block states and q S 4 d^2 = 65,536
    assert w.prefill_flops_per_token == 70 * HEADS * (73_728 + 65_536) == 77_987_840
    # fp32 q, k, v twice, the output three times (9 x 128 x 4 = 4,608 a head); the block states'
    # 9 passes of 128 x 128 x 4 bytes every 256 tokens (2,304 a head)
    assert w.prefill_bytes_per_token == 70 * HEADS * (4_608 + 2_304) == 3_870_720
    assert w.prefill_bytes_per_seq == w.decode_bytes_per_seq


def test_decode_state_term_by_hand(spec):
    roof = RooflineCostModel(spec, "h200-141gb", 8)
    b = 64
    shape = BatchShape(num_decode_seqs=b, decode_context_tokens=b * 1000, block_size=512)
    # memory-bound: 64 x 36,700,160 bytes at 0.85 x 4.8 TB/s (the roofline's HBM efficiency): 576 us
    by_hand = b * 36_700_160 / (H200_BW * 0.85)
    assert by_hand == pytest.approx(575.7e-6, rel=1e-3)
    assert roof.breakdown(shape)["linear_attention"] == pytest.approx(by_hand, rel=1e-12)
    cal = CalibratedCostModel(spec, "h200-141gb", 8)
    per_byte = cal.calibration.attention.decode_s_per_kv_byte
    assert cal._state_dec_per_seq == pytest.approx(per_byte * 36_700_160, rel=1e-12)


def test_variance_all_reduces_are_priced(spec, monkeypatch):
    assert spec.mixer_all_reduces == (70, 1) and spec.num_tp_all_reduces == 160
    p = priced_with_and_without(spec, "h200-141gb", 8, monkeypatch)
    assert p.roof._allreduce_fixed_s == pytest.approx((160 + 70) * p.roof._collective_latency_s, rel=1e-12)
    assert p.roof_without._allreduce_fixed_s == pytest.approx(160 * p.roof._collective_latency_s, rel=1e-12)
    (_, lightning), (_, plain) = p.layers_with[1], p.layers_without[1]
    assert lightning - plain == pytest.approx(p.cal.calibration.all_reduce_seconds(8, 64 * 2), rel=1e-9)
    assert p.layers_with[0] == p.layers_without[0]  # the softmax layers: none
    _, _, fixed, calls = p.token_part_without
    assert p.token_part_with[3] - calls == pytest.approx(70 * p.engine._ar_group_factor)
    assert p.token_part_with[2] - fixed == pytest.approx(70 * 64 * 2 * p.engine._ar_s_per_byte)

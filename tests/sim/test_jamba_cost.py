"""Step cost of Jamba's Mamba v1 layers (AI21-Jamba-Mini-1.6, h100-80gb, TP 2): the four Mamba
GEMMs split over TP, the conv and the dt/B/C norms as elementwise kernels, the recurrent kernel's
state work by hand, and the all-reduce vLLM's row-parallel x_proj adds in every Mamba layer
(28 of them, 288 elements a token: dt rank 256 + 2 x d_state 16) in the roofline, calibrated and
engine models. The replay CLI on it, and prefix caching refused as for every model with state layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.models import load_model_config
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.linear_attn import state_work

from tests.sim.hybrid_replay import replays_and_refuses_prefix_caching
from tests.sim.mixer_all_reduces import priced_with_and_without

CONFIG = Path(__file__).parents[1] / "models" / "data" / "AI21-Jamba-Mini-1.6.json"
XPROJ = 256 + 2 * 16  # x_proj's output a token: dt, B, C


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_mamba_layer_groups_by_hand(spec):
    groups = layer_groups(spec, 64, tp=2)
    # dense and MoE layers, each split into attention and Mamba layers in proportion (4 of 32 attend)
    assert [g.num_layers for g in groups] == [2, 14, 2, 14]
    mamba = groups[1]
    assert [(x.op, x.m, x.k, x.n) for x in mamba.gemms] == [
        # in_proj x and z (2 x 8,192 / 2), x_proj (row-parallel: 4,096 in, dt B C out), dt_proj, out_proj
        ("mamba_in_proj", 64, 4096, 8192), ("mamba_x_proj", 64, 4096, XPROJ), ("mamba_dt_proj", 64, 256, 4096),
        ("mamba_out_proj", 64, 4096, 4096), ("mlp_up_proj", 64, 4096, 14336), ("mlp_down_proj", 64, 7168, 4096)]
    assert not mamba.shape.rotary and mamba.shape.all_reduces == 2
    # conv over 4,096 channels; the dt (256), B and C (16) norms: read and write, bf16
    assert mamba.mixer_bytes == (2 * 64 * 4096 * 2, 2 * 64 * 256 * 2, 2 * 64 * 16 * 2, 2 * 64 * 16 * 2)
    assert mamba.mixer_all_reduce_bytes == (64 * XPROJ * 2,)
    assert layer_groups(spec, 64, tp=1)[1].mixer_all_reduce_bytes == ()  # no all-reduce on one GPU
    assert groups[0].mixer_all_reduce_bytes == ()  # attention layers: none


def test_linear_params_and_state_work_by_hand(spec):
    h, i = 4096, 8192
    mamba = h * 2 * i + i * XPROJ + 256 * i + i * h
    attention = 2 * h * 4096 + 2 * h * 1024
    mlp = 3 * h * 14336
    assert spec.linear_params == 28 * mamba + 4 * attention + 16 * mlp + 16 * (h * 16 + 2 * mlp)
    assert spec.mixer_all_reduces == (28, XPROJ) and spec.num_tp_all_reduces == 64
    work = state_work(spec, 2)
    assert work.decode_bytes_per_seq == 28 * 2 * (3 * 4096 + 4096 * 16) * 2
    assert work.decode_flops_per_seq == work.prefill_flops_per_token == 28 * 7 * 4096 * 16
    assert work.prefill_bytes_per_token == 28 * (4 * 4096 + 2 * 16) * 2  # x, z, dt, y; B, C
    assert work.prefill_bytes_per_seq == work.decode_bytes_per_seq


def test_x_proj_all_reduces_are_priced(spec, monkeypatch):
    p = priced_with_and_without(spec, "h100-80gb", 2, monkeypatch)
    roof = p.roof
    assert roof._allreduce_fixed_s == pytest.approx((64 + 28) * roof._collective_latency_s, rel=1e-12)
    ring, ic = 2 * (2 - 1) / 2, roof.gpu.collective_bandwidth * roof.constants.interconnect_efficiency
    assert roof._allreduce_s_per_token - p.roof_without._allreduce_s_per_token == \
        pytest.approx(28 * ring * XPROJ * 2 / ic)
    layers = dict(zip(("attn", "mamba", "moe_attn", "moe_mamba"), zip(p.layers_with, p.layers_without)))
    one = p.cal.calibration.all_reduce_seconds(2, 64 * XPROJ * 2)
    assert layers["mamba"][0][1] - layers["mamba"][1][1] == pytest.approx(one, rel=1e-9)
    assert layers["attn"][0] == layers["attn"][1]
    # the engine: 28 more all-reduces of 36,864 bytes, custom all-reduce on NVLink at TP 2
    _, _, fixed, calls = p.token_part_without
    assert p.token_part_with[3] - calls == pytest.approx(28 * p.engine._ar_group_factor)
    assert p.token_part_with[2] - fixed == pytest.approx(28 * 64 * XPROJ * 2 * p.engine._ar_s_per_byte)


def test_replay_cli_runs_and_refuses_prefix_caching():
    replays_and_refuses_prefix_caching(CONFIG, "--tp", "2", "--max-model-len", "32768", block_note="block size 80")

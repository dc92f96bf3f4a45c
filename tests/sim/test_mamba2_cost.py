"""Step cost of Granite-4.0-H-Tiny's Mamba2 layers on h100-80gb at TP 1 (pagesim/sim/cost/linear_attn.py's
Mamba2 kernel terms): the state work by hand, the decode and prefill state terms against the roofline,
the layer GEMMs, and the replay CLI on the model (50 requests finish at the raised block size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import load_model_config
from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.linear_attn import state_work
from pagesim.sim.cost.roofline import RooflineCostModel

from tests.sim.test_state_cost import H100_BW, H100_FP16  # (the H100 datasheet figures)

CONFIG = Path(__file__).parents[1] / "models" / "data" / "granite-4.0-h-tiny.json"


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_state_work_by_hand(spec):
    w = state_work(spec, 1)
    # the state of 806,400 bytes a layer is read and written once in each of the 36 Mamba2 layers
    assert w.decode_bytes_per_seq == 36 * 2 * 806_400 == 58_060_800
    # selective_state_update: 5 FLOPs an element of the 48 x 64 x 128 SSM state
    assert w.decode_flops_per_seq == 36 * 5 * 48 * 64 * 128
    # SSD, Q = 256: C B^T per group 2 Q N = 65,536; per head 2 Q P + 4 P N = 32,768 + 32,768
    assert w.prefill_flops_per_token == 36 * (65_536 + 48 * 65_536) == 115_605_504
    # x, y (2 x 3,072), B, C (2 x 128), dt (48), bf16: 12,896; chunk states 2 x 48 x 64 x 128 x 2 / 256 = 6,144
    assert w.prefill_bytes_per_token == 36 * (12_896 + 6_144)
    assert w.prefill_bytes_per_seq == w.decode_bytes_per_seq
    # TP 4: 12 heads a GPU, the group replicated (1 a GPU)
    assert state_work(spec, 4).prefill_flops_per_token == 36 * (65_536 + 12 * 65_536)


def test_decode_state_term_of_64_sequences_by_hand(spec):
    roof = RooflineCostModel(spec, "h100-80gb", 1)
    b = 64
    shape = BatchShape(num_decode_seqs=b, decode_context_tokens=b * 1000, block_size=400)
    by_hand = b * 58_060_800 / (H100_BW * 0.85)  # memory-bound at the roofline's HBM efficiency
    assert by_hand == pytest.approx(1.305e-3, rel=1e-3)
    assert roof.breakdown(shape)["linear_attention"] == pytest.approx(by_hand, rel=1e-12)
    assert b * 36 * 5 * 48 * 64 * 128 / (H100_FP16 * 0.5) < by_hand / 10
    cal = CalibratedCostModel(spec, "h100-80gb", 1)
    per_byte = cal.calibration.attention.decode_s_per_kv_byte
    assert cal._state_dec_per_seq * b == pytest.approx(b * 58_060_800 * per_byte, rel=1e-12)


def test_prefill_state_term_by_hand(spec):
    roof = RooflineCostModel(spec, "h100-80gb", 1)
    shape = BatchShape(num_prefill_seqs=1, num_prefill_tokens=2048, prefill_attn_pairs=2048 * 2049 // 2, block_size=400)
    compute = 2048 * 115_605_504 / (H100_FP16 * 0.5)
    nbytes = (2048 * 36 * 19_040 + 58_060_800) / (H100_BW * 0.85)
    assert nbytes > compute  # 479 us of FLOPs at half peak against 513 us of bytes
    assert roof.breakdown(shape)["linear_attention"] == pytest.approx(nbytes, rel=1e-12)


def test_layer_groups_split_attention_and_mamba_layers(spec):
    groups = layer_groups(spec, 64, 1)
    assert [g.num_layers for g in groups] == [4, 36]
    attn, mamba = ({g.op: (g.k, g.n) for g in grp.gemms} for grp in groups)
    assert attn["attn_pre_proj"] == (1536, 1536 + 2 * 512)
    # in_proj: z and x (2 x 3,072), B and C (2 x 128), dt (48); out_proj 3,072 -> 1,536
    assert mamba["mamba_in_proj"] == (1536, 6448) and mamba["mamba_out_proj"] == (3072, 1536)
    assert "attn_pre_proj" not in mamba
    assert groups[1].mixer_bytes == (2 * 64 * 3328 * 2, 3 * 64 * 3072 * 2)  # conv over x, B, C; gated norm
    # TP 4: 768 + 768 + 2 x 128 (the group replicated) + 12
    tp4 = {g.op: (g.k, g.n) for g in layer_groups(spec, 64, 4)[1].gemms}
    assert tp4["mamba_in_proj"] == (1536, 1804) and tp4["mamba_out_proj"] == (768, 1536)


def test_replay_cli_runs_granite(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--num-requests", "50", "--model", str(CONFIG),
                                      "--gpu", "h100-80gb", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 50 and summary["num_rejected"] == 0 and summary["failed"] == 0
    assert summary["config"]["block_size"] == 400
    assert any(n.startswith("block size 400 (not 16)") for n in summary["notes"])

"""Step cost of Qwen3-Next's linear-attention (Gated DeltaNet) layers on h100-80gb at TP 4: the
recurrent kernel's state term by hand against the roofline and calibrated models
(pagesim/sim/cost/linear_attn.py), the layer GEMMs, decode runs equal to step-by-step pricing,
and the replay CLI on the model (50 requests finish, none rejected, at the raised block size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import load_model_config
from pagesim.sim.cost.base import BatchShape
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.engine import EngineCostModel
from pagesim.sim.cost.layer_ops import layer_groups
from pagesim.sim.cost.linear_attn import state_work
from pagesim.sim.cost.roofline import RooflineCostModel

CONFIG = Path(__file__).parents[1] / "models" / "data" / "Qwen3-Next-80B-A3B-Instruct.json"
H100_BW = 3350e9  # bytes/s (datasheet)
H100_FP16 = 989.5e12


@pytest.fixture(scope="module")
def spec():
    return load_model_config(CONFIG)


def test_state_work_by_hand(spec):
    w = state_work(spec, 4)
    # per layer and GPU the state is 274,432 bytes (conv 3 x 2,048 + recurrent 8 x 128 x 128, bf16):
    # a decode step reads and writes it once in each of the 36 layers
    assert w.decode_bytes_per_seq == 36 * 2 * 274_432 == 19_759_104
    assert w.decode_flops_per_seq == 36 * 8 * 7 * 128 * 128
    # chunked prefill (C = 64): 6 d_k d_v + 2 C (3 d_k + 2 d_v) = 98,304 + 81,920 = 180,224 a head and token
    assert w.prefill_flops_per_token == 36 * 8 * 180_224 == 51_904_512
    # q, k, v, o (8 heads x (2 x 128 + 2 x 128)) and g, beta (2 x 8), bf16: 8,224; chunk states 2 x 8 x 128^2 x 2 / 64 = 8,192
    assert w.prefill_bytes_per_token == 36 * (8_224 + 8_192)
    assert w.prefill_bytes_per_seq == w.decode_bytes_per_seq
    assert state_work(load_model_config(Path(__file__).parents[1] / "models" / "data" / "gemma-3-12b-it.json"), 1) is None


def test_decode_state_term_of_64_sequences_by_hand(spec):
    roof = RooflineCostModel(spec, "h100-80gb", 4)
    b = 64
    shape = BatchShape(num_decode_seqs=b, decode_context_tokens=b * 1000, block_size=272)
    # memory-bound: 64 x 19,759,104 bytes = 1,264,582,656 at 0.85 x 3.35 TB/s (the roofline's HBM efficiency)
    by_hand = b * 36 * 2 * 274_432 / (H100_BW * 0.85)
    assert by_hand == pytest.approx(444.1e-6, rel=1e-3)
    assert roof.breakdown(shape)["linear_attention"] == pytest.approx(by_hand, rel=1e-12)
    # its FLOPs (7 a state element) at the attention rate (0.5 x peak) take far less: memory-bound
    assert b * 36 * 8 * 7 * 128 * 128 / (H100_FP16 * 0.5) < by_hand / 10
    assert sum(roof.breakdown(shape).values()) == pytest.approx(roof.iteration_time(shape), rel=1e-12)
    # calibrated: the same bytes at the decode KV read's fitted seconds a byte
    cal = CalibratedCostModel(spec, "h100-80gb", 4)
    per_byte = cal.calibration.attention.decode_s_per_kv_byte
    assert cal._state_dec_per_seq * b == pytest.approx(b * 19_759_104 * per_byte, rel=1e-12)
    plain = CalibratedCostModel(spec, "h100-80gb", 4)
    plain._state = False
    assert cal.iteration_time(shape) - plain.iteration_time(shape) == pytest.approx(b * 19_759_104 * per_byte, rel=1e-9)


def test_prefill_state_term_by_hand(spec):
    roof = RooflineCostModel(spec, "h100-80gb", 4)
    shape = BatchShape(num_prefill_seqs=1, num_prefill_tokens=2048, prefill_attn_pairs=2048 * 2049 // 2, block_size=272)
    compute = 2048 * 51_904_512 / (H100_FP16 * 0.5)
    nbytes = (2048 * 36 * 16_416 + 19_759_104) / (H100_BW * 0.85)
    assert roof.breakdown(shape)["linear_attention"] == pytest.approx(max(compute, nbytes), rel=1e-12)


def test_decode_runs_price_as_steps(spec):
    for model in (RooflineCostModel(spec, "h100-80gb", 4), CalibratedCostModel(spec, "h100-80gb", 4),
                  EngineCostModel(spec, "h100-80gb", 4)):
        runs = model.decode_run_durations(64, 64_000, 3, 272)
        assert runs == [model.iteration_time(BatchShape(num_decode_seqs=64, decode_context_tokens=64_000 + 64 * i,
                                                        block_size=272)) for i in range(3)]


def test_layer_groups_split_attention_and_linear_layers(spec):
    groups = layer_groups(spec, 64, 4)
    assert [g.num_layers for g in groups] == [12, 36]
    attn, linear = ({g.op: (g.k, g.n) for g in grp.gemms} for grp in groups)
    # gated attention: q (16 x 256 / 4 = 1,024) twice (the output gate), K and V 1 head each: 2 x 1,024 + 2 x 256
    assert attn["attn_pre_proj"] == (2048, 2560) and attn["attn_post_proj"] == (1024, 2048)
    # DeltaNet: in_proj_qkvz (2 x 2,048 + 2 x 4,096) / 4, in_proj_ba 2 x 32 / 4, out_proj 4,096 / 4 -> 2,048
    assert linear["la_in_proj_qkvz"] == (2048, 3072) and linear["la_in_proj_ba"] == (2048, 16)
    assert linear["la_out_proj"] == (1024, 2048) and "attn_pre_proj" not in linear
    assert groups[1].mixer_bytes == (2 * 64 * 8192 // 4 * 2, 3 * 64 * 4096 // 4 * 2)  # conv, gated norm
    assert not groups[1].shape.rotary


def test_replay_cli_runs_qwen3_next(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--num-requests", "50", "--model", str(CONFIG),
                                      "--gpu", "h100-80gb", "--tp", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 50 and summary["num_rejected"] == 0 and summary["failed"] == 0
    assert summary["config"]["block_size"] == 272  # raised from the default 16, and said so
    assert any(n.startswith("block size 272 (not 16)") for n in summary["notes"])
    assert "50 of 50" in result.output

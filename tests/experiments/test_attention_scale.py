"""experiments/attention_scale: its decode shape by hand, and one cell of reports/sim2real_attention.md
reproduced by `pagesim validate` with an engine file that changes only the attention scale."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.experiments.attention_scale import decode_shape
from pagesim.experiments.sim2real import write_profile
from pagesim.workload.builders import default_data_dir

ROOT = Path(__file__).resolve().parents[2]
REAL = default_data_dir() / "real_vllm"
REPORT = ROOT / "reports" / "sim2real_attention.md"
RUN = "20260218-150304-codellama-34b-tp2-general"


def step(prefill: int, decodes: int, logical: int):
    return SimpleNamespace(num_prefill_tokens=prefill, num_decode_seqs=decodes, kv_blocks_logical=logical)


def test_decode_shape_by_hand():
    # decode-only steps: (2 seqs, 10 blocks) and (4 seqs, 6 blocks); the mixed and empty steps are not counted
    steps = [step(0, 2, 10), step(100, 3, 50), step(0, 4, 6), step(0, 0, 0)]
    validation = SimpleNamespace(replay=SimpleNamespace(metrics=SimpleNamespace(steps=steps)),
                                 config=SimpleNamespace(block_size=16))
    seqs, context = decode_shape(validation)
    assert seqs == pytest.approx((2 + 4) / 2)
    assert context == pytest.approx((10 * 16 / 2 + 6 * 16 / 4) / 2)  # 80 and 24 tokens a sequence


@pytest.mark.skipif(not REAL.exists(), reason=f"needs the shared real runs ({REAL}; set PAGESIM_DATA_DIR)")
def test_report_cell_is_what_validate_gives(tmp_path):
    from pagesim.sim.cost.engine import load_engine_profile

    row = next(line for line in REPORT.read_text().splitlines() if line.startswith(f"| {RUN} |"))
    header = next(line for line in REPORT.read_text().splitlines() if line.startswith("| run |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("E2E / TTFT / ITL at 1.2")
    cell = [c.strip() for c in row.strip("|").split("|")][column]
    e2e, ttft, itl = (float(v) for v in re.findall(r"([+-]\d+\.\d) %", cell))
    base = load_engine_profile("vllm-0.15")
    engine = tmp_path / "attention-1.2.json"
    write_profile(engine, replace(base, params=replace(base.params, attention_time_scale=1.2)), [])
    result = CliRunner().invoke(app, ["validate", str(REAL / "blis-h100-vllm0.15" / "replay_data" / f"{RUN}.json.gz"),
                                      "--gpu", "h100-80gb", "--engine", str(engine), "--json"])
    assert result.exit_code == 0, result.output
    overall = json.loads(result.output)["overall"]
    for metric, shown in (("e2e_mean", e2e), ("ttft_mean", ttft), ("itl_mean", itl)):
        assert 100 * overall[metric]["error"] == pytest.approx(shown, abs=0.051), metric

"""plan's step budget and --max-model-len: whole prompts of a long-context model's length
(Qwen3-VL-30B-A3B: 262,144 tokens) leave one H100 no KV pool. The runs chunk prompts past 32K
tokens, as vLLM does by default, at the GPU's budget; --max-model-len sets the length served (and
at 32K or less a step holds the longest prompt again)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core.errors import CannotServe
from pagesim.plan.grid import GridPoint, RunSettings
from pagesim.sim.specs import kv_cache_capacity

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "tests/models/data/Qwen3-VL-30B-A3B-Instruct.json")  # text_config max_position_embeddings 262,144
POINT = GridPoint(gpu="h100-80gb", tp=1, block_size=16, preemption="auto", max_num_seqs=256)


def test_settings_take_the_length_and_the_budget_follows():
    # past 32K tokens the runs chunk prompts (vLLM's default) at the GPU's budget; at 32K or less
    # a step holds the longest prompt, max(2560, the length)
    assert RunSettings(MODEL).chunked and RunSettings(MODEL).batched_tokens_on("h100-80gb") == 8_192
    assert RunSettings(MODEL).batched_tokens_on("a100-40gb") == 2_048
    assert RunSettings(MODEL, chunked_prefill=False).batched_tokens_on("h100-80gb") == 262_144
    short = RunSettings(MODEL, max_model_len=32_768)
    assert not short.chunked and short.batched_tokens_on("h100-80gb") == 32_768
    assert RunSettings(MODEL, max_model_len=1_000).batched_tokens_on("h100-80gb") == 2_560
    cfg = short.replay_config(POINT, 1.0)
    assert (cfg.max_model_len, cfg.max_num_batched_tokens, cfg.chunked_prefill) == (32_768, 32_768, False)
    with pytest.raises(CannotServe):  # whole prompts of 262,144 tokens leave no pool
        kv_cache_capacity(MODEL, "h100-80gb", 1, max_num_batched_tokens=262_144)
    assert kv_cache_capacity(MODEL, "h100-80gb", 1, max_num_batched_tokens=32_768).pool_bytes_per_gpu > 0
    with pytest.raises(ValueError, match="greater than .* maximum length, 262144 tokens"):
        RunSettings(MODEL, max_model_len=300_000)


def test_plan_cli_plans_a_long_context_model_on_one_gpu(tmp_path):
    args = ["plan", "--model", MODEL, "--trace", str(ROOT / "traces/sharegpt.json"), "--target-rate", "5",
            "--slo", "ttft_p99=2,tpot_p99=0.1", "--gpus", "h100-80gb", "--num-requests", "20", "--min-measured", "10",
            "--seeds", "1", "--check-longer", "0", "--min-duration", "1", "--no-cache", "--jobs", "1", "--json"]
    result = CliRunner().invoke(app, args + ["--out", str(tmp_path / "a"), "--max-model-len", "32768"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    (row,) = plan["results"]
    assert row["capacity"] > 0 and not any("no KV pool" in str(x) for x in row["limiting"])
    assert "--max-model-len 32768 --no-chunked-prefill --max-num-batched-tokens 32768" in plan["command"]
    # at its whole length the runs chunk, but one request of 262,144 tokens does not fit the pool
    # one H100 leaves beside 62 GB of weights: infeasible, with vLLM's reason and the length that fits
    full = CliRunner().invoke(app, args + ["--out", str(tmp_path / "c")])
    assert full.exit_code == 0, full.output
    (row,) = json.loads(full.output)["results"]
    assert row["capacity"] is None and "vLLM would refuse to start (lower --max-model-len to 172,032" in row["reason"]
    assert "--chunked-prefill" in json.loads(full.output)["command"]
    refused = CliRunner().invoke(app, args + ["--out", str(tmp_path / "b"), "--max-model-len", "300000"])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [refused.output.strip()]
    assert "--max-model-len 300000 is greater than" in refused.output

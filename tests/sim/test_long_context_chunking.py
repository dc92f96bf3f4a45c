"""Chunked prefill where a run leaves it unset, as vLLM decides it (presets.default_chunked_prefill):
vLLM's v0 engine args turn it on for a model longer than 32K tokens (32,768), unless the model has
a sliding window or layers with a per-sequence state, or prefix caching is on; v1 always chunks;
the reservation baselines never. A flag or a field that says it wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.sim.specs import kv_cache_capacity
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = load_trace(ROOT / "traces" / "sharegpt.json")
QWEN3_NEXT = str(ROOT / "tests" / "models" / "data" / "Qwen3-Next-80B-A3B-Instruct.json")


def built(**fields) -> Replay:
    return Replay(ReplayConfig(num_requests=5, **fields), TRACE)


def test_a_long_context_model_chunks_with_the_gpus_step_budget():
    run = built(model="llama-3.1-8b", gpu="a100-40gb")  # 131,072 tokens
    assert run.cfg.chunked_prefill and run.cfg.max_num_batched_tokens == 2048
    assert any(n.startswith("chunked prefill on (steps of 2,048 tokens): max_model_len 131,072") for n in run.notes)
    # the pool is the one a 2,048-token step leaves, not a 131,072-token one
    assert run.scheduler.kv.num_device_blocks == kv_cache_capacity(
        "llama-3.1-8b", "a100-40gb", max_num_batched_tokens=2048, max_num_seqs=256).num_blocks(16)


@pytest.mark.parametrize("fields", [
    dict(model="llama-3.1-8b", max_model_len=32768),   # at 32K, not over it
    dict(model="llama-3.1-8b", prefix_caching=True),   # v0 kept them apart
    dict(model="llama-3.1-8b", chunked_prefill=False),  # said so
    dict(model="llama-3.1-8b", policy="orca-max"),     # not vLLM
    dict(model="opt-13b"),                             # 2,048 tokens
])
def test_no_chunking_where_vllm_would_not(fields):
    run = built(gpu="h100-80gb", **fields)
    assert run.cfg.chunked_prefill is False
    assert not any(n.startswith("chunked prefill on") for n in run.notes)


def test_windows_and_state_layers_keep_whole_prompts():
    from pagesim.sim.presets import default_chunked_prefill
    from pagesim.sim.specs import get_model

    # long, but each with what v0's rule excludes: a sliding window, a state layer
    assert get_model("gemma-3-27b").max_model_len == 131_072
    assert not default_chunked_prefill("paged", get_model("gemma-3-27b"), 131_072, False)
    assert not default_chunked_prefill("paged", get_model(QWEN3_NEXT), 262_144, False)
    assert default_chunked_prefill("paged", get_model("llama-3.1-8b"), 32_769, False)
    assert default_chunked_prefill("vllm-v1", get_model("opt-13b"), 2048, True)


def test_the_cli_flag_wins():
    args = ["replay", str(ROOT / "traces" / "sharegpt.json"), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
            "--num-requests", "5", "--json"]
    on = CliRunner().invoke(app, args)
    off = CliRunner().invoke(app, [*args, "--no-chunked-prefill", "--max-model-len", "16384"])
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    assert '"chunked_prefill": true' in on.output and '"chunked_prefill": false' in off.output

"""A paged replay whose KV pool cannot hold one request of max_model_len tokens is refused, as
vLLM refuses to start (v1's check_enough_kv_cache_memory; v0's "max seq len is larger than the
maximum number of tokens that can be stored in KV cache"). The bytes per request are checked by
hand against vLLM's per-layer max_memory_usage_bytes rules (vllm/v1/kv_cache_interface.py: full
attention ceil(len / block) pages, a sliding window min(W - 1 + step tokens, len) tokens' pages
plus one, a state layer one page padded to the attention page)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.core.errors import CannotServe
from pagesim.models import get_model
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.sim.pool import request_kv_bytes
from pagesim.sim.replay_config import with_policy_presets
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "sharegpt.json"
NEMO = str(ROOT / "tests" / "models" / "data" / "Mistral-Nemo-Instruct-2407.json")
QWEN3_NEXT = str(ROOT / "tests" / "models" / "data" / "Qwen3-Next-80B-A3B-Instruct.json")
GiB = 2**30


def test_full_attention_bytes_by_hand():
    # Mistral-Nemo: 40 layers, 8 KV heads of 128, bf16: 4,096 bytes a token a layer; its
    # 1,024,000 positions are 64,000 blocks of 16: 156.25 GiB on one GPU (vLLM's figure for it)
    needed = request_kv_bytes(get_model(NEMO), 1, 1_024_000, 16, 2048)
    assert needed == 40 * 64_000 * 16 * 4096 == int(156.25 * GiB)
    # two GPUs split the 8 KV heads; a length that ends inside a block takes the whole block
    assert request_kv_bytes(get_model(NEMO), 2, 17, 16, 2048) == 40 * 2 * 16 * 2048


def test_sliding_window_bytes_by_hand():
    # Gemma-2-9B: 21 full layers and 21 of a 4,096-token window, 8 KV heads of 256: 8,192 bytes
    # a token a layer, a page of 16 tokens 131,072 bytes. At 8,192 tokens and a 2,048-token step
    # a window layer holds min(4,095 + 2,048, 8,192) = 6,143 tokens: 384 pages, plus one.
    page = 16 * 8192
    assert request_kv_bytes(get_model("gemma-2-9b"), 1, 8192, 16, 2048) == 21 * 512 * page + 21 * 385 * page
    # a request shorter than the window holds all its tokens there too (plus the one page)
    assert request_kv_bytes(get_model("gemma-2-9b"), 1, 1000, 16, 2048) == 21 * 63 * page + 21 * 64 * page


def test_state_layers_take_one_padded_page():
    # Qwen3-Next on 4 GPUs: 12 full-attention layers (2 KV heads of 256: 2,048 bytes a token a
    # layer, 1,024 on each GPU, the heads split over 2 of the 4), served at 272-token blocks: a
    # page is 278,528 bytes; each of the 36 linear-attention layers keeps one state of 274,432
    # bytes a GPU, padded to that page.
    model = get_model(QWEN3_NEXT)
    assert model.linear_attn.state_bytes_per_layer(4) == 274_432
    page = 272 * 1024
    assert request_kv_bytes(model, 4, 262_144, 272, 2048) == 12 * 964 * page + 36 * page


def test_a_pool_one_request_overflows_is_refused_with_the_length_that_fits():
    cfg = with_policy_presets(dict(model=NEMO, gpu="h200-141gb", policy="vllm-v1", num_requests=5))
    with pytest.raises(CannotServe) as refused:
        Replay(ReplayConfig(**cfg), load_trace(TRACE))
    # vLLM v0's rule, the same in blocks: the longest length is the tokens the pool's blocks hold
    blocks = Replay(ReplayConfig(**cfg, max_model_len=4096), load_trace(TRACE)).scheduler.kv.num_device_blocks
    longest = 16 * blocks
    assert f"lower --max-model-len to {longest:,} or less" in str(refused.value)
    assert "1,024,000" in str(refused.value) and "156.25 GiB" in str(refused.value)
    Replay(ReplayConfig(**cfg, max_model_len=longest), load_trace(TRACE))  # fits: no error
    with pytest.raises(CannotServe):
        Replay(ReplayConfig(**cfg, max_model_len=longest + 1), load_trace(TRACE))


def test_a_given_pool_is_a_what_if_and_is_not_checked():
    # --num-gpu-blocks (a server log's count, or a what-if) is taken as given: requests that can
    # never fit are rejected one by one, with their reason
    cfg = with_policy_presets(dict(model=NEMO, gpu="h200-141gb", policy="vllm-v1", num_requests=5))
    Replay(ReplayConfig(**cfg, num_gpu_blocks=1000), load_trace(TRACE))


def test_the_cli_says_it_in_one_line():
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", NEMO, "--gpu", "h200-141gb",
                                      "--policy", "vllm-v1", "--num-requests", "5"], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "vLLM would refuse to start" in lines[0], result.output

"""The vllm-v1 system: its presets, and its schedule against one traced by hand.

Pool of 7 blocks of 4 tokens, budget 16 tokens a step, three requests at t = 0:
A (prompt 8, 12 tokens), B (prompt 8, 12 tokens), C (prompt 4, 3 tokens).

step 0  waiting in FCFS order: A 8 tokens (2 blocks), B 8 (2 blocks); budget spent, C waits.  free 3
step 1  running first: A and B decode (each opens its 3rd block); then C's prompt, 4 (1 block). free 0
step 2  A, B decode into their open blocks; C's first output needs a block: none free, and C is
        the last running request, so C is preempted (recompute) and frees its block.           free 1
step 3-4 A, B decode (tokens 11, 12).
step 5  A's token 13 takes the last free block; B's needs one more: B, now last, is preempted.  free 3
"""

from pagesim.core import StepResult
from pagesim.core import Request, SamplingParams
from pagesim.sim.engine import ReplayConfig, with_policy_presets


def test_presets_fill_what_a_run_leaves_unset():
    cfg = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "gpu": "h100-80gb"}))
    assert (cfg.chunked_prefill, cfg.prefix_caching, cfg.preemption) == (True, True, "recompute")
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.gpu_memory_utilization) == (1024, 8192, 0.9)
    small = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "gpu": "a100-80gb", "max_num_seqs": 128}))
    assert (small.max_num_seqs, small.max_num_batched_tokens) == (128, 2048)  # A100: v1's smaller limits
    off = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "prefix_caching": False}))
    assert off.prefix_caching is False and off.chunked_prefill is True


def test_schedule_matches_the_hand_trace():
    cfg = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "block_size": 4, "max_num_seqs": 4,
                                              "max_num_batched_tokens": 16, "prefix_caching": False}))
    sched = cfg.make_scheduler(7, 0, 64)
    for rid, prompt, tokens in ((0, 8, 12), (1, 8, 12), (2, 4, 3)):
        sched.add_request(Request(rid, prompt, SamplingParams(max_tokens=tokens, ignore_eos=True),
                                  prompt_token_ids=[rid * 100 + i for i in range(prompt)]))
    trace = []
    for step in range(6):
        out = sched.schedule(float(step))
        per_group = [(g.request_id, sum(n for s, n in zip(out.seqs, out.num_new_tokens) if s in g.seqs))
                     for g in out.groups]
        trace.append((per_group, [g.request_id for g, _ in out.preempted], sched.kv.num_free_blocks))
        sched.update(out, StepResult(default_token=0), float(step))
    assert trace == [
        ([(0, 8), (1, 8)], [], 3),
        ([(0, 1), (1, 1), (2, 4)], [], 0),
        ([(0, 1), (1, 1)], [2], 1),
        ([(0, 1), (1, 1)], [], 1),
        ([(0, 1), (1, 1)], [], 1),
        ([(0, 1)], [1], 3),
    ]
    assert [g.request_id for g in sched.waiting] == [1, 2]  # preempted requests wait at the front, in order


def test_hybrid_models_leave_prefix_caching_off():
    """vLLM v1 leaves prefix caching off by default for a hybrid (Mamba / gated DeltaNet state
    layers; EngineArgs: "Disable prefix caching default for hybrid models"), so --policy vllm-v1
    on one runs with it off rather than being refused for a flag the user never gave; an explicit
    --prefix-caching on a hybrid is still refused, and a full-attention model keeps it on."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from pagesim.cli import app

    root = Path(__file__).resolve().parents[2]
    hybrid = str(root / "tests/models/data/granite-4.0-h-tiny.json")
    cfg = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "gpu": "h100-80gb", "model": hybrid}))
    assert (cfg.prefix_caching, cfg.chunked_prefill, cfg.preemption) == (False, True, "recompute")
    dense = ReplayConfig(**with_policy_presets({"policy": "vllm-v1", "gpu": "h100-80gb", "model": "llama-3.1-8b"}))
    assert dense.prefix_caching is True
    args = ["replay", str(root / "traces/sharegpt.json"), "--model", hybrid, "--gpu", "h100-80gb",
            "--num-requests", "20", "--policy", "vllm-v1"]
    result = CliRunner().invoke(app, args + ["--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["completed"] == 20 and summary["config"]["prefix_caching"] is False
    refused = CliRunner().invoke(app, args + ["--prefix-caching"])
    assert refused.exit_code == 2
    assert "prefix caching is not modelled for models with linear-attention/state layers" in refused.output

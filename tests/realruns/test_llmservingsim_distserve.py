"""The LLMServingSim (two clocks) and DistServe (.exp, a Python literal) readers on files built here."""

from __future__ import annotations

import json

import pytest

from pagesim.realruns import RealRunError, load_real_run

# wall-clock arrivals, engine (monotonic) times 1000 s behind with a front-end delay of 0.01 s
# for request 0 and 0.05 s for request 1 (so the clocks' offset is taken from request 0)
WALL0, MONO0 = 1_777_000_000.0, 1_776_999_000.0


def llmservingsim_run(root, rows=None, meta=None):
    rows = rows if rows is not None else [
        {"request_id": "bench-0", "input_toks": 100, "output_toks": 11, "arrival_time": WALL0,
         "queued_ts": MONO0 + 0.01, "scheduled_ts": MONO0 + 0.02, "first_token_ts": MONO0 + 0.21,
         "last_token_ts": MONO0 + 1.21},
        {"request_id": "bench-1", "input_toks": 50, "output_toks": 3, "arrival_time": WALL0 + 0.5,
         "queued_ts": MONO0 + 0.55, "scheduled_ts": MONO0 + 0.60, "first_token_ts": MONO0 + 0.70,
         "last_token_ts": MONO0 + 0.90},
    ]
    vllm = root / "Model-X" / "vllm"
    vllm.mkdir(parents=True)
    (vllm / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (vllm / "meta.json").write_text(json.dumps(meta or {
        "model": "org/Model-X", "vllm_version": "0.19.0",
        "engine_kwargs": {"tensor_parallel_size": 2, "data_parallel_size": 1, "enable_expert_parallel": False,
                          "max_num_seqs": 128, "max_num_batched_tokens": 2048, "max_model_len": None,
                          "dtype": "bfloat16", "kv_cache_dtype": "auto"}}))
    (root / "Model-X" / "config.json").write_text(json.dumps({"nodes": [{"instances": [{"hardware": "RTXPRO6000"}]}]}))
    return root / "Model-X"


def test_llmservingsim_puts_both_clocks_on_one(tmp_path):
    run = load_real_run(llmservingsim_run(tmp_path))
    a, b = run.requests
    assert (a.index, b.index) == (0, 1) and run.source_format == "llmservingsim"
    # offset = min(queued - arrival) = request 0's; request 1 spent 0.04 s more in the front end
    assert a.arrival_s == 0.0 and b.arrival_s == pytest.approx(0.5)
    assert a.ttft_s == pytest.approx(0.20) and a.e2e_s == pytest.approx(1.20)
    assert b.ttft_s == pytest.approx(0.70 - 0.51) and b.e2e_s == pytest.approx(0.90 - 0.51)
    assert b.queued_s == pytest.approx(0.54)  # the engine's own queue time, on the same origin
    assert a.itl_s == pytest.approx(1.0 / 10)
    assert run.server.tensor_parallel_size == 2 and run.server.gpu == "RTXPRO6000"
    assert run.server.engine_version == "0.19.0" and run.server.max_model_len is None
    assert any("front-end time included (its median 40 ms, max 40 ms" in x for x in run.assumptions)


def test_llmservingsim_reads_what_the_engine_resolved(tmp_path):
    meta = {"model": "org/Model-X", "vllm_version": "0.20.0",
            "engine_kwargs": {"tensor_parallel_size": 1, "max_num_seqs": 64},
            "kv_cache": {"num_gpu_blocks": 5000, "block_size": 16, "gpu_memory_utilization": 0.9},
            "resolved_config": {"scheduler_config": {"async_scheduling": True, "max_num_seqs": 128,
                                                     "enable_chunked_prefill": True},
                                "cache_config": {"enable_prefix_caching": True, "num_gpu_blocks": 4000},
                                "model_config": {"enforce_eager": False, "dtype": "<torch.dtype>", "max_model_len": 8192}}}
    server = load_real_run(llmservingsim_run(tmp_path, meta=meta)).server
    assert (server.num_gpu_blocks, server.block_size, server.max_num_seqs) == (5000, 16, 64)  # kv_cache, arguments first
    assert server.async_scheduling is True and server.enable_prefix_caching is True and server.cuda_graphs is True
    assert server.enable_chunked_prefill is True and server.max_model_len == 8192
    assert server.dtype is None  # a type tag, not a value


def test_llmservingsim_sorts_by_arrival_and_names_bad_records(tmp_path):
    path = llmservingsim_run(tmp_path)
    lines = (path / "vllm" / "requests.jsonl").read_text().splitlines()
    (path / "vllm" / "requests.jsonl").write_text(lines[1] + "\n" + lines[0] + "\n")
    assert [r.index for r in load_real_run(path / "vllm" / "requests.jsonl").requests] == [0, 1]
    (path / "vllm" / "requests.jsonl").write_text(lines[0] + "\n" + lines[1][:40] + "\n")
    with pytest.raises(RealRunError, match=r"requests.jsonl: record 2: invalid JSON"):
        load_real_run(path)
    bad = json.loads(lines[1])
    bad["first_token_ts"] = bad["queued_ts"] - 1
    (path / "vllm" / "requests.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RealRunError, match=r"record 2: field 'first_token_ts': times out of order"):
        load_real_run(path)
    bad = json.loads(lines[1])
    bad["output_toks"] = "3"
    (path / "vllm" / "requests.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RealRunError, match=r"record 2: field 'output_toks': must be an integer"):
        load_real_run(path)
    bad["output_toks"] = 3_000_000_000  # (the slow path's bound: a 4-byte count at most)
    (path / "vllm" / "requests.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RealRunError, match=r"record 2: field 'output_toks': must be at most 2,147,483,647, "
                                           r"got 3,000,000,000$"):
        load_real_run(path)


EXP = ("[{'prompt_len': 10, 'output_len': 4, 'issue_time': 100.5, 'first_token_time': 100.7, "
       "'complete_time': 101.0, 'ttft_ms': 200.0, 'tpot_ms': 100.0, 'latency_ms': 500.0}, "
       "{'prompt_len': 20, 'output_len': 1, 'issue_time': 100.0, 'first_token_time': 100.1, "
       "'complete_time': 100.1, 'ttft_ms': 100.0, 'tpot_ms': 0.0, 'latency_ms': 100.0}]\n"
       "{\n\tnum_requests: 2\n\ttest_duration_ms: 1000.0\n}")


def test_distserve_reads_line_one_as_a_literal(tmp_path):
    path = tmp_path / "vllm-2-1.5.exp"
    path.write_text(EXP)
    run = load_real_run(path)
    first, second = run.requests
    assert (first.index, second.index) == (1, 0)  # in arrival order, indices = position in the file
    assert second.arrival_s == pytest.approx(0.5) and second.ttft_s == pytest.approx(0.2)
    assert second.e2e_s == pytest.approx(0.5) and second.itl_s == pytest.approx(0.3 / 3)
    assert first.itl_s is None  # one output token
    assert run.stages[0].rate == 1.5
    assert run.server.model == "facebook/opt-13b" and any("DistServe's alignment setup" in a for a in run.assumptions)
    assert run.summary()["tpot_mean"] == pytest.approx(0.1)  # one-token requests left out


def test_distserve_never_evaluates_code_and_names_truncation(tmp_path):
    path = tmp_path / "vllm-2-1.exp"
    path.write_text("[{'issue_time': __import__('os').getcwd()}]\n")
    with pytest.raises(RealRunError, match="line 1 is not a Python literal"):
        load_real_run(path)
    path.write_text(EXP.splitlines()[0][:150])
    with pytest.raises(RealRunError, match="not a Python literal"):
        load_real_run(path)
    path.write_text(EXP.replace("'output_len': 4", "'output_len': 'four'"))
    with pytest.raises(RealRunError, match=r"vllm-2-1.exp: record 0: field 'output_len': must be an integer"):
        load_real_run(path)

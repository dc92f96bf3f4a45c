"""`pagesim run` on random: models under hostile input: rejections end the run normally with
every request accounted for; bad models, devices, token ids and lengths end in one line and
exit 2 before any request runs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import executor.run
from executor.models import loader
from pagesim.cli import app
from pagesim.workload.trace import Trace, TraceRequest, save_trace

ROOT = Path(__file__).resolve().parents[2]
ALPACA = str(ROOT / "traces" / "alpaca.json")
TINY = ["--model", "random:llama-tiny", "--rate", "1000", "--max-model-len", "128"]


def run(args: list[str]):
    return CliRunner().invoke(app, ["run", *args])


def one_error(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def write_trace(path: Path, records: list[TraceRequest]) -> str:
    save_trace(Trace({"name": "test"}, records), path)
    return str(path)


@pytest.mark.parametrize("flags", [["--num-gpu-blocks", "0"], ["--max-num-seqs", "0"], ["--n", "1000"]])
def test_every_request_rejected_ends_normally(flags):
    result = run([ALPACA, *TINY, "--num-requests", "4", "--json", *flags])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["num_requests"] == summary["num_rejected"] == 4 and summary["num_finished"] == 0


def test_a_huge_prompt_is_rejected_without_being_built(tmp_path, monkeypatch):
    built = []
    real = executor.run.synthetic_prompt
    monkeypatch.setattr(executor.run, "synthetic_prompt", lambda req, *a: built.append(req.prompt_len) or real(req, *a))
    trace = write_trace(tmp_path / "t.json", [TraceRequest(prompt_len=10, output_len=3),
                                              TraceRequest(prompt_len=10**9, output_len=3)])
    result = run([trace, *TINY, "--num-requests", "2", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["num_finished"], summary["num_rejected"]) == (1, 1)
    assert built == [10]  # the 1e9-token prompt was never made


def test_token_ids_outside_the_vocabulary(tmp_path):
    trace = write_trace(tmp_path / "t.json", [TraceRequest(prompt_len=3, output_len=2, prompt_token_ids=[5, 6, 7]),
                                              TraceRequest(prompt_len=2, output_len=2, prompt_token_ids=[1, 50000])])
    line = one_error(run([trace, *TINY, "--num-requests", "2"]))
    assert line == (f"error: {trace}: request 1: field 'prompt_token_ids' holds 50000, outside random:llama-tiny's "
                    "vocabulary of 128 tokens (was the trace tokenized for another model?)")


def test_lengths_past_a_learned_position_table(tmp_path):
    line = one_error(run([ALPACA, "--model", "random:opt-tiny", "--max-model-len", "512"]))
    assert "--max-model-len 512 exceeds random:opt-tiny's table of 256 learned positions" in line
    config = tmp_path / "c.toml"
    config.write_text("max_model_len = 512\n")  # from a --config file: the file and its key
    line = one_error(run([ALPACA, "--model", "random:opt-tiny", "--config", str(config)]))
    assert line == f"error: {config}: max_model_len: 512 exceeds random:opt-tiny's table of 256 learned positions"


def test_lengths_past_a_rotary_models_positions(monkeypatch):
    # llama-tiny: 256 positions, no rope_scaling. vLLM refuses more unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    args = [ALPACA, "--model", "random:llama-tiny", "--rate", "1000", "--num-requests", "2", "--max-model-len", "512"]
    line = one_error(run(args))
    assert "--max-model-len 512 is greater than random:llama-tiny's maximum length, 256 tokens" in line
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in line
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert run(args + ["--json"]).exit_code == 0


def test_bad_model_sources(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    loader.tiny_config("llama-tiny").to_json_file(garbage / "config.json")
    (garbage / "model.safetensors").write_bytes(b"\x07" * 1000)
    assert "model.safetensors: not a readable safetensors file" in one_error(run([ALPACA, "--model", str(garbage)]))

    extra = tmp_path / "extra"
    extra.mkdir()
    loader.tiny_config("llama-tiny").to_json_file(extra / "config.json")
    from safetensors.torch import save_file

    save_file({"model.bogus.weight": torch.zeros(2)}, extra / "model.safetensors")
    assert "'model.bogus.weight' has no place in LlamaForCausalLM" in one_error(run([ALPACA, "--model", str(extra)]))

    no_type = tmp_path / "config.json"
    no_type.write_text(json.dumps({"vocab_size": 128, "hidden_size": 64}))
    assert f"{no_type}: field 'model_type' is missing" in one_error(run([ALPACA, "--model", f"random:{no_type}"]))
    no_type.write_text("{not json")
    assert f"{no_type}: not valid JSON" in one_error(run([ALPACA, "--model", f"random:{no_type}"]))
    no_type.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": -1}))
    assert "field 'num_hidden_layers' must be a positive integer" in one_error(run([ALPACA, "--model", f"random:{no_type}"]))

    line = one_error(run([ALPACA, "--model", f"gguf:{tmp_path / 'missing.gguf'}"]))
    assert line.endswith("missing.gguf: no such GGUF file") and "huggingface" not in line
    assert "model spec 'nonsense'" in one_error(run([ALPACA, "--model", "nonsense"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda():
    assert "--device cuda: no CUDA device is available here" in one_error(run([ALPACA, *TINY, "--device", "cuda"]))
    assert "--device 'tpu'" in one_error(run([ALPACA, *TINY, "--device", "tpu"]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 6)), min_size=1, max_size=4),
       flags=st.lists(st.sampled_from([["--num-gpu-blocks", "3"], ["--max-num-seqs", "1"], ["--n", "2"],
                                       ["--block-size", "1"], ["--policy", "orca-oracle"], ["--chunked-prefill"],
                                       ["--preemption", "swap"], ["--num-gpu-blocks", "0"]]), max_size=3))
def test_run_ends_cleanly_with_every_request_accounted_for(lengths, flags):
    with tempfile.TemporaryDirectory() as tmp:
        trace = write_trace(Path(tmp) / "t.json", [TraceRequest(prompt_len=p, output_len=o) for p, o in lengths])
        args = [trace, *TINY, "--num-requests", str(len(lengths)), "--json", *[f for pair in flags for f in pair]]
        result = run(args)
        assert result.exit_code in (0, 2), result.output
        if result.exit_code == 2:
            one_error(result)
            return
        summary = json.loads(result.output)
        assert summary["num_requests"] == len(lengths)
        assert summary["num_finished"] + summary["num_rejected"] == len(lengths)
        # by hand: a request longer than the model length (128 here) can never be served
        too_long = sum(p + o > 128 for p, o in lengths)
        assert summary["num_rejected"] >= too_long


def test_a_kv_pool_bigger_than_memory_is_refused_before_allocation():
    # llama-tiny: K and V x 2 layers x 2 KV heads x head dim 16 x 1024 tokens x 4 bytes (fp32) per block
    # (15 million blocks: under the flag's bound of 16 million, so the memory check is what refuses them)
    blocks = 15 * 10**6 + 1024  # --num-gpu-blocks plus the default 1024 host blocks, both in host memory on a CPU
    gib = 2 * 2 * 2 * 16 * 1024 * 4 * blocks / 2**30
    line = one_error(run([ALPACA, *TINY, "--block-size", "1024", "--num-gpu-blocks", str(15 * 10**6)]))
    assert f"{blocks:,} blocks of 1024 tokens need {gib:,.1f} GiB of KV cache" in line
    assert "'--num-gpu-blocks'" in one_error(run([ALPACA, *TINY, "--num-gpu-blocks", str(10**9)]))  # past the bound


@pytest.mark.parametrize("rope, expected", [
    (None, 256),  # the tiny model's 256 positions
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}, 512),  # 128 x 4, not 256 x 4
    ({"rope_type": "linear", "factor": 2.0}, 512),  # 256 x 2
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, 256),  # already the long length
])
def test_the_executors_length_is_the_one_vllm_derives(tmp_path, rope, expected):
    """serve's --max-model-len is judged against it (it was max_position_embeddings, unscaled)."""
    config = loader.tiny_config("qwen3-tiny").to_dict()
    config.update(rope_scaling=rope, rope_parameters=rope and {**rope, "rope_theta": 10000.0})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert loader.load_model(f"random:{path}").max_model_len == expected
    result = CliRunner().invoke(app, ["serve", "--model", f"random:{path}", "--port", "0",
                                      "--max-model-len", str(expected + 1)])
    assert result.exit_code == 2
    assert f"--max-model-len {expected + 1} is greater than random:{path}'s maximum length, {expected} tokens" \
        in " ".join(result.output.split())

"""`pagesim model inspect`: the JSON a script reads, checked by hand, and its one-line errors."""

import json

from typer.testing import CliRunner

from pagesim.cli import app


def inspect(*args):
    result = CliRunner().invoke(app, ["model", "inspect", *args])
    return result


def test_inspect_json_of_a_mla_moe_model_by_hand():
    result = inspect("deepseek-v3", "--tp", "8", "--gpu", "h200-141gb", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["kv_bytes_per_token"] == (512 + 64) * 61 * 2
    assert info["kv_bytes_per_token_per_gpu"] == info["kv_bytes_per_token"]  # the latent is on every rank
    assert info["kv_groups"] == [{"kind": "mla", "num_layers": 61, "sliding_window": None,
                                  "kv_bytes_per_token_per_layer": 1152, "kv_bytes_per_token": 70_272}]
    assert round(info["params_total"] / 1e9) == 671 and info["params_active"] < info["params_total"] / 10
    assert info["weight_quantization"]["method"] == "fp8"
    assert info["kv_pool"]["token_slots"] == info["kv_pool"]["pool_bytes_per_gpu"] // 70_272


def test_inspect_kv_dtype_and_sliding_groups():
    info = json.loads(inspect("gemma-2-9b", "--kv-cache-dtype", "fp8", "--gpu", "l40s-48gb", "--json").output)
    per_layer = 2 * 8 * 256 * 1  # fp8: one byte
    assert [(g["kind"], g["num_layers"], g["sliding_window"], g["kv_bytes_per_token"]) for g in info["kv_groups"]] == \
        [("full", 21, None, 21 * per_layer), ("sliding", 21, 4096, 21 * per_layer)]
    assert info["kv_bytes_per_token"] == 42 * per_layer
    assert info["kv_bytes_per_token_past_windows"] == 21 * per_layer
    assert "sliding-window" in info["kv_pool"]["counting"]
    assert info["params_total"] == info["params_active"]


def test_inspect_a_config_file_and_the_table(tmp_path):
    config = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
              "vocab_size": 32000, "max_position_embeddings": 32768}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    info = json.loads(inspect(str(path), "--tp", "2", "--json").output)
    assert info["kv_bytes_per_token"] == 2 * 8 * 128 * 2 * 32 and info["kv_bytes_per_token_per_gpu"] == 65_536
    table = inspect(str(path), "--gpu", "h100-80gb", "--tp", "2")
    assert table.exit_code == 0 and "2 of 8 on 32 layers" in table.output and "KV pool" in table.output


def test_inspect_errors_are_one_line():
    for args, words in [(("no-such-model",), "unknown model"), (("opt-13b", "--kv-cache-dtype", "int2"), "kv-cache-dtype"),
                        (("opt-175b", "--gpu", "a100-40gb"), "leaves no KV pool")]:
        result = inspect(*args)
        assert result.exit_code == 2, result.output
        assert words in result.output and result.output.strip().count("\n") == 0


def test_inspect_says_the_longest_request_the_pool_holds():
    # Mistral-Nemo's 1,024,000 positions at 163,840 bytes a token do not fit one H200's pool: the
    # longest request is the tokens of the blocks it holds (vLLM v0's rule: block size x blocks)
    from pathlib import Path

    nemo = str(Path(__file__).resolve().parents[1] / "models" / "data" / "Mistral-Nemo-Instruct-2407.json")
    pool = json.loads(inspect(nemo, "--gpu", "h200-141gb", "--json").output)["kv_pool"]
    assert pool["max_concurrency"] == 0
    assert pool["max_model_len_that_fits"] == 16 * (pool["pool_bytes_per_gpu"] // (16 * 163_840))
    assert "longest request the pool holds" in inspect(nemo, "--gpu", "h200-141gb").output
    # a model whose length fits says its own length
    assert json.loads(inspect("llama-2-7b", "--gpu", "a100-80gb", "--json").output)["kv_pool"][
        "max_model_len_that_fits"] == 4096

"""Models from a Hugging Face config.json: the same spec as the catalog entry (KV bytes per token,
parameter count, the paper's Table 1 slots), and one clear line for a bad file."""

import dataclasses
import json
from pathlib import Path

import pytest

from pagesim.sim.specs import MODELS, ModelConfigError, get_model, kv_cache_capacity

# The published config.json fields of each catalog model (the values the catalog's comments cite).
CONFIGS = {
    "opt-125m": {"model_type": "opt", "_name_or_path": "facebook/opt-125m", "hidden_size": 768, "num_hidden_layers": 12,
                 "num_attention_heads": 12, "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048,
                 "word_embed_proj_dim": 768, "do_layer_norm_before": True, "torch_dtype": "float16"},
    "opt-13b": {"model_type": "opt", "_name_or_path": "facebook/opt-13b", "hidden_size": 5120, "num_hidden_layers": 40,
                "num_attention_heads": 40, "ffn_dim": 20480, "vocab_size": 50272, "max_position_embeddings": 2048,
                "word_embed_proj_dim": 5120, "do_layer_norm_before": True},
    "opt-66b": {"model_type": "opt", "_name_or_path": "facebook/opt-66b", "hidden_size": 9216, "num_hidden_layers": 64,
                "num_attention_heads": 72, "ffn_dim": 36864, "vocab_size": 50272, "max_position_embeddings": 2048},
    "llama-13b": {"model_type": "llama", "_name_or_path": "huggyllama/llama-13b", "hidden_size": 5120,
                  "intermediate_size": 13824, "num_hidden_layers": 40, "num_attention_heads": 40, "vocab_size": 32000,
                  "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "llama-2-7b": {"model_type": "llama", "_name_or_path": "meta-llama/Llama-2-7b-hf", "hidden_size": 4096,
                   "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "tie_word_embeddings": False, "attention_bias": False},
    "qwen2.5-72b": {"model_type": "qwen2", "_name_or_path": "Qwen/Qwen2.5-72B", "hidden_size": 8192,
                    "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 32768,
                    "tie_word_embeddings": False},
    "smollm2-135m": {"model_type": "llama", "_name_or_path": "HuggingFaceTB/SmolLM2-135M", "hidden_size": 576,
                     "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
                     "tie_word_embeddings": True},
}


def write_config(tmp_path, name, config):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d / "config.json"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_round_trips_to_the_catalog_spec(tmp_path, name):
    path = write_config(tmp_path, name, CONFIGS[name])
    spec = get_model(str(path))
    catalog = MODELS[name]
    assert dataclasses.replace(spec, name=catalog.name) == catalog
    assert spec.kv_bytes_per_token == catalog.kv_bytes_per_token
    assert spec.num_params == catalog.num_params
    assert get_model(str(path.parent)) == spec  # the directory holding config.json works too


@pytest.mark.parametrize("name,gpu,tp,slots", [("opt-13b", "a100-40gb", 1, 15_700), ("opt-66b", "a100-40gb", 4, 9_700)])
def test_config_gives_the_papers_table1_slots(tmp_path, name, gpu, tp, slots):
    spec = get_model(str(write_config(tmp_path, name, CONFIGS[name])))
    cap = kv_cache_capacity(spec, gpu, tp)
    assert cap.token_slots == kv_cache_capacity(name, gpu, tp).token_slots
    assert cap.token_slots == pytest.approx(slots, rel=0.05)  # paper Table 1


@pytest.mark.parametrize("change,field", [
    ({"hidden_size": "big"}, "hidden_size"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
])
def test_bad_config_names_file_and_field(tmp_path, change, field):
    config = {k: v for k, v in {**CONFIGS["llama-2-7b"], **change}.items() if v is not None}
    path = write_config(tmp_path, "bad", config)
    with pytest.raises(ModelConfigError) as e:
        get_model(str(path))
    assert str(path) in str(e.value) and field in str(e.value)
    assert "\n" not in str(e.value)


def test_unreadable_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ModelConfigError, match="not JSON"):
        get_model(str(path))
    with pytest.raises(ModelConfigError, match="no such config"):
        get_model(str(tmp_path / "missing.json"))


def test_replay_cli_accepts_a_config(tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    path = write_config(tmp_path, "opt-13b", CONFIGS["opt-13b"])
    trace = Path(__file__).resolve().parents[2] / "traces" / "sharegpt.json"
    result = CliRunner().invoke(app, ["replay", str(trace), "--model", str(path), "--num-requests", "4", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["num_finished"] == 4
    assert summary["cost_model"]["name"] == "calibrated" and summary["cost_model"]["model"] == "opt-13b"

"""A model's maximum length as vLLM derives it from config.json (vllm/config/model.py): the
max_position_embeddings scaled by rope_scaling's factor except for su/longrope/llama3 (and Gemma 3),
yarn from its original_max_position_embeddings; and VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, which turns the
refusal of a longer --max-model-len into a warning. Every expected length is worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.models import ModelConfigError, get_model, model_from_config
from pagesim.models import max_len
from pagesim.sim.replay_config import ReplayConfig

DATA = Path(__file__).parent / "data"
ALPACA = str(Path(__file__).resolve().parents[2] / "traces" / "alpaca.json")
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen3's model card


def qwen3(**changes) -> dict:
    """Qwen3-8B's config.json (max_position_embeddings 40,960, no rope_scaling), changed."""
    return {**json.loads((DATA / "Qwen3-8B.json").read_text()), **changes}


@pytest.mark.parametrize("positions, scaling, expected", [
    (40960, None, 40960),  # no scaling: the positions
    (40960, QWEN3_YARN, 131072),  # yarn: its original 32,768 x 4 (not 40,960 x 4)
    (4096, {"rope_type": "yarn", "factor": 2.0}, 8192),  # yarn without an original: the positions x 2
    (4096, {"rope_type": "dynamic", "factor": 2.0}, 8192),  # dynamic NTK: 4,096 x 2
    (2048, {"type": "linear", "factor": 1.5}, 3072),  # linear, in the older "type" key: 2,048 x 1.5
    (131072, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 131072),  # already long
    (131072, {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}, 131072),  # already long
    (4096, {"rope_type": "default"}, 4096),  # a rope_scaling without a factor: x 1
    (4096, {"rope_type": "linear", "factor": 2.5}, 10240),  # 4,096 x 2.5
])
def test_the_length_vllm_derives(positions, scaling, expected):
    spec = model_from_config(qwen3(max_position_embeddings=positions, rope_scaling=scaling), "q")
    assert spec.max_model_len == expected


def test_deepseeks_yarn_in_the_type_key_scales_its_original_length():
    """DeepSeek-V3 writes "type": "yarn", factor 40 over 4,096 original positions: 163,840."""
    config = json.loads((DATA / "DeepSeek-R1.json").read_text())
    config["max_position_embeddings"] = 2048  # (so the 163,840 can only come from 4,096 x 40)
    assert model_from_config(config, "d").max_model_len == 4096 * 40


def test_gemma3s_positions_are_already_scaled():
    """Gemma 3's text config: linear factor 8 over 131,072 positions, which vLLM leaves as they are."""
    assert get_model(str(DATA / "gemma-3-12b-it.json")).max_model_len == 131072


def test_transformers_5s_rope_parameters_per_layer_kind():
    nested = {"full_attention": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 1000},
              "sliding_attention": {"rope_type": "default"}}
    assert max_len.derived_max_len(4096, nested, "somemodel") == 3000


@pytest.mark.parametrize("scaling, words", [
    ({"rope_type": "yarn", "factor": "4"}, "field 'rope_scaling' has factor '4'; it must be a positive number"),
    ({"rope_type": "linear", "factor": 0}, "field 'rope_scaling' has factor 0"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -1},
     "field 'rope_scaling' has original_max_position_embeddings -1"),
])
def test_a_bad_rope_scaling_names_the_file_and_the_field(scaling, words):
    with pytest.raises(ModelConfigError, match="^cfg.json: " + words):
        model_from_config(qwen3(rope_scaling=scaling), "q", "cfg.json")


@pytest.fixture
def yarn_model(tmp_path) -> str:
    path = tmp_path / "Qwen3-8B-yarn" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(qwen3(rope_scaling=QWEN3_YARN)))
    return str(path)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The warning is said once per process, as vLLM's warning_once; each test starts with none said."""
    monkeypatch.setattr(max_len, "_warned", set())
    monkeypatch.delenv(max_len.ALLOW_LONG, raising=False)


def test_a_yarn_model_takes_its_scaled_length_and_no_more(yarn_model, fresh_warnings):
    assert ReplayConfig(model=yarn_model, max_model_len=131072).max_model_len == 131072  # refused before: > 40,960
    with pytest.raises(ValueError, match=r"^--max-model-len 131073 is greater than .*'s maximum length, 131072 tokens "
                                         r".*; set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to allow it anyway$"):
        ReplayConfig(model=yarn_model, max_model_len=131073)


@pytest.mark.parametrize("value, allowed", [("1", True), ("true", True), (" TRUE ", True), ("0", False),
                                            ("yes", False), ("", False)])
def test_vllm_allow_long_max_model_len_reads_as_vllm_reads_it(monkeypatch, fresh_warnings, capsys, value, allowed):
    """vllm/envs.py: os.environ.get(..., "0").strip().lower() in ("1", "true")."""
    monkeypatch.setenv(max_len.ALLOW_LONG, value)
    if not allowed:
        with pytest.raises(ValueError, match="greater than opt-13b's maximum length, 2048 tokens"):
            ReplayConfig(max_model_len=2049)
        return
    assert ReplayConfig(max_model_len=2049).max_model_len == 2049
    ReplayConfig(max_model_len=2049)  # a second time: no second warning
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: --max-model-len 2049 is greater than opt-13b's maximum length, 2048 tokens "
                   "(max_position_embeddings with rope_scaling, as vLLM derives it); allowed by "
                   "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, but positions past 2048 may give wrong outputs on a real server"]


def test_replay_past_the_length_runs_on_with_one_warning_under_the_env_var(fresh_warnings):
    args = ["replay", ALPACA, "--max-model-len", "4096", "--num-requests", "3", "--json"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to allow it anyway" in refused.output
    result = CliRunner().invoke(app, args, env={max_len.ALLOW_LONG: "1"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["max_model_len"] == 4096
    assert result.stderr.count("warning: --max-model-len 4096 is greater than opt-13b's maximum length") == 1


def test_a_cluster_group_takes_the_yarn_length(yarn_model, tmp_path, fresh_warnings):
    cluster = tmp_path / "c.toml"
    cluster.write_text(f'[[groups]]\nname = "q"\nmodel = "{yarn_model}"\ngpu = "h100-80gb"\nmax_model_len = 131072\n')
    result = CliRunner().invoke(app, ["replay", ALPACA, "--cluster", str(cluster), "--num-requests", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cluster"]["groups"][0]["config"]["max_model_len"] == 131072
    cluster.write_text(cluster.read_text().replace("131072", "131073"))
    result = CliRunner().invoke(app, ["replay", ALPACA, "--cluster", str(cluster), "--num-requests", "2", "--json"])
    assert result.exit_code == 2
    assert f"{cluster}: groups[0].max_model_len: --max-model-len 131073 is greater than " in result.output
    assert "maximum length, 131072 tokens" in result.output

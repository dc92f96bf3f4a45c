"""`pagesim replay --config FILE` (docs/cli.md): keys named as the flags, the flags' own checks,
the command line over the file, and a run re-created from its summary.json byte for byte;
`validate --config`; the "reproduce with" lines of replay, validate and run; `python -m pagesim`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = str(ROOT / "traces" / "sharegpt.json")


def replay(*args):
    return CliRunner().invoke(app, ["replay", SHAREGPT, *map(str, args)])


def summary_of(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("name, text", [
    ("run.toml", 'num_requests = 12\nrate = 4.0\nmax_num_seqs = 8\npolicy = "orca-max"\nseed = 3\n'),
    ("run.yaml", "num-requests: 12\nrate: 4\n--max-num-seqs: 8\npolicy: orca-max\nseed: 3\n"),
    ("run.json", '{"num_requests": 12, "rate": 4, "max_num_seqs": 8, "policy": "orca-max", "seed": 3}'),
])
def test_a_config_file_sets_the_options_as_the_flags_do(tmp_path, name, text):
    from_file = summary_of(replay("--config", write(tmp_path / name, text), "--json"))
    from_flags = summary_of(replay("--num-requests", 12, "--rate", 4, "--max-num-seqs", 8, "--policy", "orca-max",
                                   "--seed", 3, "--json"))
    assert from_file == from_flags
    assert from_file["num_requests"] == 12 and from_file["config"]["max_num_seqs"] == 8
    assert from_file["config"]["policy"] == "orca-max" and from_file["config"]["seed"] == 3


def test_the_command_line_overrides_the_file(tmp_path):
    config = write(tmp_path / "c.yaml", "num_requests: 12\nrate: 4\nblock_size: 32\n")
    s = summary_of(replay("--config", config, "--block-size", 8, "--json"))
    assert s["config"]["block_size"] == 8 and s["num_requests"] == 12 and s["config"]["rate"] == 4
    # a run is sized by a count or by seconds: the one typed wins over the other in the file
    timed = write(tmp_path / "t.yaml", "duration: 5\nrate: 4\n")
    s = summary_of(replay("--config", timed, "--num-requests", 9, "--json"))
    assert s["num_requests"] == 9 and s["config"]["duration"] is None
    s = summary_of(replay("--config", config, "--duration", 3, "--json"))
    assert s["config"]["duration"] == 3 and s["config"]["num_requests"] is None
    both = write(tmp_path / "b.yaml", "duration: 5\nnum_requests: 9\n")
    assert "--num-requests or --duration" in replay("--config", both).output


def test_an_option_set_in_the_file_counts_as_given(tmp_path):
    # --policy vllm-v1 brings v1's limits unless an option says otherwise: the file says so here
    config = write(tmp_path / "v1.yaml", "policy: vllm-v1\nmax_num_seqs: 5\nnum_requests: 10\n")
    s = summary_of(replay("--config", config, "--json"))
    assert s["config"]["max_num_seqs"] == 5 and s["config"]["chunked_prefill"] is True  # (the preset's, not set)


@pytest.mark.parametrize("text, says", [
    ("num_requests: 0\n", "c.yaml: num_requests: must be an integer in [1, 1,000,000], got 0"),
    ("rate: fast\n", "c.yaml: rate: must be a finite number"),
    ("block_size: 16.5\n", "c.yaml: block_size: must be an integer"),
    ("policy: vllm-v9\n", "c.yaml: policy: 'vllm-v9' is not one of"),
    ("num_request: 5\n", "c.yaml: unknown key 'num_request' for `pagesim replay` (valid: allocator,"),
    ("seed: null\n", "c.yaml: seed: null is not a value of --seed"),
    ("model: [opt-13b]\n", "c.yaml: model: must be one value for --model, got a list"),
    ("num_requests: 5\nnum-requests: 6\n", "c.yaml: num_requests and num-requests set the same option"),
    ("swap_space: 2\nswap_space_gib: 2\n", "c.yaml: swap_space and swap_space_gib set the same option"),
    ("allocator: slab\n", "c.yaml: allocator: unknown allocator 'slab'"),
    ("waste_interval_s: -1\n", "c.yaml: waste_interval_s: must be a finite number in (0"),
    ("- 1\n- 2\n", "c.yaml: a config file holds a mapping of option names to values, got list"),
    ("", "c.yaml: the config file is empty"),
    ("rate: [\n", "c.yaml: not YAML or JSON"),
    ("rate: " + "[" * 5000 + "]" * 5000 + "\n", "c.yaml: nested too deep to be a config file"),
])
def test_a_bad_key_or_value_is_one_line_naming_the_file_and_the_key(tmp_path, text, says):
    result = replay("--config", write(tmp_path / "c.yaml", text))
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/") and says in lines[0], lines


LONGER = ("4096 is greater than opt-13b's maximum length, 2048 tokens (max_position_embeddings with rope_scaling, as "
          "vLLM derives it); set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to allow it anyway")


@pytest.mark.parametrize("key", ["max_model_len", "max-model-len", "--max-model-len"])
@pytest.mark.parametrize("more", [[], ["--replicas", "2"], ["--concurrency", "2,4"]])  # one run, a cluster, a sweep
def test_a_length_from_the_file_that_the_model_refuses_names_the_file_and_the_key(tmp_path, key, more):
    """(found once the run starts, against the model's length, it named --max-model-len: a flag never given)"""
    config = write(tmp_path / "c.yaml", f"{key}: 4096\nnum_requests: 4\n")
    result = replay("--config", config, *more)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and lines == [f"error: {config}: {key}: {LONGER}"], result.output
    typed = replay("--config", config, "--max-model-len", 4096, *more)  # the command line's own value names its flag
    assert typed.exit_code == 2 and f"error: --max-model-len {LONGER}" in typed.output, typed.output


def test_bad_toml_and_json_and_missing_files_are_one_line(tmp_path):
    for name, text, says in [("c.toml", "rate = = 1\n", "not TOML"), ("c.json", "{nope", "not JSON"),
                             ("c.json", '{"rate": NaN}', "not JSON"),
                             ("d.toml", "rate = " + "[" * 5000 + "]" * 5000, "nested too deep to be a config file")]:
        result = replay("--config", write(tmp_path / name, text))
        assert result.exit_code == 2 and f"{tmp_path / name}: {says}" in result.output
    result = replay("--config", tmp_path / "absent.yaml")
    assert result.exit_code == 2 and "absent.yaml: no such config file" in result.output


def test_a_null_rate_in_the_file_is_the_traces_own_times(tmp_path):
    # summary.json stores rate null for --rate 0; sharegpt.json has no arrival times to use
    result = replay("--config", write(tmp_path / "c.yaml", "rate: null\nnum_requests: 5\n"))
    assert result.exit_code == 2 and "no arrival_time" in result.output


def reproduce_line(summary: Path | str) -> str:
    return f"pagesim replay {SHAREGPT} --config {summary} --steps sampled --out NEW_FOLDER"


def test_a_run_is_recreated_from_its_summary_config(tmp_path):
    first = replay("--policy", "vllm-v1", "--gpu", "h100-80gb", "--rate", 3, "--duration", 15, "--warmup", 1,
                   "--swap-space", 2, "--seed", 4, "--steps", "sampled", "--out", tmp_path / "A")
    assert first.exit_code == 0, first.output
    assert f"reproduce with: {reproduce_line(tmp_path / 'A' / 'summary.json')}" in " ".join(first.output.split())
    a = {name: (tmp_path / "A" / name).read_bytes() for name in ("requests.csv", "steps.csv", "summary.json")}
    summary = json.loads(a["summary.json"])
    # stored naming the file itself, not its folder: the same bytes wherever the run is written
    assert summary["reproduce"] == reproduce_line("SUMMARY_JSON")
    config = json.dumps(summary["config"])
    for name, folder in (("config.json", tmp_path / "B"), ("config.yaml", tmp_path / "C")):  # JSON is YAML too
        again = replay("--config", write(tmp_path / name, config), "--steps", "sampled", "--out", folder)
        assert again.exit_code == 0, again.output
        for file, content in a.items():
            assert (folder / file).read_bytes() == content, file
    # summary.json itself is a config file: its `config` is read
    again = replay("--config", tmp_path / "A" / "summary.json", "--steps", "sampled", "--out", tmp_path / "D")
    assert again.exit_code == 0 and (tmp_path / "D" / "summary.json").read_bytes() == a["summary.json"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for process substitution")
def test_python_dash_m_pagesim_reads_a_config_from_a_pipe(tmp_path):
    first = replay("--num-requests", 8, "--rate", 2, "--out", tmp_path / "A")
    assert first.exit_code == 0, first.output
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = (f"{sys.executable} -m pagesim replay {SHAREGPT} --out {tmp_path}/B --config "
              f"<({sys.executable} -c 'import json; print(json.dumps(json.load(open(\"{tmp_path}/A/summary.json\"))[\"config\"]))')")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "A" / name).read_bytes() == (tmp_path / "B" / name).read_bytes(), name


def test_python_dash_m_pagesim_is_the_command():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "pagesim", "--version"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("pagesim ")
    bad = subprocess.run([sys.executable, "-m", "pagesim", "replay", SHAREGPT, "--tp", "0"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and "'--tp'" in bad.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_named_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # no writer: reading it would wait forever
    result = replay("--config", tmp_path / "fifo")
    assert result.exit_code == 2 and "fifo: is a FIFO, not a regular file (expected a config file)" in result.output


def test_validate_takes_a_config_and_says_how_to_reproduce(tmp_path):
    from tests.validate.test_validate import distserve_run

    run_path, _ = distserve_run(tmp_path / "vllm-30-2.exp")
    config = write(tmp_path / "v.toml", 'gpu = "a100-80gb"\nnum-gpu-blocks = 3000\n')
    first = CliRunner().invoke(app, ["validate", str(run_path), "--config", str(config), "--engine", "paper",
                                     "--out", str(tmp_path / "A")])
    assert first.exit_code == 0, first.output
    line = f"pagesim validate {run_path} --gpu a100-80gb --engine paper --num-gpu-blocks 3000 --out NEW_FOLDER"
    assert f"reproduce with: {line}" in first.output
    report = json.loads((tmp_path / "A" / "validate.json").read_text())
    assert report["reproduce"] == line and report["config"]["gpu"] == "a100-80gb"
    again = CliRunner().invoke(app, line.split()[1:-1] + [str(tmp_path / "B")])
    assert again.exit_code == 0, again.output
    for name in ("requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "A" / name).read_bytes() == (tmp_path / "B" / name).read_bytes(), name
    bad = CliRunner().invoke(app, ["validate", str(run_path), "--config", str(write(tmp_path / "b.yaml", "tp: 0\n"))])
    assert bad.exit_code == 2 and f"{tmp_path}/b.yaml: tp: must be an integer" in bad.output


def test_run_stores_and_prints_its_reproduce_line(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    args = ["run", "traces/alpaca.json", "--model", "random:llama-tiny", "--num-requests", "4", "--rate", "1000",
            "--max-model-len", "256"]
    first = CliRunner().invoke(app, args + ["--out", str(tmp_path / "A")])
    assert first.exit_code == 0, first.output
    line = ("pagesim run traces/alpaca.json --model random:llama-tiny --rate 1000.0 --num-requests 4 "
            "--max-model-len 256 --out NEW_FOLDER")  # every option given, in the command's order
    assert f"reproduce with: {line}" in first.output
    assert json.loads((tmp_path / "A" / "summary.json").read_text())["reproduce"] == line

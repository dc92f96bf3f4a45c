"""`pagesim replay --cluster FILE`: a cluster file runs (TOML and YAML), and a malformed,
contradictory or impossible one is one line naming the file and the key, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = str(ROOT / "traces" / "sharegpt.json")

GOOD_TOML = """
[router]
name = "round-robin"
[[groups]]
name = "P"
role = "prefill"
count = 1
[[groups]]
name = "D"
role = "decode"
count = 2
gpu = "a100-80gb"
[[links]]
from = "P"
to = "D"
kind = "nvlink"
"""
GOOD_YAML = """
router: {name: round-robin, staleness_s: 0.5}
groups:
  - {name: a, count: 2}
  - {name: b, count: 1, model: llama-2-7b, gpu: h100-80gb}
"""


def replay(*args):
    return CliRunner().invoke(app, ["replay", SHAREGPT, "--num-requests", "40", "--rate", "8", "--json", *map(str, args)])


@pytest.mark.parametrize("name, text, replicas", [("c.toml", GOOD_TOML, 3), ("c.yaml", GOOD_YAML, 3)])
def test_a_cluster_file_runs(tmp_path, name, text, replicas):
    path = tmp_path / name
    path.write_text(text)
    result = replay("--cluster", path)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_finished"] == 40
    assert summary["cluster"]["num_replicas"] == replicas


BAD = [
    ("[[groups]\nname='a'", "not valid TOML"),
    ("color = 1\n[[groups]]\nname='a'", "color: unknown key"),
    ("[[groups]]\ncount = 2", "groups[0].name:"),
    ("[[groups]]\nname='a'\ncount = 0", "groups[0].count:"),
    ("[[groups]]\nname='a'\ncount = true", "groups[0].count:"),
    ("[[groups]]\nname='a'\nrole = 'both'", "groups[0].role:"),
    ("[[groups]]\nname='a'\nrate = 3", "groups[0].rate: the workload"),
    ("[[groups]]\nname='a'\ntp = 0", "groups[0].tp:"),
    ("[[groups]]\nname='a'\nwings = 2", "groups[0].wings:"),
    ("[[groups]]\nname='a'\nmodel = 'gpt-9'", "groups[0].model: unknown model 'gpt-9'"),
    ("[[groups]]\nname='a'\nrole='prefill'", "groups: P/D disaggregation needs both"),
    ("[[groups]]\nname='a'\n[[groups]]\nname='a'", "groups: replica group names repeat"),
    ("[[groups]]\nname='a'\nrole='prefill'\n[[groups]]\nname='b'\nrole='mixed'", "groups: mixed replicas"),
    ("[router]\nname='telepathy'\n[[groups]]\nname='a'", "router.name: unknown router"),
    ("[router]\nstaleness_s=-1\n[[groups]]\nname='a'", "router.staleness_s:"),
    ("[router.params]\nzeal=3\n[[groups]]\nname='a'", "router.params:"),
    ("[[groups]]\nname='P'\nrole='prefill'\n[[groups]]\nname='D'\nrole='decode'\n[[links]]\nfrom='P'\nto='X'",
     "links: link P -> X: no group named 'X'"),
    ("[[groups]]\nname='P'\nrole='prefill'\n[[groups]]\nname='D'\nrole='decode'\n[[links]]\nfrom='P'\nto='D'\n"
     "kind='carrier-pigeon'", "links[0].kind:"),
    ("[[groups]]\nname='P'\nrole='prefill'\n[[groups]]\nname='D'\nrole='decode'\n[[links]]\nfrom='P'\nto='D'\n"
     "bandwidth_gb_s=0", "links[0].bandwidth_gb_s:"),
    ("groups = 3", "groups: a list"),
    # numbers that made a transfer time infinite (a crash writing summary.json) or the run endless
    ("[[groups]]\nname='P'\nrole='prefill'\n[[groups]]\nname='D'\nrole='decode'\n[[links]]\nfrom='P'\nto='D'\n"
     "bandwidth_gb_s=1e300", "links[0].bandwidth_gb_s: must be"),
    ("[[groups]]\nname='P'\nrole='prefill'\n[[groups]]\nname='D'\nrole='decode'\n[[links]]\nfrom='P'\nto='D'\n"
     "latency_s=1e300", "links[0].latency_s: must be"),
    ("[router]\nstaleness_s=1e300\n[[groups]]\nname='a'", "router.staleness_s: must be"),
    ("[[groups]]\nname='a'\n[autoscale]\ninterval=1e-300", "autoscale: interval_s must be"),
    ("[[groups]]\nname='a'\n[autoscale]\nstartup=1e300", "autoscale: startup_s must be"),
    # a group's keys meet the flags' rules (they reached the simulator unchecked: a TypeError or
    # ZeroDivisionError there, exit 1, or a NaN timeout that crashed writing summary.json)
    ("[[groups]]\nname='a'\ngpu_memory_utilization='0.5'", "groups[0].gpu_memory_utilization: --gpu-memory-util"),
    ("[[groups]]\nname='a'\nep=0", "groups[0].ep: --ep must be"),
    ("[[groups]]\nname='a'\nclient_timeout_s=nan", "groups[0].client_timeout_s:"),
    ("[[groups]]\nname='a'\nblock_size='16'", "groups[0].block_size: --block-size must be"),
    ("[[groups]]\nname='a'\nkv_cache_dtype=5", "groups[0].kv_cache_dtype: --kv-cache-dtype must be a name"),
    ("[[groups]]\nname='a'\nprefix_caching='yes'", "groups[0].prefix_caching: --prefix-caching must be true or false"),
    # a group's summary.json name of a flag replaces the command line's (it was "given twice")
    ("[[groups]]\nname='a'\nswap_space_gib=inf", "groups[0].swap_space_gib: --swap-space must be"),
    ("a = " + "[" * 3000 + "]" * 3000, "nested too deep"),
    # a profile no cost model reads (it was ignored: --profile on the command line is refused so)
    ("[[groups]]\nname='a'\nprofile='p.json'", 'groups[0].profile: is read only by cost_model = "profiled"'),
]


@pytest.mark.parametrize("text, expected", BAD)
def test_a_bad_cluster_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, expected):
    path = tmp_path / "c.toml"
    path.write_text(text)
    result = replay("--cluster", path)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert str(path) in lines[0] and expected in lines[0], lines[0]


@pytest.mark.parametrize("args, expected", [
    (["--pd", "2:0"], "--pd 2:0"),
    (["--pd", "x"], "--pd x"),
    (["--replicas", "2", "--pd", "1:1"], "give one of them"),
    (["--link", "nvlink"], "--link is the link of a --pd"),
    (["--replicas", "2", "--router", "telepathy"], "unknown router"),
    (["--replicas", "0"], "--replicas"),
])
def test_bad_cluster_flags_are_one_line(args, expected):
    result = replay(*args)
    assert result.exit_code == 2, result.output
    assert expected in result.output


def test_a_fifo_as_cluster_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    result = replay("--cluster", fifo)  # (it used to block the read forever)
    assert result.exit_code == 2, result.output
    assert f"{fifo}: is a FIFO" in result.output


def test_a_groups_swap_space_gib_overrides_the_command_lines_swap_space(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[[groups]]\nname='a'\nswap_space_gib=2\n")
    result = replay("--cluster", path, "--swap-space", "8", "--num-requests", "4")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cluster"]["groups"][0]["config"]["swap_space_gib"] == 2


def test_a_groups_max_model_len_is_judged_against_the_groups_model(tmp_path):
    """A max_model_len above the model's max_position_embeddings is refused (vLLM refuses it; it was
    accepted): a group's against the group's model (Llama-2-7B: 4096), not the command line's (OPT-13B: 2048)."""
    path = tmp_path / "c.toml"
    path.write_text("[[groups]]\nname='a'\nmax_model_len=4096\nmodel='llama-2-7b'\n")
    result = replay("--cluster", path, "--num-requests", "4")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cluster"]["groups"][0]["config"]["max_model_len"] == 4096
    for text, args, says in [
        ("max_model_len=4097\nmodel='llama-2-7b'", [],
         "groups[0].max_model_len: --max-model-len 4097 is greater than llama-2-7b's maximum length, 4096 tokens"),
        ("model='opt-13b'", ["--model", "llama-2-7b", "--max-model-len", "4096"],
         "groups[0].model: --max-model-len 4096 is greater than opt-13b's maximum length, 2048 tokens"),
    ]:
        path.write_text(f"[[groups]]\nname='a'\n{text}\n")
        result = replay("--cluster", path, *args)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert f"{path}: {says}" in lines[0], lines[0]

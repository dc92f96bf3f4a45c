"""One rule for every number and input file (pagesim.inputs), for flags and file fields alike:
the reproductions of issue 26's "Numbers and inputs", each one line naming what to fix, exit 2."""

from __future__ import annotations

import csv
import json
import math
import os
import random
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagesim
from pagesim.cli import app
from pagesim.inputs import (BURSTINESS, MAX_TP, RATE, RATE_OR_TRACE, STEP_SECONDS, TP, InputValueError, NumberRule,
                            json_depth_problem, parse_json)

ROOT = Path(__file__).resolve().parents[2]
ALPACA = str(ROOT / "traces" / "alpaca.json")
PROFILE = str(ROOT / "reports" / "profiles" / "smollm2_cpu.json")
PLAN = f"plan --model llama-2-7b --trace {ALPACA} --slo ttft_p99=2 --target-rate 1 --out {{tmp}}/plan"
DATA = Path(os.environ.get("PAGESIM_DATA_DIR", ROOT.parent / "shared" / "data"))
DEEP = '{"a": ' * 900 + "1" + "}" * 900  # 900 levels: past what a recursive walk survives


def test_the_rule_by_hand():
    # finite, in range, far enough from 0 (hand-picked values on each side of each bound)
    assert RATE.problem(1e-4) is None and RATE.problem(1e6) is None
    for bad in (0, 9.9e-5, 1e-300, 5e-324, -1.0, 1.000001e6, math.inf, math.nan, True, "1", 10**400):
        assert RATE.problem(bad) is not None, bad
    assert RATE_OR_TRACE.problem(0) is None and RATE_OR_TRACE.problem(5e-324) is not None
    assert BURSTINESS.problem(1e-310) is not None and BURSTINESS.problem(0.5) is None
    assert STEP_SECONDS.problem(0) is not None and STEP_SECONDS.problem(1e308) is not None
    assert TP.problem(MAX_TP) is None and TP.problem(MAX_TP + 1) is not None and TP.problem(10**41) is not None
    assert NumberRule().problem(1e13) is not None  # no float is unbounded
    with pytest.raises(InputValueError, match="^--tp must be an integer in"):
        TP.check(2.0, "--tp")
    with pytest.raises(InputValueError, match="nested more than 64 levels deep"):
        parse_json(DEEP, "x.json")


def _depth(value) -> int:
    """Brute-force nesting depth (recursive; only for the shallow documents below)."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def test_depth_check_agrees_with_a_recursive_walk():
    # containers mixed with long runs of scalars (the walk skips scalar-only lists in one go)
    rng = random.Random(7)

    def build(levels):
        if levels == 0 or rng.random() < 0.2:
            return rng.choice([1, 2.5, "x", None, True])
        items = [build(levels - 1) for _ in range(rng.randint(0, 3))] + list(range(rng.randint(0, 50)))
        rng.shuffle(items)
        return items if rng.random() < 0.5 else {str(i): v for i, v in enumerate(items)}

    for _ in range(300):
        doc = build(rng.randint(0, 9))
        depth = _depth(doc)
        for limit in {max(depth - 1, 1), max(depth, 1)}:
            assert (json_depth_problem(doc, limit) is None) == (depth <= limit), (doc, limit)


def test_the_api_meets_the_same_rule():
    with pytest.raises(ValueError, match="--rate must be"):
        pagesim.replay(ALPACA, num_requests=5, rate=1e-300)
    with pytest.raises(ValueError, match="--swap-space must be"):
        pagesim.replay(ALPACA, num_requests=5, swap_space=1e308)


def _profile_with(tmp_path: Path, seconds: float) -> Path:
    data = json.loads(Path(PROFILE).read_text())
    for step in data["steps"]:
        step["seconds"] = seconds
    path = tmp_path / f"profile_{seconds:g}.json"
    path.write_text(json.dumps(data))
    return path


CASES = [
    # denormal and extreme floats (issue 26: NaN in summary.json, internal errors, latencies of 0.0)
    (f"replay {ALPACA} --burstiness 1e-310", "'--burstiness'"),
    (f"replay {ALPACA} --rate 1e-300", "'--rate'"),
    (f"replay {ALPACA} --rate 5e-324", "'--rate'"),
    (f"replay {ALPACA} --swap-space 1e308", "'--swap-space'"),
    (f"replay {ALPACA} --tp {10**41}", "'--tp'"),
    (PLAN + f" --tp {10**41}", "--tp must be an integer in [1, 1,024]"),
    (PLAN + " --num-requests 100000000", "'--num-requests'"),
    (PLAN + " --start-rate 1e-300", "'--start-rate'"),
    (PLAN + " --min-duration 1e9", "asks for 1,000,000,000 requests, more than the 1,000,000"),
    # files: an arrival of 10^309, deep JSON anywhere, FIFOs
    ("replay {tmp}/huge_arrival.json --rate 0 --num-requests 1", "arrival_time"),
    ("replay {tmp}/deep_meta.json", "nested more than 64 levels deep"),
    (f"replay {ALPACA} --model {{tmp}}/deep/config.json", "nested more than 64 levels deep"),
    (f"replay {ALPACA} --model smollm2-135m --cost-model profiled --profile {{tmp}}/deep.json", "nested more than 64"),
    (PLAN + " --prices {tmp}/deep.json", "nested more than 64 levels deep"),
    ("replay {tmp}/fifo", "is a FIFO, not a regular file"),
    (f"replay {ALPACA} --model {{tmp}}/fifo.json", "is a FIFO, not a regular file"),
    ("calibrate check {tmp}/fifo --gpu a100-80gb", "is a FIFO, not a regular file"),
    ("calibrate check {tmp}/denormal.csv --gpu a100-80gb", "at least 1e-09 in size"),
    # profiles: of another model, or of steps that take 0 s or 1e308 s
    (f"replay {ALPACA} --cost-model profiled --profile {PROFILE} --model llama-2-7b", "not on llama-2-7b"),
    (f"replay {ALPACA} --model smollm2-135m --cost-model profiled --profile {{tmp}}/profile_0.json", "seconds must be"),
    (f"replay {ALPACA} --model smollm2-135m --cost-model profiled --profile {{tmp}}/profile_1e+308.json",
     "seconds must be"),
    # the plan's cache folder is checked before the trace is read
    ("plan --model llama-2-7b --trace no/such.json --slo ttft_p99=2 --target-rate 1 --out {tmp}/p "
     f"--cache-dir {ALPACA}", "'--cache-dir'"),
]


@pytest.mark.parametrize("command, words", CASES, ids=[c.replace(str(ROOT), "") for c, _ in CASES])
def test_one_line_exit_2(command, words, tmp_path):
    (tmp_path / "huge_arrival.json").write_text('{"format": "pagesim-trace/1", "metadata": {}, "requests": '
                                                '[{"prompt_len": 3, "output_len": 4, "arrival_time": 1' + "0" * 309 + "}]}")
    (tmp_path / "deep_meta.json").write_text('{"format": "pagesim-trace/1", "metadata": ' + DEEP
                                             + ', "requests": [{"prompt_len": 3, "output_len": 4}]}')
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "config.json").write_text(DEEP)
    (tmp_path / "deep.json").write_text(DEEP)
    os.mkfifo(tmp_path / "fifo")  # no writer: reading it would block forever
    os.mkfifo(tmp_path / "fifo.json")
    _profile_with(tmp_path, 0)
    _profile_with(tmp_path, 1e308)
    with open(tmp_path / "denormal.csv", "w", newline="") as f:  # one operator timed at a denormal 5e-324 ms
        w = csv.writer(f)
        w.writerow(["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                    "num_tensor_parallel_workers", "time_stats.attn_pre_proj.median"])
        w.writerow([32, 32, 4096, 11008, 32000, "True", 16, 1, "5e-324"])
    result = CliRunner().invoke(app, shlex.split(command.replace("{tmp}", str(tmp_path))))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert words in lines[0], lines[0]


def test_force_uses_a_profile_of_another_model():
    result = CliRunner().invoke(app, ["replay", ALPACA, "--num-requests", "5", "--cost-model", "profiled",
                                      "--profile", PROFILE, "--model", "llama-2-7b", "--force", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["num_finished"] == 5


@pytest.mark.skipif(not (DATA / "gpu_profiles").is_dir(), reason="needs ../shared/data/gpu_profiles")
def test_calibrate_check_json_is_strict_json():
    """No NaN or Infinity in the output (json.loads with parse_constant refusing them)."""
    path = next((DATA / "gpu_profiles" / "compute" / "a100").glob("*/*/mlp.csv"))
    result = CliRunner().invoke(app, ["calibrate", "check", str(path), "--gpu", "a100-80gb", "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.output, parse_constant=lambda name: pytest.fail(f"{name} in the output"))

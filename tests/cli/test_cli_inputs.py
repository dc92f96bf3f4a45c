"""Bad input to any command ends in one line on stderr that names the flag, file or field, and
exit status 2, before any work; never a traceback. The cases are the ones a hostile-user pass
found (issue 14), one or two per family."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = str(ROOT / "traces" / "sharegpt.json")
ALPACA = str(ROOT / "traces" / "alpaca.json")
PLAN = f"plan --model llama-2-7b --trace {SHAREGPT} --slo ttft_p99=2 --out {{tmp}}/plan"


def invoke(args: list[str]):
    return CliRunner().invoke(app, args)


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


CASES = [
    # non-finite and out-of-range numbers
    (f"replay {ALPACA} --duration inf", "'--duration'"),
    (f"replay {ALPACA} --rate inf", "'--rate'"),
    (f"replay {ALPACA} --rate nan", "'--rate'"),
    (f"replay {ALPACA} --burstiness inf", "'--burstiness'"),
    (f"replay {ALPACA} --burstiness 0", "'--burstiness'"),
    (f"replay {ALPACA} --warmup nan", "'--warmup'"),
    (f"replay {ALPACA} --warmup -5", "'--warmup'"),
    (f"replay {ALPACA} --swap-space -1", "'--swap-space'"),
    (f"replay {ALPACA} --block-size 0", "'--block-size'"),
    (f"replay {ALPACA} --tp 0", "'--tp'"),
    (f"replay {ALPACA} --tp x", "'--tp'"),
    (f"replay {ALPACA} --num-requests 0", "'--num-requests'"),
    (f"replay {ALPACA} --seed -1", "'--seed'"),
    # semantics that used to pass in silence
    (f"replay {ALPACA} --duration 10 --num-requests 5", "--num-requests or --duration"),
    (f"replay {ALPACA} --num-requests 5 --warmup 1000", "--warmup 1000 s is longer than the arrivals"),
    (f"replay {ALPACA} --profile x.json", "--profile is read only by --cost-model profiled"),
    (f"replay {ALPACA} --duration 1e9", "--duration 1e+09 asks for about 1,000,000,000 requests"),
    (f"replay {ALPACA} --num-requests 5000000", "'--num-requests'"),
    (f"replay {ALPACA} --duration 0.0001", "--duration 0.0001 s holds no arrival"),
    (f"replay {ALPACA} --model opt-13b --gpu no-such-gpu", "unknown GPU 'no-such-gpu'"),
    # past the model's positions (OPT-13B's max_position_embeddings: 2048), as vLLM refuses it
    (f"replay {ALPACA} --max-model-len 4096", "--max-model-len 4096 is greater than opt-13b's maximum length, 2048 tokens"),
    (f"replay {ALPACA} --num-gpu-blocks 1000000000000", "'--num-gpu-blocks'"),
    (f"replay {ALPACA} --swap-space 1000000", "'--swap-space'"),
    # 1 TiB of host memory (the flag's bound) in blocks of llama-2-7b at block size 4096 is within the pool limit,
    # in blocks of SmolLM2 (30 layers x 3 KV heads x 64 x 2 x 2 bytes = 23,040 bytes/token) at block size 1 it is not
    (f"replay {ALPACA} --model smollm2-135m --block-size 1 --swap-space 1024",
     f"swap_space_gib gives a pool of {2**40 // 23040:,} blocks"),
    # files
    ("replay no/such/trace.json", "no/such/trace.json: no such trace file"),
    ("replay {tmp}/deep.json", "nested more than 64 levels deep"),
    (f"replay {ALPACA} --out {ALPACA}", "'--out'"),
    (f"replay {ALPACA} --out {ALPACA}/sub", "is not a folder"),
    (f"trace inspect {ALPACA} --plot {ALPACA}/x.png", "'--plot'"),
    ("trace inspect no/such.json", "no/such.json: no such trace file"),
    ("trace build alpaca --out {tmp}/a.json --data-dir {tmp}/nothing", "Alpaca sample not found"),
    ("trace build alpaca --out {tmp}/a.json --num 0", "'--num'"),
    # plan
    (PLAN + " --target-rate inf", "'--target-rate'"),
    (PLAN + ' --target-rate 1 --gpus ""', "--gpus: no value given"),
    (PLAN + " --target-rate 1 --tp 0", "--tp must be an integer in [1, 1,024]"),
    (PLAN + " --target-rate 1 --min-headroom 1", "'--min-headroom'"),
    (PLAN + " --target-rate 1 --profile p.json", "--profile is read only by --cost-model profiled"),
    # executor commands fail on their flags before loading any model
    (f"run {ALPACA} --model random:llama-tiny --block-size 0", "'--block-size'"),
    (f"run {ALPACA} --model random:llama-tiny --dtype float99", "'--dtype'"),
    (f"run {ALPACA} --model random:llama-tiny --rate 0", "no arrival_time"),
    ("profile --model random:llama-tiny --out {tmp}/p.json --reps 0", "'--reps'"),
    ("profile --model random:llama-tiny --out {tmp}/p.json --grid huge", "--grid must be"),
    (f"compare {ALPACA} --profile {{tmp}}/missing.json", "no such profile"),
    (f"compare {ALPACA} --profile x --rate -1", "'--rate'"),
    ("figures --jobs 0", "'--jobs'"),
    # serve and bench, and the calibrated model's check
    ("serve --model random:llama-tiny --block-size 0", "'--block-size'"),
    ("serve --model random:llama-tiny --log-level loud", "--log-level must be"),
    # (a request past the positions got a 500 from an IndexError in the engine step)
    ("serve --model random:llama-tiny --port 0 --max-model-len 5000",
     "--max-model-len 5000 is greater than random:llama-tiny's maximum length, 256 tokens"),
    ("serve --model random:opt-tiny --port 0 --max-model-len 5000",  # (a learned table: no env var lifts it)
     "--max-model-len 5000 exceeds random:opt-tiny's table of 256 learned positions"),
    (f"bench {ALPACA} --endpoint notaurl", "'--endpoint'"),
    (f"bench {ALPACA} --endpoint http://127.0.0.1:9 --rate inf", "'--rate'"),
    (f"bench {ALPACA} --endpoint http://127.0.0.1:9 --max-concurrency 0", "'--max-concurrency'"),
    ("calibrate check {tmp}/missing.csv --gpu a100-80gb", "no such CSV file"),
    # validate's flags are checked before the run is read
    (f"validate {ALPACA} --concurrency -1", "'--concurrency': must be an integer >= 0, got -1"),
    (f"calibrate check {ALPACA} --gpu a100-80gb", "missing column"),
    # usage errors from the parser itself
    (f"replay {ALPACA} --no-such-flag", "No such option: --no-such-flag"),
    ("replay", "Missing argument"),
]


@pytest.mark.parametrize("command, words", CASES, ids=[c for c, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(command, words, tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    result = invoke(shlex.split(command.replace("{tmp}", str(tmp_path))))
    lines = error_lines(result)
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert words in lines[0]
    assert "Traceback" not in result.output


def test_prefix_caching_without_token_ids_warns(tmp_path):
    result = invoke(["replay", ALPACA, "--prefix-caching", "--num-requests", "5", "--json"])
    assert result.exit_code == 0
    assert "warning: --prefix-caching: " in result.output and "no prompt_token_ids" in result.output


def test_json_output_is_strict_json():
    result = invoke(["replay", ALPACA, "--num-requests", "5", "--json", "--num-gpu-blocks", "0"])
    assert result.exit_code == 0
    json.loads(result.output, parse_constant=lambda c: pytest.fail(f"{c} in --json output"))


def test_a_bug_is_one_line_exit_1_and_debug_shows_the_traceback(monkeypatch):
    from pagesim.sim import engine

    def broken(self):
        raise engine.SchedulerStalled("requests are queued but nothing can run")

    monkeypatch.setattr(engine.Replay, "run", broken)
    result = invoke(["replay", ALPACA, "--num-requests", "5"])
    assert result.exit_code == 1
    assert error_lines(result) == ["error: internal error, this is a bug in pagesim: SchedulerStalled: requests are queued "
                                   "but nothing can run (run `pagesim --debug ...` for the traceback)"]
    debug = invoke(["--debug", "replay", ALPACA, "--num-requests", "5"])
    assert isinstance(debug.exception, engine.SchedulerStalled)


def test_version():
    import pagesim

    result = invoke(["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"pagesim \d+\.\d+\.\d+\S*\n", result.output)
    assert pagesim.__version__ in result.output


def _commands():
    yield []
    for command in app.registered_commands:
        yield [command.name or command.callback.__name__]
    yield ["trace", "build"]
    yield ["trace", "inspect"]


@pytest.mark.parametrize("path", list(_commands()), ids=lambda p: " ".join(p) or "pagesim")
def test_help_shows_every_option_name_whole_at_80_columns(path):
    import typer.main

    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    command = typer.main.get_command(app)
    for part in path:
        command = command.commands[part]
    for param in command.params:
        for name in param.opts + param.secondary_opts:
            if name.startswith("--"):
                assert re.search(rf"(^|[\s,/]){re.escape(name)}($|[\s,/=])", result.output, re.M), name

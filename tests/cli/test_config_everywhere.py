"""`--config FILE` and the "reproduce with" line for run, bench, compare and plan (issue 27 item 3),
and one set of defaults across replay, run, bench, compare and plan (item 4), read from the typer
commands themselves."""

from __future__ import annotations

import csv
import inspect
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pagesim.cli import app

ROOT = Path(__file__).resolve().parents[2]
SERVING = ("run", "bench", "compare")  # commands whose results hold a `config` to run them again
# requests.csv's columns that do not depend on the wall clock: the requests the run served
WORKLOAD_COLUMNS = ("request_id", "status", "reject_reason", "arrival_time", "prompt_len", "output_len", "num_seqs")


def params(command: str) -> dict:
    """The click parameters of `pagesim COMMAND`, by name."""
    group = typer.main.get_command(app)
    return {p.name: p for p in group.get_command(None, command).params}


def default(command: str, name: str):
    value = params(command)[name].default
    return getattr(value, "value", value)


def workload_rows(folder: Path) -> list[tuple]:
    with open(folder / "requests.csv", newline="") as f:
        return [tuple(row[c] for c in WORKLOAD_COLUMNS) for row in csv.DictReader(f)]


def test_the_same_flags_mean_the_same_requests_everywhere():
    commands = ("replay", "run", "bench", "compare", "plan")
    for name in ("num_requests", "seed"):
        values = {c: default(c, name) for c in commands}
        assert len(set(values.values())) == 1, (name, values)
    for name in ("rate", "burstiness"):
        values = {c: default(c, name) for c in commands if name in params(c)}
        assert len(values) >= 3 and len(set(values.values())) == 1, (name, values)
    preemption = {c: default(c, "preemption") for c in ("replay", "run", "compare", "plan")}
    assert set(preemption.values()) == {"auto"}, preemption  # the paper's (and vLLM v0's) default
    assert default("replay", "cost_model") == default("plan", "cost_model") == "calibrated"
    # compare's simulator uses the profile it is given, else the same default as replay
    assert default("compare", "cost_model") is None and "else calibrated" in params("compare")["cost_model"].help
    # ... and the Python API and the configuration objects behind the commands say the same
    import pagesim.api
    from executor.run import RunConfig
    from pagesim.compare import CompareSettings
    from pagesim.plan.grid import RunSettings
    from pagesim.sim.engine import ReplayConfig

    plan_api = inspect.signature(pagesim.api.plan).parameters
    assert plan_api["num_requests"].default == default("plan", "num_requests") == RunSettings("m").num_requests
    assert plan_api["preemption"].default == preemption["plan"] and plan_api["seed"].default == default("plan", "seed")
    assert plan_api["cost_model"].default == default("plan", "cost_model") == ReplayConfig().cost_model
    for cfg in (ReplayConfig(), RunConfig(), CompareSettings()):
        assert (cfg.num_requests, cfg.seed, cfg.rate) == (default("replay", "num_requests"), default("replay", "seed"),
                                                          default("replay", "rate")), cfg


def test_the_defaults_table_in_docs_cli_md_matches_the_commands():
    """docs/cli.md's one table of defaults: every cell is the command's own default."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("| default |"):].split("\n\n")[0].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[1:] == ["replay", "run", "bench", "compare", "plan"]
    flags = {"`--num-requests`": "num_requests", "`--rate`": "rate", "`--seed`": "seed",
             "`--burstiness`": "burstiness",
             "`--preemption`": "preemption", "`--cost-model`": "cost_model"}
    seen = set()
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] not in flags:
            continue
        seen.add(cells[0])
        for command, cell in zip(header[1:], cells[1:]):
            if cell.split()[0] == "-":  # (with a note on what stands for it)
                assert flags[cells[0]] not in params(command), (cells[0], command)
                continue
            value = default(command, flags[cells[0]])
            assert cell.split()[0].strip("`") == (f"{value:g}" if isinstance(value, float) else str(value)) or \
                (value is None and "calibrated" in cell), (cells[0], command, cell, value)
    assert seen == set(flags)


def test_run_is_recreated_from_its_summary_config(tmp_path, monkeypatch):
    """`pagesim run TRACE --config A/summary.json` serves the same requests with the same settings:
    the same config and the same requests.csv columns that do not depend on the wall clock."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    first = CliRunner().invoke(app, ["run", "traces/alpaca.json", "--model", "random:llama-tiny", "--num-requests", "5",
                                     "--rate", "500", "--max-model-len", "256", "--seed", "3", "--out", str(tmp_path / "A")])
    assert first.exit_code == 0, first.output
    a = json.loads((tmp_path / "A" / "summary.json").read_text())
    assert a["config"]["seed"] == 3 and a["config"]["model"] == "random:llama-tiny" and a["config"]["rate"] == 500
    again = CliRunner().invoke(app, ["run", "traces/alpaca.json", "--config", str(tmp_path / "A" / "summary.json"),
                                     "--out", str(tmp_path / "B")])
    assert again.exit_code == 0, again.output
    b = json.loads((tmp_path / "B" / "summary.json").read_text())
    assert b["config"] == a["config"] and b["engine"] == a["engine"]
    assert workload_rows(tmp_path / "B") == workload_rows(tmp_path / "A") and len(workload_rows(tmp_path / "A")) == 5
    # a flag overrides the file: a different seed, different arrivals
    other = CliRunner().invoke(app, ["run", "traces/alpaca.json", "--config", str(tmp_path / "A" / "summary.json"),
                                     "--seed", "4", "--num-requests", "2", "--out", str(tmp_path / "C")])
    assert other.exit_code == 0, other.output
    assert json.loads((tmp_path / "C" / "summary.json").read_text())["config"]["seed"] == 4
    assert len(workload_rows(tmp_path / "C")) == 2


def test_bench_and_compare_store_their_config_and_print_how_to_reproduce(tmp_path):
    from tests.bench.conftest import LENGTHS
    from tests.bench.fake_server import FakeServer, Script, honest_stream
    from pagesim.workload.trace import Trace, TraceRequest, save_trace

    trace = tmp_path / "small.json"
    save_trace(Trace({"source": "tests/cli", "count": len(LENGTHS)}, [TraceRequest(p, o) for p, o in LENGTHS]), trace)
    with FakeServer(Script(respond=lambda payload, i: (200, honest_stream(payload)))) as server:
        args = ["bench", str(trace), "--endpoint", server.base, "--rate", "100", "--num-requests", "4",
                "--scrape-interval", "0", "--seed", "2"]
        first = CliRunner().invoke(app, args + ["--out", str(tmp_path / "A")])
        assert first.exit_code == 0, first.output
        a = json.loads((tmp_path / "A" / "summary.json").read_text())
        line = (f"pagesim bench {trace} --endpoint {server.base} --rate 100.0 --num-requests 4 --scrape-interval 0.0 "
                "--seed 2 --out NEW_FOLDER")
        assert a["reproduce"] == line and f"reproduce with: {line}" in " ".join(first.output.split())
        again = CliRunner().invoke(app, ["bench", str(trace), "--config", str(tmp_path / "A" / "summary.json"),
                                         "--out", str(tmp_path / "B")])
        assert again.exit_code == 0, again.output
        b = json.loads((tmp_path / "B" / "summary.json").read_text())
        assert b["config"] == a["config"] and a["config"]["num_requests"] == 4 and a["config"]["seed"] == 2
        assert workload_rows(tmp_path / "B") == workload_rows(tmp_path / "A")

        cmp_args = ["compare", str(trace), "--endpoint", server.base, "--system", "paged-recompute", "--system",
                    "orca-oracle", "--num-requests", "4", "--rate", "50"]
        first = CliRunner().invoke(app, cmp_args + ["--out", str(tmp_path / "C1")])
        assert first.exit_code == 0, first.output
        c1 = json.loads((tmp_path / "C1" / "compare.json").read_text())["meta"]
        line = (f"pagesim compare {trace} --endpoint {server.base} --system paged-recompute --system orca-oracle "
                "--rate 50.0 --num-requests 4 --out NEW_FOLDER")
        assert c1["reproduce"] == line and f"reproduce with: {line}" in " ".join(first.output.split())
        assert c1["config"]["system"] == ["paged-recompute", "orca-oracle"]
        again = CliRunner().invoke(app, ["compare", str(trace), "--config", str(tmp_path / "C1" / "compare.json"),
                                         "--out", str(tmp_path / "C2")])
        assert again.exit_code == 0, again.output
        c2 = json.loads((tmp_path / "C2" / "compare.json").read_text())
        assert c2["meta"]["config"] == c1["config"] and set(c2["systems"]) == {"paged-recompute", "orca-oracle"}


def test_plan_takes_a_config_file_and_prints_how_to_reproduce(tmp_path):
    from pagesim.workload.trace import save_trace
    from tests.plan.common import SMALL_TRACE

    trace = tmp_path / "trace.json"
    save_trace(SMALL_TRACE, trace)
    config = tmp_path / "plan.toml"
    config.write_text(f'model = "llama-2-7b"\ntrace = "{trace}"\ntarget-rate = 50\nslo = "ttft_p99=2.0"\n'
                      'gpus = "a100-40gb"\nnum_requests = 60\nmin_duration = 0\ntolerance = 0.1\njobs = 1\n'
                      'no_cache = true\nstart_rate = 16\nseed = 1\nmin_measured = 50\nmax_requests = 1280\nseeds = 1\n'
                      'check_longer = 0\n')
    result = CliRunner().invoke(app, ["plan", "--config", str(config), "--seed", "2", "--out", str(tmp_path / "P")])
    assert result.exit_code == 0, result.output
    command = json.loads((tmp_path / "P" / "plan.json").read_text())["command"]
    assert "--model llama-2-7b" in command and "--num-requests 60" in command and "--seed 2" in command
    assert command.endswith(f"--out {tmp_path / 'P'}")
    printed = " ".join(result.output.split())
    assert f"reproduce with: {command.removesuffix(str(tmp_path / 'P'))}NEW_FOLDER" in printed
    typo = tmp_path / "typo.yaml"
    typo.write_text("modle: llama-2-7b\n")
    bad = CliRunner().invoke(app, ["plan", "--config", str(typo)])
    assert bad.exit_code == 2 and f"{typo}: unknown key 'modle' for `pagesim plan`" in bad.output


@pytest.mark.parametrize("command", SERVING)
def test_a_bad_key_names_the_file_and_the_command(tmp_path, command):
    path = tmp_path / "c.toml"
    path.write_text("num_requets = 4\n")
    result = CliRunner().invoke(app, [command, "traces/alpaca.json", "--config", str(path)])
    assert result.exit_code == 2 and f"{path}: unknown key 'num_requets' for `pagesim {command}`" in result.output

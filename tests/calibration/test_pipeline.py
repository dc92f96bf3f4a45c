"""profile -> fit -> compare, end to end on a tiny random model."""

import csv
import json

import pytest

from executor.run import RunClock
from pagesim.compare import METRICS, CompareSettings, compare, relative_error
from pagesim.sim.cost.profiled import HOLDOUT_EVERY, ProfiledCostModel, load_profile


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    import torch

    from executor.models.loader import load_model
    from executor.profiler import ProfileGrid, profile_engine

    torch.set_num_threads(1)
    lm = load_model("random:llama-tiny", seed=0)
    data = profile_engine(lm, ProfileGrid.tiny(), clock="cpu", model_spec="random:llama-tiny", command="test")
    path = tmp_path_factory.mktemp("prof") / "tiny.json"
    path.write_text(json.dumps(data))
    return lm, path, data


def test_profile_file_describes_hardware_model_and_shapes(tiny_profile):
    _, path, data = tiny_profile
    assert data["hardware"]["device"] == "cpu" and data["hardware"]["torch_threads"] == 1
    assert data["model"]["num_layers"] == 2 and data["clock"] == "cpu" and data["block_size"] == 16
    prefill = [s for s in data["steps"] if s["kind"] == "prefill"]
    decode = [s for s in data["steps"] if s["kind"] == "decode"]
    # the shapes asked for are the shapes measured (independent arithmetic of the causal pairs)
    assert len(prefill) == 8 and len(decode) == 10
    for rec, (n, t) in zip(prefill, [(1, 2), (1, 4), (1, 16), (1, 48), (2, 8), (2, 24), (4, 12), (3, 2)]):
        assert rec["shape"]["num_prefill_seqs"] == n and rec["shape"]["num_prefill_tokens"] == n * t
        assert rec["shape"]["prefill_attn_pairs"] == n * t * (t + 1) // 2
    for rec, (b, c) in zip(decode, [(1, 8), (1, 40), (2, 16), (3, 24), (4, 8), (4, 32), (6, 12), (8, 16), (8, 40), (16, 8)]):
        assert rec["shape"]["num_decode_seqs"] == b
        assert b * c <= rec["shape"]["decode_context_tokens"] <= b * (c + 2)  # the middle of 2 reps
    assert all(r["seconds"] > 0 for r in data["steps"] + data["swaps"] + data["copies"])
    assert load_profile(path).steps  # the file reads back


def test_fit_reproduces_training_points_within_stated_error(tiny_profile):
    _, path, data = tiny_profile
    model = ProfiledCostModel.from_profile(path)
    stated = model.describe()["train_error"]["max_abs"]
    assert stated is not None
    from pagesim.sim.cost import BatchShape

    for i, rec in enumerate(data["steps"]):
        if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1:
            continue
        predicted = model.iteration_time(BatchShape(**rec["shape"]))
        assert abs(predicted / rec["seconds"] - 1) <= stated + 1e-12


def test_compare_runs_both_drivers_on_the_same_arrivals(tiny_profile, tmp_path):
    from pagesim.workload.trace import load_trace

    lm, path, _ = tiny_profile
    settings = CompareSettings(rate=200.0, num_requests=12, num_gpu_blocks=12, num_cpu_blocks=32, max_num_seqs=8,
                               max_num_batched_tokens=256, max_model_len=256, clock="cpu")
    result = compare(lm, load_trace("traces/alpaca.json"), "paged-swap", settings, str(path), out_dir=tmp_path)
    assert [r["key"] for r in result.rows] == [k for _, k in METRICS]
    for row in result.rows:
        assert row["executor"] == result.executor[row["key"]] and row["simulator"] == result.simulator[row["key"]]
        assert row["rel_error"] == relative_error(row["simulator"], row["executor"])
    assert result.executor["num_finished"] == result.simulator["num_finished"] >= 10
    assert result.executor["reject_reasons"] == result.simulator["reject_reasons"]  # a request longer than the pool
    # identical requests and arrival times on both sides
    def arrivals(side):
        with open(tmp_path / "paged-swap" / side / "requests.csv") as f:
            return sorted((int(r["request_id"]), float(r["arrival_time"]), int(r["prompt_len"]), int(r["output_len"]))
                          for r in csv.DictReader(f))
    assert arrivals("executor") == arrivals("simulator")
    assert result.simulator["cost_model"]["name"] == "profiled"
    assert result.simulator["num_host_blocks"] == 32 and result.simulator["num_kv_blocks"] == 12


def test_compare_cli_writes_table_json_and_figure(tiny_profile, tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    _, path, _ = tiny_profile
    out = tmp_path / "cmp"
    result = CliRunner().invoke(app, ["compare", "traces/sharegpt.json", "--profile", str(path), "--model", "random:llama-tiny",
                                      "--length-scale", "32", "--num-requests", "6", "--rate", "100", "--num-gpu-blocks", "10",
                                      "--max-num-seqs", "8", "--system", "paged-recompute", "--system", "orca-oracle",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare.json").read_text())
    assert set(data["systems"]) == {"paged-recompute", "orca-oracle"}
    table = (out / "compare.md").read_text()
    # the metrics' rows, then the step-level error by kind (5 kinds and "all")
    assert table.count("| paged-recompute |") == len(METRICS) + 6 and "**request throughput" in table
    assert "| paged-recompute | with swap |" in table and data["systems"]["orca-oracle"]["step_fidelity"]["all"]["count"]
    assert (out / "compare.png").stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["compare", "traces/alpaca.json", "--profile", str(tmp_path / "none.json")])
    assert bad.exit_code == 2 and "no such profile" in bad.output


def test_cpu_clock_skips_idle_gaps_and_counts_work():
    clock = RunClock("cpu")
    start = clock()
    clock.wait_until(start + 100.0)  # no sleeping: the gap is skipped
    assert 100.0 <= clock() - start < 100.5
    t = clock()
    x = sum(i * i for i in range(200_000))  # noqa: F841  some CPU work advances the clock
    assert clock() > t
    with pytest.raises(ValueError, match="clock"):
        RunClock("sundial")


def test_compare_writes_the_step_log_the_metrics_saw(tiny_profile, tmp_path):
    from pagesim.sim.cost.step_shapes import read_step_shapes
    from pagesim.workload.trace import load_trace

    lm, path, _ = tiny_profile
    settings = CompareSettings(rate=200.0, num_requests=8, num_gpu_blocks=12, num_cpu_blocks=32, max_num_seqs=8,
                               max_num_batched_tokens=256, max_model_len=256, clock="cpu", n=2)
    result = compare(lm, load_trace("traces/alpaca.json"), "paged-swap", settings, str(path), out_dir=tmp_path)
    shapes = read_step_shapes(tmp_path / "paged-swap" / "executor" / "step_shapes.csv")
    with open(tmp_path / "paged-swap" / "executor" / "steps.csv") as f:
        steps = list(csv.DictReader(f))
    # one row per recorded step, with the same duration and token counts as the metrics' steps.csv
    assert len(shapes) == len(steps) == result.executor["num_steps"] > 0
    for (shape, seconds), step in zip(shapes, steps):
        assert seconds == float(step["duration"])
        assert shape.num_prefill_tokens == int(step["num_prefill_tokens"])
        assert shape.num_decode_seqs == int(step["num_decode_seqs"])
        assert shape.num_copy_blocks == int(step["blocks_copied"])
        assert shape.num_swap_blocks == int(step["blocks_swapped_in"]) + int(step["blocks_swapped_out"])
    assert result.step_fidelity["all"]["count"] == len(shapes)
    assert any(s.num_copy_blocks for s, _ in shapes)  # n=2 reached the executor: forks copy on write


def test_compare_repeated_interleaves_rounds_and_pools_profiles(tiny_profile, tmp_path):
    from executor.profiler import ProfileGrid
    from pagesim.compare import RunSpec, compare_repeated
    from pagesim.workload.trace import load_trace

    lm, _, _ = tiny_profile
    settings = CompareSettings(rate=200.0, num_requests=5, num_gpu_blocks=12, num_cpu_blocks=32, max_num_seqs=8,
                               max_num_batched_tokens=256, max_model_len=256, clock="cpu")
    specs = [RunSpec("a", "paged-recompute", settings), RunSpec("b", "orca-oracle", settings)]
    grid = ProfileGrid.tiny()
    grid.prefill, grid.decode = grid.prefill[:6], grid.decode[:8]  # the fit's minimum: faster
    messages = []
    results, used = compare_repeated(lm, load_trace("traces/alpaca.json"), specs, None, 2, tmp_path, reprofile=True,
                                     profile_grid=grid, log=messages.append)
    order = [m.split(" in ")[0] for m in messages]
    assert order == ["round 1: profiled", "round 1: a", "round 1: b", "round 2: profiled", "round 2: a", "round 2: b"]
    assert used == str(tmp_path / "profiles" / "pooled.json")
    pooled = json.loads((tmp_path / "profiles" / "pooled.json").read_text())
    rounds = [json.loads((tmp_path / "profiles" / f"round{r}.json").read_text()) for r in (1, 2)]
    for i, rec in enumerate(pooled["steps"]):  # of two records, the lower median: the faster one, with its own shape
        faster = min((r["steps"][i] for r in rounds), key=lambda r: r["seconds"])
        assert rec["seconds"] == faster["seconds"] and rec["shape"] == faster["shape"]
        assert sorted(rec["samples"]) == sorted(x for r in rounds for x in r["steps"][i]["samples"])
    for r in results:
        assert [run["round"] for run in r.runs] == [1, 2]
        assert r.step_fidelity["all"]["count"] == sum(run["summary"]["num_steps"] for run in r.runs)
        assert r.simulator["cost_model"]["profile"] == "profiles/pooled.json"
        tp = next(b for b in r.bands if b["key"] == "request_throughput")
        values = [run["summary"]["request_throughput"] for run in r.runs]
        assert tp["executor_values"] == values and tp["mean"] == pytest.approx(sum(values) / 2)
        assert tp["low"] <= tp["mean"] <= tp["high"]
        assert all(run["speed_vs_profile"] > 0 and run["speed_vs_round_profile"] > 0 for run in r.runs)
        assert (tmp_path / r.label / "executor" / "run2" / "step_shapes.csv").exists()


def test_compare_cli_repeat_writes_bands(tiny_profile, tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    _, path, _ = tiny_profile
    out = tmp_path / "rep"
    args = ["compare", "traces/sharegpt.json", "--profile", str(path), "--model", "random:llama-tiny",
            "--length-scale", "32", "--num-requests", "5", "--rate", "100", "--num-gpu-blocks", "10",
            "--max-num-seqs", "8", "--system", "paged-recompute-chunked", "--n", "2", "--repeat", "2"]
    result = CliRunner().invoke(app, args + ["--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare.json").read_text())
    entry = data["systems"]["paged-recompute-chunked"]
    assert [run["summary"]["run"]["n"] for run in entry["runs"]] == [2, 2]
    assert all(run["summary"]["engine"]["chunked_prefill"] for run in entry["runs"])
    assert entry["simulator"]["cost_model"]["profile"] == str(path)  # no --reprofile: the profile given
    assert "95 % band" in (out / "compare.md").read_text() and "paged-recompute-chunked: headline metrics" in result.output
    # issue 27: bands of positive metrics stay >= 0 with two runs; the terminal gets tables, not markdown
    assert all(b["low"] >= 0 for b in entry["bands"] if b["low"] is not None)
    assert "|---" not in result.output and "95 % band" in result.output and "**" not in result.output
    for extra, message in ((["--endpoint", "http://x"], "--endpoint"), ([], "need --out")):
        bad = CliRunner().invoke(app, args + extra)
        assert bad.exit_code == 2 and message in bad.output

"""Issue 27 item 7: the end-of-run tables read whole at 80 columns (a value beside its unit, a
configuration name uncut), a simulated duration is said to be simulated time, and with n samples
the output token rate counts every sample (as vLLM does) with the one-per-request rate beside."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import pagesim
from pagesim.cli import app
from pagesim.cli.summary_table import print_summary
from pagesim.cli.tables import Column, pack, print_rows
from pagesim.metrics import read_requests_csv
from tests.plan.common import SMALL_TRACE
from pagesim.workload.trace import save_trace

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = ROOT / "traces" / "sharegpt.json"


def printed(summary: dict, width: int = 80) -> list[str]:
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=width), "paged · opt-13b on 1 x a100-40gb · block 16")
    return out.getvalue().splitlines()


@pytest.fixture(scope="module")
def sampled_run():
    return pagesim.replay(str(SHAREGPT), num_requests=60, rate=2.0, n=4)


def test_every_value_keeps_its_unit_on_one_line_at_80_columns(sampled_run):
    s = sampled_run.summary
    lines = printed(s)
    assert max(map(len, lines)) <= 80
    for value in (f"{s['duration_s']:,.1f} s", f"{s['request_throughput']:,.3f} req/s",
                  f"{s['output_token_throughput']:,.1f} tok/s", f"{s['mean_kv_utilization'] * 100:.1f} %",
                  f"{s['peak_kv_utilization'] * 100:.1f} %", f"{s['num_finished']:,} of {s['num_requests']:,}",
                  f"{s['ttft_p99']:.3f}", f"{s['tpot_p50'] * 1e3:.2f}", f"{s['mean_normalized_latency']:.4f}"):
        assert any(value in line for line in lines), value
    assert any(line.startswith("│ simulated time ") for line in lines)
    assert "latency (simulated time)" in "\n".join(lines)


def test_a_measured_run_says_measured_time(sampled_run):
    s = {k: v for k, v in sampled_run.summary.items() if k != "cost_model"}  # as run and bench write it
    text = "\n".join(printed(s))
    assert "measured time" in text and "simulated" not in text


def test_n_samples_count_every_sample_with_one_per_request_beside(sampled_run, tmp_path):
    """The simulator gives each of a request's 4 samples the trace's output length (no stop tokens),
    so every sample's tokens are 4 x the longest's, request by request."""
    sampled_run.write(tmp_path)
    records = [r for r in read_requests_csv(tmp_path / "requests.csv") if r.status == "finished"]
    assert records and all(r.num_seqs == 4 and r.total_output_len == 4 * r.output_len for r in records)
    s = sampled_run.summary
    longest = sum(r.output_len for r in records)
    assert s["longest_output_tokens"] == longest and s["total_output_tokens"] == 4 * longest
    assert s["output_throughput"] == s["output_token_throughput"] == pytest.approx(4 * longest / s["duration_s"])
    assert s["longest_output_throughput"] == pytest.approx(longest / s["duration_s"])
    lines = printed(s)
    assert any("output, all samples" in line and f"{4 * longest / s['duration_s']:,.1f} tok/s" in line for line in lines)
    assert any("output, one per req." in line and f"{longest / s['duration_s']:,.1f} tok/s" in line for line in lines)


def test_one_sample_prints_one_output_rate():
    s = pagesim.replay(str(SHAREGPT), num_requests=20, rate=2.0).summary
    assert s["longest_output_tokens"] == s["total_output_tokens"]
    text = "\n".join(printed(s))
    assert "all samples" not in text and f"{s['output_token_throughput']:,.1f} tok/s" in text


def test_rows_print_as_a_table_where_they_fit_and_as_uncut_blocks_where_not():
    columns = [Column("#"), Column("configuration", "left"), Column("capacity/replica"), Column("$/h")]
    rows = [["1", "a100-40gb x1 b16 recompute s256", "109.99", "1,234.10"], ["2", "h100-80gb x2 b32 swap s64", "-", "-"]]
    wide, narrow = io.StringIO(), io.StringIO()
    print_rows(Console(file=wide, width=120), "plan", columns, rows)
    print_rows(Console(file=narrow, width=40), "plan", columns, rows)
    assert "│ 1 │ a100-40gb x1 b16 recompute s256 │           109.99 │ 1,234.10 │" in wide.getvalue()
    assert narrow.getvalue().splitlines() == ["plan", "  1 a100-40gb x1 b16 recompute s256",
                                              "    capacity/replica 109.99", "    $/h 1,234.10",
                                              "  2 h100-80gb x2 b32 swap s64"]
    assert pack(["ab", "cd", "efgh"], 9) == ["ab  ·  cd", "efgh"]


def test_plan_names_every_configuration_whole_at_80_columns(tmp_path):
    trace = tmp_path / "small.json"
    save_trace(SMALL_TRACE, trace)
    result = CliRunner().invoke(app, ["plan", "--model", "llama-2-7b", "--trace", str(trace), "--num-requests", "80",
                                      "--min-duration", "0", "--target-rate", "20", "--slo", "ttft_p99=0.5", "--min-measured", "50",
                                      "--max-requests", "1280", "--seeds", "1", "--check-longer", "0",
                                      "--gpus", "a100-40gb,h100-80gb", "--preemption", "recompute,swap", "--no-cache",
                                      "--jobs", "1", "--out", str(tmp_path / "plan")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for label in ("a100-40gb x1 b16 recompute s256", "a100-40gb x1 b16 swap s256", "h100-80gb x1 b16 recompute s256"):
        assert any(label in line for line in lines), label
    # the "reproduce with" command is one line on purpose (it is copied whole, never wrapped)
    table = [line for line in lines if not line.startswith("reproduce with: ")]
    assert "…" not in "\n".join(table) and max(map(len, table)) <= 80

"""Generated traces and flag combinations thrown at `pagesim replay` in-process: every one ends in
a clean run, with each submitted request in requests.csv as finished or rejected with a reason,
or in a clean error (one line, exit 2). Exit 1 (a bug) or a traceback fails the test."""

from __future__ import annotations

import csv
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.trace import Trace, TraceRequest, save_trace

ROOT = Path(__file__).resolve().parents[2]
BEAM_ANCESTRY = ROOT / "tests" / "sim" / "data" / "beam_ancestry_synthetic.json"


@st.composite
def traces(draw) -> Trace:
    count = draw(st.integers(1, 5))
    timed = draw(st.booleans())
    with_ids = draw(st.booleans())
    t = 0.0
    records = []
    for _ in range(count):
        prompt_len = draw(st.integers(1, 300) if with_ids else st.one_of(st.integers(1, 3000), st.just(10**9)))
        output_len = draw(st.integers(1, 800))
        arrival = None
        if timed:
            t += draw(st.floats(0, 5, allow_nan=False))
            arrival = round(t, 3)
        ids = [draw(st.integers(0, 3))] * prompt_len if with_ids else None  # few distinct prefixes
        sharing = draw(st.sampled_from([{}, {"n": 2}, {"beam_width": 2}]))
        records.append(TraceRequest(prompt_len=prompt_len, output_len=output_len, arrival_time=arrival,
                                    prompt_token_ids=ids, **sharing))
    return Trace({"name": "generated"}, records)


FLAGS = {
    "--policy": st.sampled_from(["paged", "orca-max", "orca-pow2", "orca-oracle", "static"]),
    "--block-size": st.sampled_from(["1", "16", "128", "100000", "0"]),
    "--num-gpu-blocks": st.sampled_from(["0", "1", "30", "300", "-3"]),
    "--max-num-seqs": st.sampled_from(["0", "1", "3", "256"]),
    "--max-num-batched-tokens": st.sampled_from(["64", "2560", "100000"]),
    "--rate": st.sampled_from(["0", "0.01", "2", "1000", "inf", "nan", "-1"]),
    "--burstiness": st.sampled_from(["0.5", "1", "4", "inf"]),
    "--num-requests": st.sampled_from(["1", "3", "12", "0"]),
    "--duration": st.sampled_from(["0.001", "5", "inf"]),
    "--warmup": st.sampled_from(["0", "1", "1000", "nan"]),
    "--preemption": st.sampled_from(["recompute", "swap", "auto"]),
    "--swap-space": st.sampled_from(["0", "4", "-1"]),
    "--n": st.sampled_from(["1", "3", "1000"]),
    "--beam-width": st.sampled_from(["2", "3"]),
    "--tp": st.sampled_from(["1", "2", "3"]),
    "--model": st.sampled_from(["opt-13b", "llama-2-7b", "opt-175b"]),
}
SWITCHES = ["--chunked-prefill", "--prefix-caching"]


@st.composite
def flag_sets(draw) -> list[str]:
    args = []
    for flag in draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=6, unique=True)):
        args += [flag, draw(FLAGS[flag])]
    args += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    return args


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=traces(), flags=flag_sets())
def test_replay_ends_cleanly_with_every_request_accounted_for(trace, flags):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        save_trace(trace, path)
        out = Path(tmp) / "out"
        if "--num-requests" not in flags and "--duration" not in flags:
            flags = flags + ["--num-requests", "8"]  # keep the runs small
        result = CliRunner().invoke(app, ["replay", str(path), *flags, "--beam-ancestry", str(BEAM_ANCESTRY),
                                          "--out", str(out), "--json"])
        assert "Traceback" not in result.output
        assert result.exit_code in (0, 2), result.output
        event(f"exit {result.exit_code}")
        lines = [line for line in result.output.splitlines() if line.startswith(("error:", "warning:"))]
        if result.exit_code == 2:
            errors = [line for line in lines if line.startswith("error:")]
            assert len(errors) == 1 and result.output.strip().endswith(errors[0]), result.output
            assert not out.exists()  # nothing written
            return
        summary = json.loads((out / "summary.json").read_text())
        rows = list(csv.DictReader((out / "requests.csv").open()))
        assert len(rows) == summary["num_requests"] > 0
        if "--duration" not in flags:
            assert summary["num_requests"] == int(flags[flags.index("--num-requests") + 1])
        assert sorted(int(r["request_id"]) for r in rows) == list(range(len(rows)))
        assert {r["status"] for r in rows} <= {"finished", "rejected"}
        rejected = [r for r in rows if r["status"] == "rejected"]
        assert all(r["reject_reason"] for r in rejected)
        assert len(rejected) == summary["num_rejected"] == sum(summary["reject_reasons"].values())
        assert summary["num_finished"] == len(rows) - len(rejected)
        event("all rejected" if len(rejected) == len(rows) else "some rejected" if rejected else "none rejected")

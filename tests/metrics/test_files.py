"""requests.csv, steps.csv and waste.csv as the writers in pagesim.metrics.files write them, against
an independent serialisation: csv.DictWriter over one dict per row, floats as repr() and None as
an empty field, of records built here. Step records come from a slow-path replay (one
schedule/update per step) with each step's fields read off the scheduler as the step ends, so
the step log's packing, the fast path's bulk recording and the writer are all checked at once
against the columns' definitions. Then: readers give the records back, `sampled` picks the first
step of each simulated second, and the CLI's --steps choices."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.metrics import (REQUEST_FIELDS, STEP_FIELDS, WASTE_FIELDS, MetricsRecorder, RequestRecord, StepRecord,
                             read_requests_csv, read_steps_csv)
from pagesim.metrics import files
from pagesim.metrics.files import sampled_steps
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[2]


def _subset(name: str, count: int, max_total: int | None = None) -> Trace:
    trace = load_trace(ROOT / "traces" / name)
    reqs = [r for r in trace.requests if max_total is None or r.prompt_len + r.output_len <= max_total]
    return Trace(dict(trace.metadata), reqs[:count])


SHAREGPT = _subset("sharegpt.json", 300, max_total=1024)
CHAT = _subset("sharegpt_chat.json", 300)
BASE = ReplayConfig(num_requests=80, rate=3.0, seed=5)

# reference replays: every policy, both preemption modes, parallel samples, beams, chunked
# prefill, prefix caching, waste sampling
CASES = {
    "paged-recompute": (dict(preemption="recompute", num_gpu_blocks=120), SHAREGPT),
    "paged-swap": (dict(preemption="swap", num_gpu_blocks=120), SHAREGPT),
    "paged-n3": (dict(n=3, num_gpu_blocks=260, num_requests=40), SHAREGPT),
    "paged-beam4": (dict(beam_width=4, num_gpu_blocks=300, num_requests=30), SHAREGPT),
    "paged-chunked": (dict(chunked_prefill=True, max_num_batched_tokens=256, num_gpu_blocks=160), SHAREGPT),
    "prefix-caching": (dict(prefix_caching=True, num_gpu_blocks=200), CHAT),
    "orca-max": (dict(policy="orca-max", num_requests=40), SHAREGPT),
    "orca-pow2-n2": (dict(policy="orca-pow2", n=2, num_requests=40), SHAREGPT),
    "orca-oracle": (dict(policy="orca-oracle"), SHAREGPT),
    "static": (dict(policy="static", num_requests=40), SHAREGPT),
    "waste-sampling": (dict(waste_interval_s=0.25, num_gpu_blocks=160), SHAREGPT),
}


def _dict_writer_csv(path: Path, columns, rows: list[dict]) -> None:
    """The reference serialisation: one dict per row through csv.DictWriter."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else repr(v) if isinstance(v, float) else v for k, v in row.items()})


def _slow_replay_with_step_records(cfg: ReplayConfig, trace: Trace, monkeypatch) -> tuple[object, list[StepRecord]]:
    """A slow-path replay, each step's StepRecord taken from the scheduler's state as it ends."""
    recorded = []
    real = MetricsRecorder.record_step

    def record_step(self, out, now, duration, scheduler):
        kv = scheduler.kv
        used = kv.num_used_blocks
        recorded.append(StepRecord(
            time=now, duration=duration, num_running_requests=len(scheduler.running), num_scheduled_seqs=len(out.seqs),
            num_prefill_tokens=out.num_prefill_tokens, num_decode_seqs=out.num_decode_seqs,
            num_waiting=len(scheduler.waiting), num_swapped=len(scheduler.swapped), kv_blocks_used=used,
            kv_blocks_logical=kv.num_logical_blocks, kv_utilization=used / self.num_kv_blocks,
            num_preempted=len(out.preempted), blocks_swapped_in=len(out.blocks_to_swap_in),
            blocks_swapped_out=len(out.blocks_to_swap_out), blocks_copied=len(out.blocks_to_copy)))
        real(self, out, now, duration, scheduler)

    monkeypatch.setattr(MetricsRecorder, "record_step", record_step)
    result = Replay(cfg, trace, fast_forward=False).run()
    monkeypatch.setattr(MetricsRecorder, "record_step", real)
    return result, recorded


@pytest.mark.parametrize("name", list(CASES))
def test_written_files_equal_a_dict_writer_over_the_records(name, tmp_path, monkeypatch):
    changes, trace = CASES[name]
    cfg = dataclasses.replace(BASE, **changes)
    slow, step_records = _slow_replay_with_step_records(cfg, trace, monkeypatch)
    fast = Replay(cfg, trace).run()  # the fast path records its runs of decode steps in bulk
    fast.metrics.write(tmp_path / "written", fast.summary)

    ref = tmp_path / "reference"
    ref.mkdir()
    _dict_writer_csv(ref / "steps.csv", STEP_FIELDS, [dataclasses.asdict(s) for s in step_records])
    _dict_writer_csv(ref / "requests.csv", REQUEST_FIELDS,
                     [{k: getattr(r, k) for k in REQUEST_FIELDS} for r in slow.metrics.requests])
    (ref / "summary.json").write_text(json.dumps(slow.summary, indent=2, sort_keys=True) + "\n")
    if slow.metrics.waste:
        _dict_writer_csv(ref / "waste.csv", WASTE_FIELDS, [dict(zip(WASTE_FIELDS, w)) for w in slow.metrics.waste])

    names = sorted(p.name for p in ref.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "written").iterdir())
    for f in names:
        assert (tmp_path / "written" / f).read_bytes() == (ref / f).read_bytes(), f
    assert len(step_records) == fast.summary["num_steps"] > 0


@pytest.mark.parametrize("name", ["paged-swap", "prefix-caching", "paged-n3"])
def test_readers_give_the_records_back(name, tmp_path):
    changes, trace = CASES[name]
    result = Replay(dataclasses.replace(BASE, **changes), trace).run()
    result.metrics.write(tmp_path, result.summary)
    assert read_steps_csv(tmp_path / "steps.csv") == result.metrics.steps
    back = read_requests_csv(tmp_path / "requests.csv")
    assert len(back) == len(result.metrics.requests)
    for read, kept in zip(back, result.metrics.requests):
        assert [getattr(read, k) for k in REQUEST_FIELDS] == [getattr(kept, k) for k in REQUEST_FIELDS]
    assert any(r.status == "finished" for r in back) and any(r.tpot is not None for r in back)


def test_a_reader_names_the_file_the_row_and_the_field(tmp_path):
    result = Replay(dataclasses.replace(BASE, num_requests=5), SHAREGPT).run()
    result.metrics.write(tmp_path, result.summary)
    path = tmp_path / "steps.csv"
    lines = path.read_text().splitlines()
    lines[3] = "x" + lines[3]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"steps\.csv: row 2: field time: 'x"):
        read_steps_csv(path)
    (tmp_path / "requests.csv").write_text("request_id,status\n0,finished\n")
    with pytest.raises(ValueError, match="requests.csv: columns"):
        read_requests_csv(tmp_path / "requests.csv")


def _hand_records(session_id: str | None, reject_reason: str) -> list[RequestRecord]:
    finished = RequestRecord(request_id=7, status="finished", reject_reason="", arrival_time=0.1,
                             first_scheduled_time=0.30000000000000004, first_token_time=1 / 3, finish_time=2.5,
                             prompt_len=12, output_len=5, num_seqs=2, num_preemptions=1, num_swaps=0,
                             cached_prompt_tokens=16, total_output_len=9, session_id=session_id, turn=0)
    one_token = dataclasses.replace(finished, request_id=8, output_len=1, total_output_len=1, session_id=None,
                                    turn=None)
    rejected = RequestRecord(request_id=9, status="rejected", reject_reason=reject_reason, arrival_time=-0.0,
                             first_scheduled_time=None, first_token_time=None, finish_time=None, prompt_len=4000,
                             output_len=0, num_seqs=1, num_preemptions=0, num_swaps=0, cached_prompt_tokens=0)
    return [finished, one_token, rejected]


@pytest.mark.parametrize("session_id, reject_reason", [
    ("chat-3", "prompt too long"),  # plain texts: joined, None's text taken out
    ("None", "prompt too long"),  # the text None is not a None: csv.writer writes it
    ("a,b", "prompt too long (4000 > 2048)"),  # texts that need quotes
    ('say "hi"', "line\nbreak"),
    ("Nonesuch", "cut\r\n"),
])
def test_requests_csv_equals_a_dict_writer_for_any_texts(session_id, reject_reason, tmp_path, monkeypatch):
    """requests.csv from hand-built records (None fields, a one-token output's None tpot, -0.0)
    against csv.DictWriter, whether the writer joins rows itself or leaves them to csv.writer,
    in stretches of one row and of many."""
    records = _hand_records(session_id, reject_reason)
    _dict_writer_csv(tmp_path / "reference.csv", REQUEST_FIELDS,
                     [{k: getattr(r, k) for k in REQUEST_FIELDS} for r in records])
    for chunk in (1, 2, 1 << 14):
        monkeypatch.setattr(files, "CHUNK_STEPS", chunk)
        files.write_requests_csv(tmp_path / "requests.csv", records)
        assert (tmp_path / "requests.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()
    with open(tmp_path / "requests.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 4 and rows[2][0] == "8" and rows[2][15] == "" and rows[1][18] == session_id
    assert rows[3][:7] == ["9", "rejected", reject_reason, "-0.0", "", "", ""]
    files.write_requests_csv(tmp_path / "empty.csv", [])
    assert (tmp_path / "empty.csv").read_text() == ",".join(REQUEST_FIELDS) + "\n"


def test_sampled_steps_are_the_first_to_end_in_each_second(tmp_path):
    changes, trace = CASES["paged-chunked"]
    result = Replay(dataclasses.replace(BASE, **changes), trace).run()
    result.metrics.write(tmp_path / "all", result.summary)
    result.metrics.write(tmp_path / "sampled", result.summary, steps="sampled")
    every = (tmp_path / "all" / "steps.csv").read_text().splitlines()
    sampled = (tmp_path / "sampled" / "steps.csv").read_text().splitlines()
    # brute force: walk the rows, keep each one whose whole second differs from the last kept's
    expected, last_second = [every[0]], None
    for line in every[1:]:
        second = math.floor(float(line.split(",")[0]))
        if second != last_second:
            expected.append(line)
            last_second = second
    assert sampled == expected
    assert 10 < len(sampled) < len(every) / 5
    assert sampled_steps([]) == [] and sampled_steps([0.5, 0.7, 3.2, 3.9, 4.0]) == [0, 2, 4]


def test_writing_no_steps_and_bad_choices(tmp_path):
    result = Replay(dataclasses.replace(BASE, num_requests=5), SHAREGPT).run()
    result.metrics.write(tmp_path, result.summary, steps="none")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.csv", "summary.json"]
    with pytest.raises(ValueError, match="steps: one of all, sampled, none"):
        result.metrics.write(tmp_path, result.summary, steps="some")


@pytest.mark.parametrize("steps, expect_steps_csv", [("all", True), ("sampled", True), ("none", False)])
def test_cli_steps_choice(tmp_path, steps, expect_steps_csv):
    from pagesim.cli import app

    out = tmp_path / steps
    args = ["replay", str(ROOT / "traces" / "alpaca.json"), "--num-requests", "60", "--rate", "8", "--out", str(out)]
    result = CliRunner().invoke(app, args + ["--steps", steps, "--json"])
    assert result.exit_code == 0, result.output
    assert (out / "steps.csv").exists() == expect_steps_csv
    default = tmp_path / "default"
    assert CliRunner().invoke(app, args[:-1] + [str(default), "--json"]).exit_code == 0
    # the summary does not depend on what was written (but for the line that names the folder and
    # --steps: "reproduce"); "all" is the default, byte for byte
    def without_reproduce(folder):
        return re.sub(rb'\n  "reproduce": "[^"]*",', b"", (folder / "summary.json").read_bytes())

    assert without_reproduce(out) == without_reproduce(default) != (default / "summary.json").read_bytes()
    assert (out / "requests.csv").read_bytes() == (default / "requests.csv").read_bytes()
    if steps == "all":
        assert (out / "steps.csv").read_bytes() == (default / "steps.csv").read_bytes()
    if steps == "sampled":
        rows = (out / "steps.csv").read_text().splitlines()
        assert rows[0] == (default / "steps.csv").read_text().splitlines()[0]
        assert set(rows) < set((default / "steps.csv").read_text().splitlines())


def test_cli_steps_without_out_warns(tmp_path):
    from pagesim.cli import app

    result = CliRunner().invoke(app, ["replay", str(ROOT / "traces" / "alpaca.json"), "--num-requests", "5",
                                      "--steps", "sampled", "--json"])
    assert result.exit_code == 0
    assert "warning: --steps sampled chooses the steps.csv rows --out writes" in result.output

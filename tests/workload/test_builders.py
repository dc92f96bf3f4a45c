"""The committed traces: reproducible from the public data, and what they claim to be."""

import csv
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.builders import default_data_dir, read_json_array_prefix, repo_root, seeded_order
from pagesim.workload.trace import load_trace

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"
DATA = default_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "sharegpt_opt_lengths.csv").exists(), reason=f"public data not at {DATA}")


def build_in(tmp_path, monkeypatch, kind, name):
    """Run the CLI from an empty folder, with the same relative --out as the committed file."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["trace", "build", kind, "--out", f"traces/{name}"])
    assert result.exit_code == 0, result.output
    return (tmp_path / "traces" / name).read_bytes()


@needs_data
def test_sharegpt_rebuild_is_byte_identical(tmp_path, monkeypatch):
    assert build_in(tmp_path, monkeypatch, "sharegpt", "sharegpt.json") == (TRACES / "sharegpt.json").read_bytes()


@needs_data
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("PAGESIM_SLOW_TESTS"), reason="reads Alpaca and tokenizes (about 4 s); set PAGESIM_SLOW_TESTS=1")
def test_alpaca_rebuild_is_byte_identical(tmp_path, monkeypatch):
    assert build_in(tmp_path, monkeypatch, "alpaca", "alpaca.json") == (TRACES / "alpaca.json").read_bytes()


@needs_data
def test_sharegpt_means_match_the_paper():
    # Independent of the builder: plain csv arithmetic over the source file.
    total_in = total_out = kept = 0
    with (DATA / "sharegpt_opt_lengths.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            i, o = int(row["input_len"]), int(row["output_len"])
            if i + o <= 2048:
                total_in, total_out, kept = total_in + i, total_out + o, kept + 1
    assert kept == 79_731
    assert (round(total_in / kept, 2), round(total_out / kept, 2)) == (161.31, 337.99)

    trace = load_trace(TRACES / "sharegpt.json")
    pool = trace.metadata["pool"]
    assert pool["prompt_len"]["count"] == kept
    assert round(pool["prompt_len"]["mean"], 2) == 161.31 and round(pool["output_len"]["mean"], 2) == 337.99
    assert len(trace) == trace.metadata["count"] == 10_000
    assert all(r.prompt_len + r.output_len <= 2048 for r in trace.requests)
    # The sample's own means, as recorded, are those of its requests.
    stats = trace.metadata["stats"]
    assert stats["prompt_len"]["mean"] == round(sum(trace.prompt_lens) / len(trace), 4)
    assert stats["output_len"]["mean"] == round(sum(trace.output_lens) / len(trace), 4)
    assert trace.metadata["command"] == "pagesim trace build sharegpt --num 10000 --seed 0 --out traces/sharegpt.json"


def test_alpaca_metadata_accounts_for_every_record():
    trace = load_trace(TRACES / "alpaca.json")
    meta = trace.metadata
    dropped = sum(f["dropped"] for f in meta["filters"])
    assert meta["source"]["rows"] == len(trace) + dropped == 5000
    empty = next(f for f in meta["filters"] if f["rule"] == "output_len > 0")
    assert empty["dropped"] == len(empty["dropped_source_indices"]) == 2
    assert round(meta["stats"]["prompt_len"]["mean"], 2) == 17.96
    assert meta["paper"]["mean"] == {"prompt_len": 19.31, "output_len": 58.45}
    assert "BOS" in meta["tokenizer"]["special_tokens"] and "instruction" in meta["prompt_template"]


def test_chat_trace_structure():
    trace = load_trace(TRACES / "sharegpt_chat.json")  # the loader checks ids length == prompt_len
    meta = trace.metadata
    src = meta["source"]
    assert src["conversations_recovered"] == 17_671 and src["truncated_file"]
    assert 0 < src["read_stopped_at_byte"] < src["file_bytes"]
    assert 2000 <= len(trace) <= 5000 and (TRACES / "sharegpt_chat.json").stat().st_size < 20e6

    groups: dict = {}
    order = []
    for r in trace.requests:
        assert r.prompt_token_ids is not None and len(r.prompt_token_ids) == r.prompt_len <= 1024
        assert 1 <= r.output_len <= 1024
        if r.prefix_group not in groups:
            order.append(r.prefix_group)
        groups.setdefault(r.prefix_group, []).append(r)
    assert len(groups) == meta["conversations"]
    # Turns of one conversation are contiguous in the file.
    assert [r.prefix_group for r in trace.requests] == [g for g in order for _ in groups[g]]

    shared_pairs = 0
    for turns in groups.values():
        assert turns[0].shared_prefix_len == 0
        for prev, cur in zip(turns, turns[1:]):
            common = 0
            while common < min(prev.prompt_len, cur.prompt_len) and prev.prompt_token_ids[common] == cur.prompt_token_ids[common]:
                common += 1
            assert cur.shared_prefix_len == common
            if cur.prompt_len < 1024:
                # No truncation yet: the next prompt extends the previous one entirely.
                assert common == prev.prompt_len
                shared_pairs += 1
    assert shared_pairs > 500


def test_read_json_array_prefix_reports_the_cut():
    raw = '[{"a": 1}, {"b": "é"}, {"c": "cut here'.encode()
    got = read_json_array_prefix(raw)
    assert got.records == [{"a": 1}, {"b": "é"}] and not got.complete
    # Reading stops at the first byte of the element that could not be decoded.
    assert got.stopped_at_byte == len('[{"a": 1}, {"b": "é"}, '.encode())
    assert "element 2 is incomplete" in got.stop_reason
    # A cut inside a multi-byte character is not a decoding error.
    half = '[{"x": 1}, {"y": "é'.encode()[:-1]
    assert read_json_array_prefix(half).records == [{"x": 1}]
    whole = read_json_array_prefix(b'[ {"a": 1} , [2] ]')
    assert whole.complete and whole.records == [{"a": 1}, [2]] and whole.stopped_at_byte == whole.total_bytes


def test_seeded_order_is_a_fixed_permutation():
    order = seeded_order(1000, 0)
    assert sorted(order) == list(range(1000)) and order != list(range(1000))
    assert order[:5] == seeded_order(1000, 0)[:5] and order != seeded_order(1000, 1)


def test_data_dir_resolution(monkeypatch):
    monkeypatch.delenv("PAGESIM_DATA_DIR", raising=False)
    assert default_data_dir() == (repo_root() / ".." / "shared" / "data").resolve()
    assert repo_root() == REPO
    monkeypatch.setenv("PAGESIM_DATA_DIR", "/somewhere/else")
    assert default_data_dir() == Path("/somewhere/else")


def test_missing_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["trace", "build", "sharegpt", "--data-dir", str(tmp_path), "--out", "x.json"])
    assert result.exit_code == 2 and "not found" in result.output and not (tmp_path / "x.json").exists()

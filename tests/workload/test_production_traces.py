"""The Azure and Mooncake trace builders on small files written here, with every expected value
worked out by hand from those files; malformed records rejected with the file, line and field;
the committed traces rebuilt byte for byte from the public data when it is present."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.workload.builders import BUILDERS, Shaping, SourceError, build_azure, build_mooncake, default_data_dir
from pagesim.workload.requests import build_requests
from pagesim.workload.trace import Trace, TraceError, TraceRequest, dumps_trace, load_trace, parse_trace

REPO = Path(__file__).resolve().parents[2]
AZURE = "traces_public/azure-llm-2023/AzureLLMInferenceTrace_code.csv"
MOONCAKE = "traces_public/mooncake-fast25/conversation_trace.jsonl"

AZURE_ROWS = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "2023-11-16 18:00:00.0000000,100,10",
    "2023-11-16 18:00:00.5000001,200,0",  # no output token: dropped
    "2023-11-16 18:00:02.0000000,300,30",
    "2023-11-16 18:00:10.0000000,5000,40",
]
MOONCAKE_ROWS = [
    {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]},
    {"timestamp": 4000, "input_length": 512, "output_length": 3, "hash_ids": [3]},
]


def write_data(root: Path, azure: list[str] = AZURE_ROWS, mooncake: list = MOONCAKE_ROWS) -> Path:
    (root / AZURE).parent.mkdir(parents=True, exist_ok=True)
    (root / AZURE).write_text("\n".join(azure) + "\n")
    (root / MOONCAKE).parent.mkdir(parents=True, exist_ok=True)
    (root / MOONCAKE).write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in mooncake))
    return root


@pytest.fixture
def data(tmp_path) -> Path:
    return write_data(tmp_path / "data")


def lengths(trace: Trace) -> list[tuple]:
    return [(r.prompt_len, r.output_len, r.arrival_time) for r in trace.requests]


def test_azure_arrivals_lengths_and_filters(data):
    trace = build_azure("azure-code", data, command="c")
    assert lengths(trace) == [(100, 10, 0.0), (300, 30, 2.0), (5000, 40, 10.0)]
    meta = trace.metadata
    assert meta["source"]["file"] == AZURE and meta["source"]["records"] == 4
    assert meta["source"]["file_sha256"] == hashlib.sha256((data / AZURE).read_bytes()).hexdigest()
    assert [(f["kept"], f["dropped"]) for f in meta["filters"]] == [(3, 1)]
    assert meta["count"] == 3 and "context_cap" not in meta
    # gaps 2 and 8 s: mean 5, sample standard deviation sqrt(18) = 4.2426
    assert meta["stats"]["arrivals"] == {"span_s": 10.0, "mean_rate_per_s": 0.2, "gap_cv": 0.8485, "zero_gaps": 0}
    assert parse_trace(dumps_trace(trace)) == trace  # a valid trace, and the same one after a round trip


def test_azure_reads_the_100ns_digits_exactly(tmp_path):
    rows = [AZURE_ROWS[0], "2023-11-16 18:00:00.0000000,1,1", "2023-11-16 18:00:00.0000003,1,1",
            "2023-11-16 19:00:01.9999999,1,1"]
    trace = build_azure("azure-code", write_data(tmp_path, azure=rows))
    assert [r.arrival_time for r in trace.requests] == [0.0, 3e-7, 3601.9999999]


def test_shaping_window_scale_duration_in_that_order(data):
    def times(**kw):
        return [r.arrival_time for r in build_azure("azure-code", data, Shaping(**kw)).requests]

    assert times(window=(1, 11)) == [1.0, 9.0]  # 2 s and 10 s, re-based to the window's start
    assert times(window=(1, 11), time_scale=2) == [0.5, 4.5]  # gaps divided by 2
    assert times(window=(1, 11), time_scale=2, duration=1) == [0.5]  # duration in scaled seconds
    assert times(num=2) == [0.0, 2.0]
    trace = build_azure("azure-code", data, Shaping(window=(1, 11), time_scale=2, duration=1))
    assert [(f["kept"], f["dropped"]) for f in trace.metadata["filters"]] == [(3, 1), (2, 1), (1, 1)]
    assert trace.metadata["shaping"]["time_scale"] == 2


def test_context_cap_truncates_prompts_and_drops_what_cannot_fit(data):
    trace = build_azure("azure-code", data, Shaping(max_context=35))
    # (100, 10) -> prompt 25; (300, 30) -> prompt 5; (5000, 40): output alone over 35, dropped
    assert [(r.prompt_len, r.output_len) for r in trace.requests] == [(25, 10), (5, 30)]
    cap = trace.metadata["context_cap"]
    assert (cap["truncated"], cap["dropped"]) == (2, 1) and "2 prompts truncated" in cap["note"]
    _, notes = build_requests(trace, rate=None)
    assert any("context cap" in n and "1 requests dropped" in n for n in notes)  # the replay summary says it too


def test_mooncake_hash_ids_reuse_and_cap(data):
    trace = build_mooncake("mooncake-conversation", data)
    assert lengths(trace) == [(600, 5, 0.0), (1100, 7, 1.5), (512, 3, 4.0)]
    assert [r.hash_ids for r in trace.requests] == [[0, 1], [0, 1, 2], [3]]
    meta = trace.metadata
    assert meta["hash_block_tokens"] == 512
    # request 2 reuses blocks 0 and 1 (1024 of its 1100 tokens); nothing else is seen twice
    assert meta["prefix_block_reuse"] == {"blocks": 6, "reused": 2, "ratio": round(2 / 6, 6), "prompt_tokens": 2212,
                                          "prompt_tokens_reused": 1024, "token_ratio": round(1024 / 2212, 6)}
    capped = build_mooncake("mooncake-conversation", data, Shaping(max_context=700))
    # 1100 + 7 > 700: the prompt keeps its first 693 tokens, whose 512-token blocks are 0 and 1
    assert (capped.requests[1].prompt_len, capped.requests[1].hash_ids) == (693, [0, 1])
    assert parse_trace(dumps_trace(capped)) == capped
    requests, _ = build_requests(trace, rate=None)
    assert requests[1].hashed_prompt.hash_ids == (0, 1, 2) and requests[1].prompt_token_ids is None


GOOD0, GOOD1 = MOONCAKE_ROWS[0], MOONCAKE_ROWS[1]
MOONCAKE_BAD = [  # (the file's records, the bad line, its field, words of the message)
    ([GOOD0, {"timestamp": 0, "input_length": 600, "hash_ids": [0, 1]}], 2, "output_length", "missing"),
    ([GOOD0, {"timestamp": 0, "input_length": -5, "output_length": 5, "hash_ids": []}], 2, "input_length", ">= 0"),
    ([GOOD0, GOOD1, {"timestamp": 1000, "input_length": 10, "output_length": 5, "hash_ids": [7]}], 3, "timestamp",
     "earlier than line 2's"),
    ([GOOD0, {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1]}], 2, "hash_ids",
     "spans 3 blocks"),
    ([GOOD0, {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [-1]}], 2, "hash_ids", "integers >= 0"),
    ([GOOD0, {"timestamp": "soon", "input_length": 10, "output_length": 5, "hash_ids": [1]}], 2, "timestamp",
     "milliseconds"),
    ([GOOD0, "{not json"], 2, None, "invalid JSON"),
    # (json's ValueError for an integer past Python's 4,300 digits escaped as an internal error)
    ([GOOD0, '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [%s]}' % ("8" * 4301)], 2,
     "hash_ids[0]", "an integer of 4,301 digits, more than the 4,300 Python reads as a number"),
]


@pytest.mark.parametrize("rows,line,field,problem", MOONCAKE_BAD)
def test_malformed_mooncake_records_name_file_line_field(tmp_path, rows, line, field, problem):
    data = write_data(tmp_path, mooncake=rows)
    with pytest.raises(SourceError) as err:
        build_mooncake("mooncake-conversation", data)
    text = str(err.value)
    assert text.startswith(f"{data / MOONCAKE}: line {line}")
    assert (f"field '{field}'" in text) if field else "field" not in text
    assert problem in text


AZURE_BAD = [
    ("2023-11-16 18:00:03.0000000,-4,10", "ContextTokens", ">= 0"),
    ("2023-11-16 18:00:03.0000000,4,ten", "GeneratedTokens", "integer"),
    ("yesterday,4,10", "TIMESTAMP", "not a"),
    ("2023-11-16 17:59:59.0000000,4,10", "TIMESTAMP", "arrival order"),
    ("2023-11-16 18:00:03.0000000,4", "GeneratedTokens", "3 columns"),
]


@pytest.mark.parametrize("bad,field,problem", AZURE_BAD)
def test_malformed_azure_rows_name_file_line_field(tmp_path, bad, field, problem):
    data = write_data(tmp_path, azure=AZURE_ROWS[:2] + [bad])
    with pytest.raises(SourceError, match=problem) as err:
        build_azure("azure-code", data)
    assert str(err.value).startswith(f"{data / AZURE}: line 3: field '{field}'")


def test_cli_builds_the_same_bytes_and_exits_2_on_bad_input(tmp_path, data):
    out = tmp_path / "a.json"
    args = ["trace", "build", "mooncake-conversation", "--data-dir", str(data), "--window", "1:5", "--time-scale", "0.5",
            "--max-context", "1000", "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    first = out.read_bytes()
    assert CliRunner().invoke(app, args).exit_code == 0 and out.read_bytes() == first
    trace = load_trace(out)
    # window [1, 5) keeps 1.5 s and 4 s, re-based to 0.5 and 3, then gaps doubled (scale 0.5)
    assert [r.arrival_time for r in trace.requests] == [1.0, 6.0]
    assert trace.metadata["command"].endswith("--window 1:5 --time-scale 0.5 --max-context 1000 --out " + str(out))
    assert "context cap" in result.output

    write_data(data, mooncake=[MOONCAKE_ROWS[0], {"timestamp": 1, "input_length": 3, "output_length": 1}])
    bad = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert bad.exit_code == 2 and "line 2: field 'hash_ids': missing" in bad.output
    for flag, value in (("--window", "5:1"), ("--time-scale", "0")):
        assert CliRunner().invoke(app, [*args, flag, value]).exit_code == 2
    shaped_paper = CliRunner().invoke(app, ["trace", "build", "alpaca", "--window", "0:9", "--out", str(out)])
    assert shaped_paper.exit_code == 2 and "no recorded arrivals" in shaped_paper.output


HASH_META = '"metadata": {"hash_block_tokens": 4}'


@pytest.mark.parametrize("record,meta,field,problem", [
    ('{"prompt_len": 9, "output_len": 1, "hash_ids": [1, 2]}', HASH_META, "hash_ids", "spans 3 blocks"),
    ('{"prompt_len": 3, "output_len": 1, "hash_ids": [-2]}', HASH_META, "hash_ids", "element 0"),
    ('{"prompt_len": 3, "output_len": 1, "hash_ids": [true]}', HASH_META, "hash_ids", "element 0"),
    ('{"prompt_len": 3, "output_len": 1, "hash_ids": [1]}', '"metadata": {}', "hash_ids", "no hash_block_tokens"),
    ('{"prompt_len": 3, "output_len": 1, "hash_ids": [1], "prompt_token_ids": [1, 2, 3]}', HASH_META, "hash_ids",
     "one or the other"),
    ('{"prompt_len": 3, "output_len": 1}', '"metadata": {"hash_block_tokens": 0}', "metadata.hash_block_tokens", "> 0"),
])
def test_trace_loader_checks_hash_ids(tmp_path, record, meta, field, problem):
    path = tmp_path / "t.json"
    path.write_text('{"format": "pagesim-trace/1", ' + meta + ', "requests": [{"prompt_len": 2, "output_len": 1}, '
                    + record + ']}')
    with pytest.raises(TraceError, match=problem) as err:
        load_trace(path)
    assert err.value.field == field and str(path) in str(err.value)
    if not field.startswith("metadata"):
        assert err.value.index == 1


def test_trace_field_order_puts_hash_ids_before_token_ids():
    trace = Trace({"hash_block_tokens": 4}, [TraceRequest(5, 1, arrival_time=0.0, hash_ids=[3, 4])])
    assert dumps_trace(trace).splitlines()[-2] == '{"prompt_len":5,"output_len":1,"arrival_time":0.0,"hash_ids":[3,4]}'


@pytest.mark.parametrize("kind,file", [("azure-code", "azure_code.json"), ("azure-conv", "azure_conv.json"),
                                       ("mooncake-conversation", "mooncake_conversation.json"),
                                       ("mooncake-synthetic", "mooncake_synthetic.json")])
def test_committed_traces_rebuild_byte_for_byte(kind, file):
    data = default_data_dir()
    if not (data / "traces_public").is_dir():
        pytest.skip(f"public traces not found under {data} (set PAGESIM_DATA_DIR)")
    committed = REPO / "traces" / file
    trace = BUILDERS[kind](data, command=f"pagesim trace build {kind} --out traces/{file}")
    assert dumps_trace(trace) == committed.read_text()

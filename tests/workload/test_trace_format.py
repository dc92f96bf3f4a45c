"""The trace file format: exact error messages for malformed files, and exact round trips."""

import json
import os
from pathlib import Path

import pytest

from pagesim.workload.trace import (FORMAT, Trace, TraceError, TraceRequest, dumps_trace, load_trace, parse_trace,
                                    save_trace)

REPO = Path(__file__).resolve().parents[2]


def write_doc(tmp_path: Path, requests, metadata=None, name="bad.json", extra=None) -> Path:
    doc = {"format": FORMAT, "metadata": {} if metadata is None else metadata, "requests": requests}
    doc.update(extra or {})
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def expect_error(path: Path, index, field, *fragments) -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    msg = str(err)
    assert path.name in msg
    if index is not None:
        assert f"request {index}" in msg and err.index == index
    if field is not None:
        assert f"field '{field}'" in msg and err.field == field
    for frag in fragments:
        assert frag in msg, msg
    return err


GOOD = {"prompt_len": 10, "output_len": 5}


def test_bad_json_names_line_and_column(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "pagesim-trace/1",\n"metadata": {},\n"requests": [\n{"prompt_len":3,"output_len":4},\n{"prompt_len":3 "output_len":4}\n]}\n')
    err = expect_error(path, None, None, "invalid JSON", "line 5, column 17")
    assert (err.line, err.column) == (5, 17)


@pytest.mark.parametrize("metadata, record, index, field, message", [
    ("{}", '{"prompt_len":3,"output_len":4,"arrival_time":NaN}', 1, "arrival_time", "NaN is not a JSON number"),
    ("{}", '{"prompt_len":Infinity,"output_len":4}', 1, "prompt_len", "Infinity is not a JSON number"),
    ("{}", '{"prompt_len":2,"output_len":4,"prompt_token_ids":[5,-Infinity]}', 1, "prompt_token_ids[1]",
     "-Infinity is not a JSON number"),
    ("{}", "NaN", 1, None, "NaN is not a JSON number"),
    ('{"filters": {"max_len": [2048, NaN]}}', '{"prompt_len":3,"output_len":4}', None, "metadata.filters.max_len[1]",
     "NaN is not a JSON number"),
])
def test_nan_and_infinity_name_the_request_and_the_field(tmp_path, metadata, record, index, field, message):
    """json reads NaN and Infinity (not JSON); the message named the file only."""
    path = tmp_path / "nan.json"
    path.write_text('{"format": "pagesim-trace/1", "metadata": %s, "requests": [\n'
                    '{"prompt_len":3,"output_len":4,"arrival_time":1},\n%s]}' % (metadata, record))
    prefix = f"{path}: " + (f"request {index}: " if index is not None else "") + (f"field '{field}': " if field else "")
    err = expect_error(path, index, field, message)
    assert str(err) == prefix + message and (err.index, err.field) == (index, field)


LONG = "9" * 4301  # one digit more than Python's int() reads from text (sys.get_int_max_str_digits(): 4300)


@pytest.mark.parametrize("metadata, record, index, field, message", [
    ("{}", '{"prompt_len":%s,"output_len":4}' % LONG, 1, "prompt_len",
     "an integer of 4,301 digits, more than the 4,300 Python reads as a number"),
    ("{}", '{"prompt_len":2,"output_len":4,"prompt_token_ids":[5,-%s]}' % ("1" * 5000), 1, "prompt_token_ids[1]",
     "an integer of 5,000 digits, more than the 4,300 Python reads as a number"),
    ('{"seed": %s}' % LONG, '{"prompt_len":3,"output_len":4}', None, "metadata.seed",
     "an integer of 4,301 digits, more than the 4,300 Python reads as a number"),
])
def test_an_integer_too_long_for_python_names_the_request_and_the_field(tmp_path, metadata, record, index, field,
                                                                        message):
    """json.loads refuses an integer of more than 4,300 digits with a ValueError that names no
    place; the message named the file only ("invalid JSON: Exceeds the limit ...")."""
    path = tmp_path / "long.json"
    path.write_text('{"format": "pagesim-trace/1", "metadata": %s, "requests": [\n'
                    '{"prompt_len":3,"output_len":4,"arrival_time":1},\n%s]}' % (metadata, record))
    prefix = f"{path}: " + (f"request {index}: " if index is not None else "") + f"field '{field}': "
    err = expect_error(path, index, field, message)
    assert str(err) == prefix + message


def test_an_integer_of_4300_digits_is_still_read():
    """(the limit itself is read as a number, as json reads it)"""
    text = ('{"format": "pagesim-trace/1", "metadata": {"seed": %s}, "requests": [{"prompt_len":3,"output_len":4}]}'
            % ("9" * 4300))
    assert parse_trace(text).metadata["seed"] == 10**4300 - 1
    # (as a request's length it is read, then refused by the 4-byte bound)
    with pytest.raises(TraceError, match="prompt_len.*must be at most 2,147,483,647, got an integer of 4,300 digits"):
        parse_trace(text.replace('"prompt_len":3', '"prompt_len":' + "9" * 4300))


@pytest.mark.parametrize("field", ["prompt_len", "output_len"])
def test_missing_length(tmp_path, field):
    rec = dict(GOOD)
    del rec[field]
    path = write_doc(tmp_path, [GOOD, GOOD, rec])
    expect_error(path, 2, field, "missing")


@pytest.mark.parametrize("value", ["12", 12.0, 12.5, True, None, [12]])
def test_non_integer_length(tmp_path, value):
    path = write_doc(tmp_path, [GOOD, {"prompt_len": 7, "output_len": value}])
    expect_error(path, 1, "output_len", "must be an integer")


@pytest.mark.parametrize("value", [0, -3])
def test_length_not_positive(tmp_path, value):
    path = write_doc(tmp_path, [{"prompt_len": value, "output_len": 4}, GOOD])
    expect_error(path, 0, "prompt_len", "must be > 0", str(value))


@pytest.mark.parametrize("field, value", [("prompt_len", 2**31), ("output_len", 10**22), ("n", 3_000_000_000),
                                          ("beam_width", 2**31)])
def test_counts_past_four_bytes_name_the_field(tmp_path, field, value):
    """A summary keeps counts as 4-byte integers: 2**31 - 1 is the most a record may hold (a
    larger one was an internal error at the summary, after the whole replay)."""
    path = write_doc(tmp_path, [GOOD, {**GOOD, field: value}])
    expect_error(path, 1, field, "must be at most 2,147,483,647",
                 f"{value:,}" if value < 10**30 else f"an integer of {len(str(value))} digits")
    write_doc(tmp_path, [{**GOOD, field: 2**31 - 1}], name="edge.json")  # (the largest is read)
    assert getattr(load_trace(tmp_path / "edge.json").requests[0], field) == 2**31 - 1


@pytest.mark.parametrize(
    "extra, field, fragment",
    [
        ({"n": 0}, "n", "must be >= 1"),
        ({"n": -2}, "n", "must be >= 1"),
        ({"beam_width": 0}, "beam_width", "must be >= 1"),
        ({"n": 2.0}, "n", "must be an integer"),
        ({"beam_width": "4"}, "beam_width", "must be an integer"),
        ({"n": 6, "beam_width": 4}, "n", "must be <= beam_width"),
    ],
)
def test_bad_sampling_values(tmp_path, extra, field, fragment):
    path = write_doc(tmp_path, [GOOD, GOOD, GOOD, {**GOOD, **extra}])
    expect_error(path, 3, field, fragment)


def test_token_ids_length_mismatch(tmp_path):
    path = write_doc(tmp_path, [GOOD, {"prompt_len": 3, "output_len": 1, "prompt_token_ids": [5, 6]}])
    expect_error(path, 1, "prompt_token_ids", "has 2 ids but prompt_len is 3")


@pytest.mark.parametrize("bad", [-1, 2.5, "7", None, True, [3]])
def test_token_ids_bad_element(tmp_path, bad):
    path = write_doc(tmp_path, [{"prompt_len": 3, "output_len": 1, "prompt_token_ids": [5, bad, 6]}])
    expect_error(path, 0, "prompt_token_ids", "element 1")


def test_unknown_field_name(tmp_path):
    path = write_doc(tmp_path, [GOOD, {"prompt_len": 3, "output_len": 1, "promt_len": 3}])
    expect_error(path, 1, "promt_len", "unknown field name")


def test_duplicate_field_is_not_silently_overwritten(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"format": "pagesim-trace/1", "metadata": {}, "requests": [{"prompt_len":3,"output_len":4,"prompt_len":5}]}')
    expect_error(path, 0, "prompt_len", "more than once")


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({**GOOD, "shared_prefix_len": 4}, "without a prefix_group"),
        ({**GOOD, "prefix_group": 1, "shared_prefix_len": 11}, "must be in [0, prompt_len=10]"),
        ({**GOOD, "prefix_group": 1, "shared_prefix_len": -1}, "must be in [0, prompt_len=10]"),
    ],
)
def test_bad_shared_prefix(tmp_path, record, fragment):
    path = write_doc(tmp_path, [GOOD, record])
    expect_error(path, 1, "shared_prefix_len", fragment)


@pytest.mark.parametrize("group, fragment", [(-1, "must be >= 0"), (1.5, "integer or a string"), ("", "non-empty")])
def test_bad_prefix_group(tmp_path, group, fragment):
    path = write_doc(tmp_path, [{**GOOD, "prefix_group": group}])
    expect_error(path, 0, "prefix_group", fragment)


def test_arrival_times(tmp_path):
    expect_error(write_doc(tmp_path, [{**GOOD, "arrival_time": -1.0}]), 0, "arrival_time", "in [0, 1e+11]")
    # an integer past any float (issue 26: an internal error) and a time past the clock's reach
    expect_error(write_doc(tmp_path, [{**GOOD, "arrival_time": 10**309}]), 0, "arrival_time", "integer of 310 digits")
    expect_error(write_doc(tmp_path, [{**GOOD, "arrival_time": 1e12}]), 0, "arrival_time", "in [0, 1e+11]")
    expect_error(write_doc(tmp_path, [{**GOOD, "arrival_time": "soon"}]), 0, "arrival_time", "number of seconds")
    expect_error(
        write_doc(tmp_path, [{**GOOD, "arrival_time": 1.0}, GOOD, {**GOOD, "arrival_time": 2.0}]), 1, "arrival_time", "give all or none"
    )
    expect_error(
        write_doc(tmp_path, [{**GOOD, "arrival_time": 1.0}, {**GOOD, "arrival_time": 3.0}, {**GOOD, "arrival_time": 2.0}]),
        2,
        "arrival_time",
        "arrival order",
    )


def test_record_not_an_object(tmp_path):
    expect_error(write_doc(tmp_path, [GOOD, [10, 5]]), 1, None, "must be a JSON object")


def test_top_level_problems(tmp_path):
    expect_error(write_doc(tmp_path, [GOOD], extra={"format": "other/9"}), None, "format", "expected")
    expect_error(write_doc(tmp_path, [GOOD], extra={"extra": 1}), None, "extra", "unknown top-level key")
    expect_error(write_doc(tmp_path, []), None, "requests", "empty")
    expect_error(write_doc(tmp_path, [GOOD], metadata={"count": 2}), None, "metadata.count", "count is 2 but the file has 1")
    path = tmp_path / "list.json"
    path.write_text("[]")
    expect_error(path, None, None, "top level must be a JSON object")
    path.write_text('{"format": "pagesim-trace/1", "requests": []}')
    expect_error(path, None, "metadata", "missing top-level key")


def test_one_bad_record_fails_the_whole_file(tmp_path):
    records = [GOOD] * 50 + [{"prompt_len": 0, "output_len": 1}] + [GOOD] * 50
    expect_error(write_doc(tmp_path, records), 50, "prompt_len", "> 0")


# --- round trips -------------------------------------------------------------------------------


def full_trace() -> Trace:
    return Trace(
        metadata={"name": "mixed", "count": 4, "nested": {"b": [1, 2.5, "x"], "a": None}, "command": "hand-made"},
        requests=[
            TraceRequest(prompt_len=3, output_len=7, arrival_time=0.125, prompt_token_ids=[2, 31414, 6]),
            TraceRequest(prompt_len=5, output_len=1, arrival_time=0.3333333333333333, n=4, prefix_group=0, shared_prefix_len=2),
            TraceRequest(prompt_len=1, output_len=9, arrival_time=2.0, beam_width=6, n=2, prefix_group="5-shot"),
            TraceRequest(prompt_len=2048, output_len=2048, arrival_time=1e9),
        ],
    )


def test_round_trip_identical_bytes_and_objects(tmp_path):
    trace = full_trace()
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    save_trace(trace, first)
    loaded = load_trace(first)
    assert loaded == trace
    save_trace(loaded, second)
    assert first.read_bytes() == second.read_bytes()
    # One request per line, absent optional fields stay absent.
    lines = first.read_text().splitlines()
    assert '{"prompt_len":2048,"output_len":2048,"arrival_time":1000000000.0}' in lines


@pytest.mark.parametrize("name", ["sharegpt.json", "alpaca.json"])
def test_committed_traces_are_canonical(name):
    path = REPO / "traces" / name
    trace = load_trace(path)
    assert dumps_trace(trace) == path.read_text()


def test_save_refuses_an_invalid_trace(tmp_path):
    bad = Trace(metadata={}, requests=[TraceRequest(prompt_len=3, output_len=1), TraceRequest(prompt_len=3, output_len=0)])
    with pytest.raises(TraceError) as info:
        save_trace(bad, tmp_path / "out.json")
    assert "out.json" in str(info.value) and info.value.index == 1 and info.value.field == "output_len"
    assert not (tmp_path / "out.json").exists()


def test_deep_metadata_and_fifo_are_one_line_errors(tmp_path):
    """Issue 26: metadata nested 900 deep was a RecursionError, a FIFO given as a trace hung."""
    deep = tmp_path / "deep.json"
    deep.write_text('{"format": "pagesim-trace/1", "metadata": ' + '{"a": ' * 900 + "1" + "}" * 900
                    + ', "requests": [{"prompt_len": 3, "output_len": 4}]}')
    with pytest.raises(TraceError, match="nested more than 64 levels deep"):
        load_trace(deep)
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)  # nobody writes to it: opening it for reading would block forever
    with pytest.raises(TraceError, match="is a FIFO, not a regular file"):
        load_trace(fifo)


@pytest.mark.parametrize("count", ["1", True, 1.0])
def test_metadata_count_must_be_an_integer(tmp_path, count):
    # "1" said "metadata count is 1 but the file has 1 requests"; true passed as 1
    expect_error(write_doc(tmp_path, [GOOD], metadata={"count": count}), None, "metadata.count", "must be an integer")


def test_requests_not_an_array_says_the_json_type(tmp_path):
    err = expect_error(write_doc(tmp_path, {"a": 1}), None, "requests", "must be a JSON array, got object")
    assert "_Obj" not in str(err)  # (the loader's own class name leaked)

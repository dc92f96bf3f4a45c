"""float_text's column texts against Python's own: repr() of every float, str() of every other
value and "" for None (what csv.writer writes), with orjson and without it."""

from __future__ import annotations

import math
import random
import struct
from array import array

import pytest

from pagesim.metrics import float_text
from pagesim.metrics.float_text import float_row_texts, value_texts

orjson = pytest.importorskip("orjson")  # (the writers' speed-up; without it Python writes everything)


def _random_doubles(count: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    values = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(count)]
    return [x for x in values if math.isfinite(x)]


def _every_decade(seed: int) -> list[float]:
    """Values in every decade from 1e-320 to 1e307, with few and with many digits."""
    rng = random.Random(seed)
    return [v for e in range(-320, 308) for v in (rng.random() * 10.0 ** e, round(rng.random() * 10.0 ** e, 3))]


EDGES = [0.0, -0.0, 1e-4, 0.0001, 9.999999999999999e-05, 1e-05, 2.5e-05, -3e-07, 1e-10, 5e-324, 1e16, 1e15,
         9999999999999998.0, 1.7976931348623157e308, 0.1, 100.0, 1e22, 123456789012345.6, -1.5]


@pytest.mark.parametrize("with_orjson", [True, False])
def test_float_row_texts_are_the_reprs(with_orjson, monkeypatch):
    """Rows of one, two and three columns, as lists and as array('d'): each row's reprs joined by
    commas, whatever the values (random bit patterns, every decade, edges, NaN and infinities,
    tiny values alone in a row and beside ordinary ones)."""
    if not with_orjson:
        monkeypatch.setattr(float_text, "orjson", None)
    for values in (_random_doubles(20_000, 1), _every_decade(2), EDGES, [0.5, 1e-05, 3.25], [math.nan, 1.0],
                   [math.inf, -math.inf], []):
        for width in (1, 2, 3):
            columns = [values[k:] + values[:k] for k in range(width)]  # (each row mixes values)
            expected = [",".join(map(repr, row)) for row in zip(*columns)]
            assert float_row_texts(columns) == expected, (width, values[:3])
            assert float_row_texts([array("d", column) for column in columns]) == expected


def test_rows_are_written_by_orjson_at_once_and_odd_ones_by_repr(monkeypatch):
    """One orjson call writes every row; a row holding a value orjson writes otherwise is
    written again by repr(), and only that row."""
    calls = []
    real = orjson.dumps
    monkeypatch.setattr(float_text, "orjson", type("Spy", (), {
        "dumps": staticmethod(lambda v, **options: calls.append(v) or real(v, **options)),
        "JSONEncodeError": orjson.JSONEncodeError, "OPT_SERIALIZE_NUMPY": orjson.OPT_SERIALIZE_NUMPY}))
    reprs = []
    monkeypatch.setattr(float_text, "repr", lambda x: reprs.append(x) or repr(x), raising=False)
    times = [1234.0001 + 0.02 * i for i in range(1000)]  # ("0.0000" inside tokens is no reason)
    durations = [0.02] * 500 + [3e-05] + [0.0] * 499
    texts = float_row_texts([times, durations])
    assert texts == [f"{t!r},{d!r}" for t, d in zip(times, durations)]
    assert len(calls) == 1 and reprs == [times[500], 3e-05]


def test_a_stretch_is_written_by_orjson_unless_a_value_needs_repr(monkeypatch):
    """value_texts' check that sends a stretch back to repr() fires on the values orjson writes
    otherwise (and so the fast path is taken on ordinary times)."""
    calls = []
    real = float_text.orjson.dumps
    monkeypatch.setattr(float_text, "orjson", type("Spy", (), {"dumps": staticmethod(lambda v: calls.append(v) or real(v)),
                                                             "JSONEncodeError": orjson.JSONEncodeError}))
    times = [1234.0001 + 0.02 * i for i in range(1000)]  # ("0.0000" inside tokens is no reason)
    assert not float_text._differs(real(times).decode()[1:-1])
    for tiny in (1e-05, -2e-05, 3e-07, 9.99e-05):
        text = real(times[:10] + [tiny] + times[10:]).decode()[1:-1]
        assert float_text._differs(text), tiny
    assert value_texts(times) == [repr(x) for x in times] and len(calls) == 1


@pytest.mark.parametrize("with_orjson", [True, False])
def test_value_texts_are_what_csv_writer_writes(with_orjson, monkeypatch):
    if not with_orjson:
        monkeypatch.setattr(float_text, "orjson", None)
    columns = [
        [1.5, None, 2.0, None, -0.0],  # a float column with Nones
        [None, None],
        [3, 4, 2 ** 70, None],  # an int beyond 64 bits: orjson cannot write it
        [7, 8, 9],
        [0.25, 3, None, 1e-05],  # a tiny value among them
        [2.0, 1e-05, 0.5],  # and without a None
        [0, 1, 2],
        [math.nan, None, 1.0],  # a NaN is written as nan, not as None
        [True, 1, 0.5],  # bool: str() writes True
        ["finished", "rejected", None],
        _random_doubles(2_000, 3) + [None],
    ]
    for values in columns:
        assert value_texts(values) == ["" if v is None else str(v) for v in values], values[:5]

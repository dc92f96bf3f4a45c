"""Many values' texts at once, as csv.writer writes them: the cost that dominates writing
requests.csv and steps.csv.

Python's repr of a float is the shortest text that reads back as the same float, and so is
orjson's (a compiled JSON writer, three to five times faster on a list of floats). The two agree
on every finite value except those with 0 < |x| < 1e-4: there Python writes an exponent of at
least two digits (1e-05) where orjson writes digits (0.00001) or a one-digit exponent (1e-5). They
also differ on NaN and infinities (orjson writes null, as for None). So a stretch of values is
written by orjson, and written again with repr() or str() if orjson's text holds any of those
cases (value_texts), or only the rows that hold one are (float_row_texts, where numpy finds
them); where orjson is not installed, Python writes everything. tests/metrics/test_float_text.py
compares the two on random bit patterns, on every decade and on the edge cases.
"""

from __future__ import annotations

import re
from array import array

try:
    import orjson
except ImportError:  # (an optional speed-up: the bytes are the same without it)
    orjson = None

# a one-digit negative exponent, which repr() writes with two (searched for only where the text
# has an "e-": a regular expression over every stretch would cost as much as the repr()s saved)
_SHORT_EXPONENT = re.compile(r"e-\d(?:,|$)")
_PLAIN_TYPES = {float, int, type(None)}  # (exactly these: bool and numpy scalars are written by str())


def _differs(text: str) -> bool:
    """Whether orjson's text of a stretch holds a number that repr() writes otherwise: one
    starting 0.0000 (a value under 1e-4 written as digits) or with a one-digit negative exponent."""
    return (",0.0000" in text or ",-0.0000" in text or text.startswith(("0.0000", "-0.0000"))
            or ("e-" in text and _SHORT_EXPONENT.search(text) is not None))


def float_row_texts(columns: list) -> list[str]:
    """For each row i, the reprs of columns[k][i] joined by "," (columns: equal-length sequences
    of floats, array('d') or lists): steps.csv's "time,duration" pieces. The columns are
    interleaved into one numpy array, which orjson writes straight from its buffer (no float
    objects made), and the text is cut into rows at every len(columns)-th comma. A row holding a
    value orjson writes otherwise (0 < |x| < 1e-4, NaN, infinities) is written by repr()."""
    width = len(columns)
    rows = len(columns[0]) if columns else 0
    raw = None
    if orjson is not None and rows:
        import numpy  # (here: `import pagesim.metrics` stays light)

        table = numpy.empty((rows, width))
        for k, column in enumerate(columns):
            table[:, k] = numpy.frombuffer(column, dtype=numpy.float64) if isinstance(column, array) else column
        try:
            raw = bytearray(orjson.dumps(table.reshape(-1), option=orjson.OPT_SERIALIZE_NUMPY))
        except orjson.JSONEncodeError:  # (an orjson that cannot write numpy arrays)
            pass
    if raw is None:
        return [",".join(map(repr, row)) for row in zip(*columns)]
    if width > 1:  # every width-th comma ends a row
        text = numpy.frombuffer(raw, dtype=numpy.uint8)
        text[numpy.flatnonzero(text == ord(","))[width - 1::width]] = ord("\n")
        del text  # (a bytearray with a view on it cannot be resized)
    texts = raw[1:-1].decode().split("\n" if width > 1 else ",")
    magnitude = numpy.abs(table)
    odd = ((magnitude < 1e-4) & (magnitude > 0)) | ~numpy.isfinite(table)
    for i in numpy.flatnonzero(odd.any(axis=1)).tolist():
        texts[i] = ",".join(map(repr, table[i].tolist()))
    return texts


def value_texts(values: list) -> list[str]:
    """What csv.writer writes for each of a column's values: "" for None, str() of the rest
    (a float's repr)."""
    # (min() before the scans for 0.0000: they are slow on texts full of 0.0, as step durations are)
    if orjson is not None and values and set(map(type, values)) <= _PLAIN_TYPES:
        try:
            text = orjson.dumps(values).decode()[1:-1]
        except orjson.JSONEncodeError:  # (an int beyond 64 bits)
            text = None
        nones = values.count(None)
        # every null a None (not a NaN or an infinity), and no number written otherwise
        if text is not None and text.count("null") == nones and ((not nones and min(values) >= 1e-4) or not _differs(text)):
            return text.replace("null", "").split(",") if nones else text.split(",")
    return ["" if value is None else str(value) for value in values]

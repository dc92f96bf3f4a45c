"""Request records as packed columns: what a summary and requests.csv need of each request, in
about 70 bytes, where a RequestRecord costs about 360 (the object, its boxed floats and ints).

A cluster's replicas replayed apart hand their records back this way, in files that the cluster
reads a stretch at a time (pagesim.cluster.spill: column_chunks, columns_of). RequestColumns is a
sequence of RequestRecords, each built when asked for (without output-token times: a packed
recorder folds their gaps into its span tally, MetricsRecorder.pack), and the summary reads the
columns themselves (column()).

numpy is imported inside the methods: `import pagesim.metrics` stays light.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING

from pagesim.metrics.records import RequestRecord

if TYPE_CHECKING:
    import numpy as np

FLOAT_FIELDS = ("arrival_time", "first_scheduled_time", "first_token_time", "finish_time")  # None: NaN
# (4 bytes each: counts of tokens, sequences and requests; a too large one fails loudly as it is packed)
INT_FIELDS = ("request_id", "prompt_len", "output_len", "num_seqs", "num_preemptions", "num_swaps",
              "cached_prompt_tokens", "total_output_len", "turn")  # turn None: -1
TEXT_FIELDS = ("status", "reject_reason", "session_id")  # a code each, into a table of the distinct values
CHUNK = 1 << 14  # records built at a time when iterating
COLUMN_CHUNK = 1 << 16  # rows a summary reads at a time (column_chunks)


class RequestColumns(Sequence):
    """Records as columns (FLOAT_FIELDS, INT_FIELDS, and TEXT_FIELDS as codes into `tables`),
    seen through `index` where given (the rows in this sequence's order: a reordering or a part
    that shares the columns, not a copy of them)."""

    def __init__(self, columns: dict[str, np.ndarray], tables: dict[str, list], index: np.ndarray | None = None):
        self.columns, self.tables, self.index = columns, tables, index

    @classmethod
    def of(cls, records) -> RequestColumns:
        """Records (RequestRecords, or columns already) as columns."""
        if isinstance(records, RequestColumns):
            return records
        import numpy as np

        records = records if isinstance(records, list) else list(records)
        columns, tables = {}, {}
        for name in FLOAT_FIELDS:  # (numpy reads None as NaN)
            columns[name] = np.array(list(map(attrgetter(name), records)), dtype=np.float64)
        for name in INT_FIELDS:
            values = map(attrgetter(name), records)
            columns[name] = np.array([-1 if v is None else v for v in values] if name == "turn" else list(values),
                                     dtype=np.int32)
        for name in TEXT_FIELDS:
            values = list(map(attrgetter(name), records))
            codes = {value: code for code, value in enumerate(dict.fromkeys(values))}
            tables[name] = list(codes)
            columns[name] = np.array(list(map(codes.__getitem__, values)), dtype=np.int32)
        return cls(columns, tables)

    @classmethod
    def concat(cls, parts: list[RequestColumns]) -> RequestColumns:
        """The parts' rows one part after another, in one set of columns (the text tables merged)."""
        import numpy as np

        parts = [p.packed() for p in parts]
        tables = merged_tables(parts)
        columns = {}
        for name in (*FLOAT_FIELDS, *INT_FIELDS, *TEXT_FIELDS):
            pieces = [p.columns[name] for p in parts]
            if name in TEXT_FIELDS:  # (each part's codes into the merged table)
                pieces = [codes[piece] for codes, piece in zip(recoded(parts, tables, name), pieces)]
            columns[name] = np.concatenate(pieces) if pieces else _empty(name)
        return cls(columns, tables)

    def packed(self) -> RequestColumns:
        """These rows in columns of their own (a copy where this sees shared columns through an index)."""
        if self.index is None:
            return self
        return RequestColumns({name: column[self.index] for name, column in self.columns.items()}, self.tables)

    def take(self, rows: np.ndarray) -> RequestColumns:
        """Rows `rows` of this sequence (positions, in the order given), sharing these columns."""
        return RequestColumns(self.columns, self.tables, rows if self.index is None else self.index[rows])

    def part(self, start: int, stop: int) -> RequestColumns:
        """Rows start .. stop - 1, sharing these columns."""
        if self.index is not None:
            return RequestColumns(self.columns, self.tables, self.index[start:stop])
        return RequestColumns({name: column[start:stop] for name, column in self.columns.items()}, self.tables)

    def column_chunks(self):
        """These rows a stretch at a time, in order (parts sharing these columns): what a summary
        reads, so that its temporaries stay a stretch's size (records merged from files as they
        are read give theirs the same way: pagesim.cluster.spill)."""
        for start in range(0, len(self), COLUMN_CHUNK):
            yield self.part(start, min(start + COLUMN_CHUNK, len(self)))

    def column(self, name: str) -> np.ndarray:
        """One field over the rows, in order: floats with NaN for None, ints (turn: -1 for None), or a
        text field's codes into tables[name]."""
        column = self.columns[name]
        return column if self.index is None else column[self.index]

    def columns_of(self, names) -> list[np.ndarray]:
        """column() of each of names (records merged from files read them in one pass)."""
        return [self.column(name) for name in names]

    def texts(self, name: str) -> list:
        """A text field's values over the rows, in order."""
        table = self.tables[name]
        return [table[code] for code in self.column(name).tolist()]

    def __len__(self) -> int:
        return len(self.columns["request_id"]) if self.index is None else len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return next(self._records(i, i + 1))

    def __iter__(self):
        for start in range(0, len(self), CHUNK):
            yield from self._records(start, min(start + CHUNK, len(self)))

    def _records(self, start: int, stop: int):
        """Records start .. stop - 1, built from a stretch of each column at once."""
        rows = slice(start, stop) if self.index is None else self.index[start:stop]
        values = {name: column[rows].tolist() for name, column in self.columns.items()}
        for name in FLOAT_FIELDS:
            values[name] = [None if v != v else v for v in values[name]]  # (NaN: None)
        values["turn"] = [None if v < 0 else v for v in values["turn"]]
        for name in TEXT_FIELDS:
            values[name] = list(map(self.tables[name].__getitem__, values[name]))
        nothing = repeat(())  # (token_spans, step_times: none kept)
        for row in zip(*(values.get(name, nothing) for name in _RECORD_ORDER)):
            yield RequestRecord(*row)


def merged_tables(parts: list[RequestColumns]) -> dict[str, list]:
    """The text tables of several parts' rows: each part's values, first seen first."""
    return {name: list(dict.fromkeys(v for p in parts for v in p.tables[name])) for name in TEXT_FIELDS}


def recoded(parts: list[RequestColumns], tables: dict[str, list], name: str) -> list:
    """Per part, its codes of text field `name` into `tables` (an array: new code at old code)."""
    import numpy as np

    codes = {value: code for code, value in enumerate(tables[name])}
    return [np.array([codes[v] for v in p.tables[name]], dtype=np.int32) for p in parts]


_RECORD_ORDER = [f.name for f in fields(RequestRecord)]
assert set(_RECORD_ORDER) == {*FLOAT_FIELDS, *INT_FIELDS, *TEXT_FIELDS, "token_spans", "step_times"}


def _empty(name: str):
    import numpy as np

    return np.zeros(0, dtype=np.float64 if name in FLOAT_FIELDS else np.int32)

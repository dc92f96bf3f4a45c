"""A cluster's records, replayed apart, kept in files and merged as they are read: memory flat in
the number of requests (pagesim.cluster.independent).

Each replica's records are written to a file as rows (RequestColumns' columns side by side), in
the order the replica recorded them, beside when each left (its clock's order) and its token
gaps (GapCounts). The cluster's records are then a merge of those files in the one clock's order
(by when each request left, ties by replica, a replica's own order kept): each replica's records
left in time order, so the merge reads every file a stretch at a time (a k-way merge in chunks,
MergedRecords.chunks), and the summary and requests.csv are made from the chunks as they come. A
caller that asks for a record at random, or a whole column, gets the merged columns built then
(RequestColumns, as before). The folder goes when the records are let go (TemporaryDirectory).
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.metrics import RequestColumns
from pagesim.metrics.itl import CHUNK as GAP_CHUNK
from pagesim.metrics.itl import GapCounts, SpanTally
from pagesim.metrics.request_columns import FLOAT_FIELDS, INT_FIELDS, TEXT_FIELDS, merged_tables, recoded

# one record a row: the packed columns side by side (80 bytes)
ROW = np.dtype([(name, np.float64) for name in FLOAT_FIELDS] + [(name, np.int32) for name in INT_FIELDS + TEXT_FIELDS])
ROW_BYTES = np.dtype((np.void, ROW.itemsize))  # a row as 80 opaque bytes
MERGED_ROWS = 1 << 15  # rows a merged chunk holds, about (more where many requests leave at one instant)


def _read(path: str, dtype, start: int, count: int) -> np.ndarray:
    """Items start .. start + count - 1 of a file of `dtype` items."""
    dtype = np.dtype(dtype)
    return np.fromfile(path, dtype=dtype, count=count, offset=start * dtype.itemsize)


class SpilledRecords(RequestColumns):
    """One replica's records in its rows file, in the order it recorded them, and when each left
    (`left`: its own file). Its columns are read in when asked for (a caller's random access)."""

    def __init__(self, stem: str, count: int, tables: dict, in_order: bool) -> None:
        super().__init__(None, tables)
        self.stem, self.count = stem, count
        self.in_order = in_order  # whether they left in time order (the merge in chunks needs it)

    @classmethod
    def write(cls, records: RequestColumns, left, stem: str) -> SpilledRecords:
        """Write packed records and when each left (array('d')) to files named from `stem`."""
        packed = records.packed()
        rows = np.empty(len(packed), dtype=ROW)
        for name in ROW.names:
            rows[name] = packed.column(name)
        rows.tofile(stem + "rows")
        left = np.frombuffer(left, dtype=np.float64)
        left.tofile(stem + "left")
        return cls(stem, len(packed), packed.tables, bool(np.all(left[1:] >= left[:-1])))

    @property
    def columns(self) -> dict:
        if self._columns is None:
            rows = _read(self.stem + "rows", ROW, 0, self.count)
            self._columns = {name: np.ascontiguousarray(rows[name]) for name in ROW.names}
        return self._columns

    @columns.setter
    def columns(self, columns) -> None:
        self._columns = columns

    def rows(self, start: int, count: int) -> np.ndarray:
        return _read(self.stem + "rows", ROW, start, count)

    def left(self, start: int, count: int) -> np.ndarray:
        return _read(self.stem + "left", np.float64, start, count)

    def __len__(self) -> int:
        return self.count


class MergedRecords(RequestColumns):
    """Replicas' spilled records in the one clock's order (see the module's doc), read a chunk at
    a time (chunks, with each row's replica); the columns are built only if asked for."""

    def __init__(self, parts: list[SpilledRecords], folder) -> None:
        super().__init__(None, merged_tables(parts))
        self.parts, self.folder = parts, folder
        self.count = sum(len(p) for p in parts)
        # per part, its text codes into the merged tables
        recodes = {name: recoded(parts, self.tables, name) for name in TEXT_FIELDS}
        self._codes = [{name: recodes[name][k] for name in TEXT_FIELDS} for k in range(len(parts))]
        self._replica = None

    def __len__(self) -> int:
        return self.count

    def chunks(self, size: int | None = None):
        """(RequestColumns, each row's replica as int32) in order, a stretch at a time: every row
        that left at or before the earliest time any replica's next `size / replicas` rows reach,
        merged by (time, replica), stable (requests leaving at one instant on one replica keep their
        order). Were some replica's records not in time order, all at once, sorted the same way."""
        size = size or MERGED_ROWS
        parts = [(k, p) for k, p in enumerate(self.parts) if len(p)]
        in_order = all(p.in_order for _, p in parts)
        window = max(1, size // max(1, len(parts))) if in_order else self.count
        at = [0] * len(self.parts)
        ahead = [np.zeros(0) for _ in self.parts]  # per part: the leaving times read past `at`
        while parts := [(k, p) for k, p in parts if at[k] < len(p)]:
            for k, p in parts:  # (topped up to a window each: the least a part holds bounds the chunk)
                read = at[k] + len(ahead[k])
                if len(ahead[k]) < window and read < len(p):
                    ahead[k] = np.concatenate([ahead[k], p.left(read, window - len(ahead[k]))])
            # every row up to the earliest time a part has read to is here (a part read to its end
            # bounds nothing: the last chunk takes the rest)
            bounds = [ahead[k][-1] for k, p in parts if at[k] + len(ahead[k]) < len(p)]
            until = min(bounds) if bounds else math.inf
            pieces, times, owners = [], [], []
            for k, p in parts:
                while ahead[k][-1] <= until and at[k] + len(ahead[k]) < len(p):  # (ties past the window)
                    ahead[k] = np.concatenate([ahead[k], p.left(at[k] + len(ahead[k]), window)])
                taken = int(np.searchsorted(ahead[k], until, side="right")) if in_order else len(ahead[k])
                if not taken:
                    continue
                piece = p.rows(at[k], taken)
                for name, codes in self._codes[k].items():
                    piece[name] = codes[piece[name]]
                pieces.append(piece)
                times.append(ahead[k][:taken])
                owners.append(np.full(taken, k, dtype=np.int32))
                at[k] += taken
                ahead[k] = ahead[k][taken:]
            owner = np.concatenate(owners)
            order = np.lexsort((owner, np.concatenate(times)))
            # (as opaque rows of bytes: numpy copies a structured row field by field, ~20 times slower)
            rows = np.concatenate([piece.view(ROW_BYTES) for piece in pieces]).take(order).view(ROW)
            yield RequestColumns({name: rows[name] for name in ROW.names}, self.tables), owner[order]

    def column_chunks(self):
        for columns, _ in self.chunks():
            yield columns

    def column(self, name: str) -> np.ndarray:
        """One field over the rows, in order (a merge pass of its own where the columns are not
        built: 8 bytes a request, not all the columns' 80)."""
        return self.columns_of([name])[0]

    def columns_of(self, names) -> list[np.ndarray]:
        """Fields over the rows, in order, from one merge pass where the columns are not built."""
        if self._columns is not None:
            return [self._columns[name] for name in names]
        pieces = {name: [] for name in names}
        for columns in self.column_chunks():
            for name in names:
                pieces[name].append(columns.column(name).copy())
        return [np.concatenate(pieces[name]) if pieces[name] else np.zeros(0, dtype=ROW[name]) for name in names]

    def replicas(self) -> np.ndarray:
        """Each row's replica (built when first asked for: 4 bytes a request)."""
        if self._replica is None:
            self._build()
        return self._replica

    @property
    def columns(self) -> dict:
        if self._columns is None:
            self._build()
        return self._columns

    @columns.setter
    def columns(self, columns) -> None:
        self._columns = columns

    def _build(self) -> None:
        merged = list(self.chunks())
        self._columns = RequestColumns.concat([columns for columns, _ in merged]).columns
        self._replica = np.concatenate([r for _, r in merged]) if merged else np.zeros(0, dtype=np.int32)

    def __iter__(self):
        for columns, _ in self.chunks():
            yield from columns


class SpilledGaps(GapCounts):
    """A replica's token gaps with counts in two files (SpanTally.gap_count_pieces, written as
    they come: no GapCounts in memory), read a chunk at a time as GapCounts.chunks gives them."""

    @classmethod
    def write(cls, tally: SpanTally | GapCounts, stem: str) -> SpilledGaps:
        pieces = tally.gap_count_pieces() if isinstance(tally, SpanTally) else [(tally.values, tally.weights)]
        count = 0
        with open(stem + "gaps", "wb") as gaps, open(stem + "weights", "wb") as weights:
            for values, counts in pieces:
                values.tofile(gaps)
                counts.astype(np.int32).tofile(weights)
                count += len(values)
        spilled = cls(np.zeros(0), np.zeros(0, dtype=np.int32), tally.num_requests, tally.warmup_s, tally.origin)
        spilled.stem, spilled.count = stem, count
        return spilled

    def chunks(self):
        for i in range(0, self.count, GAP_CHUNK):
            yield (_read(self.stem + "gaps", np.float64, i, GAP_CHUNK), _read(self.stem + "weights", np.int32, i, GAP_CHUNK))

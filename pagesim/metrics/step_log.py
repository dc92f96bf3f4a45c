"""The step log: every step's record, kept as columns (see StepLog)."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from itertools import chain, islice, repeat
from operator import sub, truediv
from struct import Struct

from pagesim.core.native import Number, attributes_of, set_attributes
from pagesim.metrics.itl import sum_in_order
from pagesim.metrics.records import HELD_FIELDS, STEP_FIELDS, StepRecord


class StepLog:
    """Every step's StepRecord, in time order, stored as columns so that memory stays flat over a
    long run: the four fields that change every step are packed arrays (the blocks without
    sharing only from the first step that shares blocks: before it they are the blocks used), the
    other ten are held values (a new row of them only where they change: at every single step,
    twice per decode run). StepRecords are built only when asked for (steps.csv, the API's
    DataFrame).

    What the summary needs is summed in step order (the same floats as summing the columns
    afterwards): counts as steps arrive, the time-weighted totals a stretch of steps at a time
    (StepTotals). So a run that writes no steps.csv (keep_steps=False) keeps only the step end
    times, which the requests' output-token times point into."""

    def __reduce__(self):
        return StepLog, (0,), attributes_of(self)  # (sent back from workers: pagesim.core.native)

    def __setstate__(self, attributes: dict) -> None:
        set_attributes(self, attributes)

    def __init__(self, total_blocks: int, keep_steps: bool = True):
        self.total_blocks = total_blocks
        self.keep_steps = keep_steps
        self.time = array("d")
        self._forgotten = 0  # steps whose end times were let go (forget_times)
        self.duration = array("d")
        self.kv_blocks_used = array("i")  # (4 bytes: a pool holds at most MAX_POOL_BLOCKS)
        # kv_blocks_logical, kept from the first step that shares blocks (logical > used) on:
        # until then it is the used column (most runs never share: no copy of it at all)
        self._logical: array | None = None
        # rows of held values: the first step each holds from (until the next row's), and the
        # values, HELD_FIELDS in order, len(HELD_FIELDS) a row
        self.held_from = array("i")  # (step indices: a replay stays far below 2**31 steps)
        self.held = array("i")  # (counts of requests, sequences, tokens and blocks in one step)
        # totals over the steps so far (the time-weighted ones, value x duration, in StepTotals)
        self.weighted = StepTotals(total_blocks, self if keep_steps else None)
        self.used_sum = 0
        self.logical_sum = 0
        self.peak_used = 0
        self.held_sums = [0] * len(HELD_FIELDS)

    def __len__(self) -> int:
        return self._forgotten + len(self.time)

    @property
    def duration_sum(self) -> float:
        return self.weighted.settled().duration_sum

    @property
    def used_time(self) -> float:
        return self.weighted.settled().used_time

    @property
    def logical_time(self) -> float:
        return self.weighted.settled().logical_time

    @property
    def utilization_time(self) -> float:
        return self.weighted.settled().utilization_time

    def forget_times(self) -> None:
        """Keep no step end times any more (a log that keeps no steps, once the requests' token
        gaps are counted: MetricsRecorder.pack); its totals and length stay."""
        self._check_kept(False)
        self._forgotten += len(self.time)
        self.time = array("d")

    @property
    def kv_blocks_logical(self) -> array:
        """Blocks the live sequences would hold without sharing, step by step."""
        return self.kv_blocks_used if self._logical is None else self._logical

    @property
    def shares_blocks(self) -> bool:
        """Whether any kept step holds shared blocks (kv_blocks_logical differs from kv_blocks_used)."""
        return self._logical is not None

    def add_step(self, time: Number, duration: Number, used: int, logical: int, held: tuple[int, ...]) -> None:
        self.time.append(time)
        # _add_totals for one step, unrolled: a chunked-prefill replay records most of its steps here
        if not self.keep_steps:  # (a log that keeps its steps has them in its columns)
            self.weighted.add_one(duration, used, logical)
        self.used_sum += used
        self.logical_sum += logical
        if used > self.peak_used:
            self.peak_used = used
        sums = self.held_sums
        for i in range(len(sums)):  # (in place, native ints when compiled: `+=` on an item would be generic)
            sums[i] = sums[i] + held[i]
        if self.keep_steps:
            self.held_from.append(len(self.time) - 1)
            self.held.frombytes(_pack_held(*held))
            self.duration.append(duration)
            self.kv_blocks_used.append(used)
            if self._logical is not None:
                self._logical.append(logical)
            elif logical != used:
                self._logical = self.kv_blocks_used[:-1]
                self._logical.append(logical)

    def add_run(self, ends: list, durations: list, used: list[int], shared: tuple[int, int],
                held: tuple, held_last: tuple) -> int:
        """Steps of one decode run: shared is logical minus used blocks during the run and at its
        last step; held and held_last the held values during it and at its last step. Returns the
        index of its first step."""
        first = len(self.time)
        last = first + len(ends) - 1
        _extend(self.time, ends)
        gap = shared[0]
        if gap or shared[1]:
            logical = [u + gap for u in used]
            logical[-1] += shared[1] - gap
        else:  # (most runs share no block: logical is used)
            logical = used
        self._add_totals(durations, used, logical, held, held_last, len(ends))
        if self.keep_steps:
            if last > first:
                self.held_from.append(first)
                self.held.frombytes(_pack_held(*held))
            self.held_from.append(last)
            self.held.frombytes(_pack_held(*held_last))
            _extend(self.duration, durations)
            _extend(self.kv_blocks_used, used)
            if self._logical is None and (shared[0] or shared[1]):
                self._logical = self.kv_blocks_used[:first]
            if self._logical is not None:
                self._logical.fromlist(logical)
        return first

    def _add_totals(self, durations: list, used: list[int], logical: list[int], held: tuple[int, ...],
                    held_last: tuple[int, ...], num_steps: int) -> None:
        if not self.keep_steps:
            self.weighted.add(durations, used, logical)
        used_sum, peak = 0, self.peak_used
        for blocks in used:  # (one pass of native ints, compiled: sum() and max() are two generic calls)
            used_sum += blocks
            if blocks > peak:
                peak = blocks
        self.used_sum += used_sum
        self.logical_sum += used_sum if logical is used else sum(logical)
        self.peak_used = peak
        # (integers: exact in any order) the held values num_steps - 1 times, then the last step's
        repeats, sums = num_steps - 1, self.held_sums
        for i in range(len(sums)):
            sums[i] = sums[i] + held_last[i] + held[i] * repeats

    def _check_kept(self, kept: bool = True) -> None:
        if self.keep_steps != kept:
            raise ValueError("this run kept no per-step records (keep_steps=False): replay it with them to get steps"
                             if kept else "a log that keeps its steps keeps their end times")

    def segments(self):
        """(first step, stop step, held values) for each row of held values, in step order: the
        steps from first to stop - 1 hold those values (HELD_FIELDS in order)."""
        self._check_kept()
        width = len(HELD_FIELDS)
        held, starts = self.held, self.held_from
        stops = chain(islice(starts, 1, None), (len(self.time),))
        for i, (first, stop) in enumerate(zip(starts, stops)):
            yield first, stop, held[i * width:(i + 1) * width]

    def held_runs(self, first: int, stop: int) -> tuple[list[bytes], list[int]]:
        """The rows of held values that steps first .. stop - 1 hold, each as its bytes (a key:
        unpack_held gives its values, HELD_FIELDS in order), and for each the number of those
        steps that hold it."""
        self._check_kept()
        starts = self.held_from
        r0, r1 = bisect_right(starts, first) - 1, bisect_left(starts, stop)
        bounds = [first, *starts[r0 + 1:r1], stop]
        import numpy  # (here: `import pagesim.metrics` stays light)

        row = numpy.dtype((numpy.void, _HELD_STRUCT.size))  # (one row's bytes as one numpy item)
        rows = numpy.frombuffer(self.held, row)[r0:r1].tolist()  # (bytes objects, made in C)
        return rows, list(map(sub, bounds[1:], bounds))

    def held_column(self, name: str):
        """One held field, step by step."""
        at = HELD_FIELDS.index(name)
        return chain.from_iterable(repeat(values[at], stop - first) for first, stop, values in self.segments())

    def held_sum(self, name: str) -> int:
        return self.held_sums[HELD_FIELDS.index(name)]

    def utilization(self):
        total = self.total_blocks
        return map(truediv, self.kv_blocks_used, repeat(total)) if total else repeat(0.0, len(self.time))

    def row(self, step: int) -> tuple:
        """One step's StepRecord fields, in STEP_FIELDS order."""
        self._check_kept()
        width = len(HELD_FIELDS)
        at = bisect_right(self.held_from, step) - 1  # the held row the step is in
        h = self.held[at * width:(at + 1) * width]
        used = self.kv_blocks_used[step]
        util = used / self.total_blocks if self.total_blocks else 0.0
        return (self.time[step], self.duration[step], *h[:6], used, self.kv_blocks_logical[step], util, *h[6:])

    def columns(self) -> dict[str, list]:
        """Every StepRecord field as a list over the steps, in STEP_FIELDS order (a DataFrame's columns)."""
        self._check_kept()
        cols = {name: list(self.held_column(name)) for name in HELD_FIELDS}
        cols.update(time=self.time.tolist(), duration=self.duration.tolist(), kv_blocks_used=self.kv_blocks_used.tolist(),
                    kv_blocks_logical=self.kv_blocks_logical.tolist(), kv_utilization=list(self.utilization()))
        return {name: cols[name] for name in STEP_FIELDS}

    def records(self):
        """StepRecords, built on demand."""
        self._check_kept()
        held = zip(*(self.held_column(name) for name in HELD_FIELDS))
        for time, duration, used, logical, util, h in zip(self.time, self.duration, self.kv_blocks_used,
                                                          self.kv_blocks_logical, self.utilization(), held):
            yield StepRecord(time, duration, *h[:6], used, logical, util, *h[6:])


# one row of held values as the bytes of array("i") items (native int, as the array holds them):
# held.extend(row) converts a tuple item by item, ~3x slower for a row of ten
_HELD_STRUCT = Struct(f"{len(HELD_FIELDS)}i")
_pack_held = _HELD_STRUCT.pack
unpack_held = _HELD_STRUCT.unpack


def _extend(column: array, values) -> None:
    """column.extend(values); for a list (what the simulator passes) at a third of the cost over
    a long decode run: fromlist sizes the array once, extend grows it value by value."""
    if values.__class__ is list:
        column.fromlist(values)
    else:
        column.extend(values)


class StepTotals:
    """A step log's time-weighted totals (durations, and blocks used, blocks without sharing and
    the pool's share used, each times the step's duration), summed in step order: each total
    gains one term a step, left to right, as `total += value` would add them. Steps are added as
    they come, in a loop of native floats (this module is compiled: scripts/compile.py). A log
    that keeps its steps has their values in its columns already: the totals read them there a
    stretch at a time (settled(), at the latest when read), with numpy, whose products are the
    same floats and whose add.accumulate adds left to right, as the loop does (a few steps by
    the loop: numpy's call costs more)."""

    SETTLE_STEPS = 1 << 14  # (a kept log's stretch: numpy's temporaries this size)
    LOOP_STEPS = 64  # fewer are summed by the loop

    def __reduce__(self):
        return StepTotals, (0,), attributes_of(self)  # (sent back from workers: pagesim.core.native)

    def __setstate__(self, attributes: dict) -> None:
        set_attributes(self, attributes)

    def __init__(self, total_blocks: int, kept: StepLog | None = None):
        """kept: a log that keeps its steps, whose columns the totals read (nothing is added here)."""
        self.total_blocks = total_blocks
        self.duration_sum = self.used_time = self.logical_time = self.utilization_time = 0.0
        self._kept, self._kept_upto = kept, 0  # (steps of the kept columns summed)

    def add(self, durations: list, used: list[int], logical: list[int]) -> None:
        """Steps of a run (logical is used where they share no block)."""
        total = self.total_blocks
        duration_sum, used_time = self.duration_sum, self.used_time
        logical_time, utilization_time = self.logical_time, self.utilization_time
        for i in range(len(used)):
            seconds: float = durations[i]
            blocks = used[i]
            duration_sum += seconds
            used_time += blocks * seconds
            logical_time += logical[i] * seconds
            if total:
                utilization_time += blocks / total * seconds
        self.duration_sum, self.used_time = duration_sum, used_time
        self.logical_time, self.utilization_time = logical_time, utilization_time

    def add_one(self, duration: float, used: int, logical: int) -> None:
        self.add([duration], [used], [logical])

    def settled(self) -> StepTotals:
        """The totals with every step added so far (self); a kept log's columns a stretch at a
        time (a long run's temporaries stay a stretch's size)."""
        kept = self._kept
        if kept is None:  # (added as they came)
            return self
        start = self._kept_upto
        durations, used, logical = kept.duration, kept.kv_blocks_used, kept._logical
        self._kept_upto = len(durations)
        for upto in range(start, len(durations), self.SETTLE_STEPS):
            stop = upto + self.SETTLE_STEPS
            self._add_up(durations[upto:stop], used[upto:stop], logical[upto:stop] if logical is not None else None)
        return self

    def _add_up(self, durations: array, used: array, logical: array | None) -> None:
        """Add a kept stretch's terms to the totals (logical None: every step's logical blocks are
        its used ones)."""
        if len(used) < self.LOOP_STEPS:
            blocks = used.tolist()
            self.add(durations.tolist(), blocks, logical.tolist() if logical is not None else blocks)
            return
        import numpy as np

        # (where every step's logical blocks were its used ones so far, the two totals are the same float)
        same = logical is None and self.logical_time == self.used_time
        step_seconds = np.frombuffer(durations, dtype=np.float64)
        step_blocks = np.frombuffer(used, dtype=np.int32).astype(np.float64)
        self.duration_sum = sum_in_order(step_seconds, self.duration_sum)
        self.used_time = sum_in_order(step_blocks * step_seconds, self.used_time)
        if same:
            self.logical_time = self.used_time
        else:
            logical_blocks = step_blocks if logical is None else np.frombuffer(logical, dtype=np.int32).astype(np.float64)
            self.logical_time = sum_in_order(logical_blocks * step_seconds, self.logical_time)
        if self.total_blocks:
            self.utilization_time = sum_in_order(step_blocks / self.total_blocks * step_seconds, self.utilization_time)


class StepStarts:
    """Whether a step had begun by a given time, as `end - duration <= t + slack` tells from the
    step's end and duration, in a few bytes per run instead of each step's duration (8 bytes a
    step): what an engine that delivers tokens a step late needs when it keeps no step log.

    A step's start (its end minus its duration, as floats) is kept only where it lies more than
    slack past the previous step's end: after an idle engine, the first step, and where the
    subtraction's rounding exceeds slack (long runs' large clocks). For any other step k and any
    t at or after step k - 1's end (t at or after ends[k - 1], as bisect_right(ends, t) == k
    gives) the test holds: start <= ends[k - 1] + slack <= t + slack, the same floats. Steps
    are checked as they are added, in a loop of native floats (compiled)."""

    def __reduce__(self):
        return StepStarts, (0.0,), attributes_of(self)  # (sent back from workers: pagesim.core.native)

    def __setstate__(self, attributes: dict) -> None:
        set_attributes(self, attributes)

    def __init__(self, slack: float):
        self.slack = slack
        self.num_steps = 0  # steps checked
        self.last_end = -math.inf  # the last checked step's end (none yet: the first step is kept)
        self.late = array("i")  # (step indices: a replay stays far below 2**31 steps)
        self.late_start = array("d")

    def add(self, ends: list, durations: list) -> None:
        """Steps in time order: their end times and durations (lists)."""
        previous, slack, first = self.last_end, self.slack, self.num_steps
        for i in range(len(ends)):
            end: float = ends[i]
            duration: float = durations[i]
            start = end - duration
            if start > previous + slack:
                self.late.append(first + i)
                self.late_start.append(start)
            previous = end
        self.num_steps += len(ends)
        self.last_end = previous

    def add_one(self, end: float, duration: float) -> None:
        """add() for one step."""
        self.add([end], [duration])

    def begun_by(self, step: int, t: Number) -> bool:
        """end - duration <= t + slack for the step (t at or after the previous step's end)."""
        at = bisect_left(self.late, step)
        if at < len(self.late) and self.late[at] == step:
            return self.late_start[at] <= t + self.slack
        return True

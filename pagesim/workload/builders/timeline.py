"""What the production-trace builders (Azure, Mooncake) share: a source record, the shaping
options (window of the hour, time scale, duration, context cap, count), the filters' account
in the metadata, and the arrival statistics.

Shaping runs in a fixed order, each step on the previous one's output: window (seconds of the
source, from its first arrival) -> time scale (gaps divided by it) -> duration (seconds after
scaling) -> count -> context cap. Every step that drops or changes a record says how many in
`filters`, so nothing is lost silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pagesim.workload.builders.common import length_stats
from pagesim.workload.trace import Trace, TraceRequest

ARRIVAL_DECIMALS = 7  # Azure's clock has 100 ns digits; rounding keeps the file's numbers short and exact


class SourceError(ValueError):
    """A record of a public data file is malformed: names the file, the line and the field."""

    def __init__(self, path: Path | str, line: int, field: str | None, problem: str):
        where = f"{path}: line {line}" + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class SourceRecord:
    line: int  # 1-based line of the source file (for messages)
    arrival: float  # seconds from the source's first arrival
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Shaping:
    """The builder options that cut or change the source's hour (docs/traces.md)."""

    window: tuple[float, float] | None = None  # [start, end) seconds of the source; times re-based to start
    time_scale: float = 1.0  # arrival gaps divided by this (2: twice the rate)
    duration: float | None = None  # keep arrivals before this many (scaled) seconds
    num: int | None = None  # keep the first num requests
    max_context: int | None = None  # prompt + output tokens at most: prompts truncated (see cap_context)

    def __post_init__(self):
        if self.window is not None and not 0 <= self.window[0] < self.window[1]:
            raise ValueError(f"--window {self.window[0]}:{self.window[1]}: needs 0 <= START < END")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"--time-scale must be a positive number, got {self.time_scale}")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"--duration must be > 0, got {self.duration}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"--max-context must be >= 2 (one prompt and one output token), got {self.max_context}")

    def options(self) -> list[str]:
        """The CLI options that rebuild this shaping (for the recorded command)."""
        parts = []
        if self.window is not None:
            parts += ["--window", f"{_num(self.window[0])}:{_num(self.window[1])}"]
        if self.time_scale != 1.0:
            parts += ["--time-scale", _num(self.time_scale)]
        if self.duration is not None:
            parts += ["--duration", _num(self.duration)]
        if self.num is not None:
            parts += ["--num", str(self.num)]
        if self.max_context is not None:
            parts += ["--max-context", str(self.max_context)]
        return parts

    def as_metadata(self) -> dict[str, Any]:
        return {"window_s": None if self.window is None else list(self.window), "time_scale": self.time_scale,
                "duration_s": self.duration, "num": self.num, "max_context": self.max_context,
                "order": "window (source seconds) -> time scale (gaps divided by it) -> duration (scaled seconds) "
                         "-> first num -> context cap"}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def production_command(kind: str, shaping: Shaping, out: str) -> str:
    return " ".join(["pagesim", "trace", "build", kind, *shaping.options(), "--out", out])


def check_order(path: Path | str, records: Sequence[SourceRecord], field: str) -> None:
    for prev, rec in zip(records, records[1:]):
        if rec.arrival < prev.arrival:
            raise SourceError(path, rec.line, field, f"earlier than line {prev.line}'s (the file must be in arrival order)")


def _truncate(rec: SourceRecord, prompt_len: int, hash_block: int | None) -> SourceRecord:
    hashes = rec.hash_ids
    if hashes is not None:
        hashes = hashes[:-(-prompt_len // hash_block)]
    return SourceRecord(rec.line, rec.arrival, prompt_len, rec.output_len, hashes)


def shape(records: list[SourceRecord], shaping: Shaping, hash_block: int | None = None
          ) -> tuple[list[TraceRequest], list[dict[str, Any]], dict[str, Any] | None]:
    """Apply the shaping to time-ordered source records: (requests, filters, context_cap).

    Context cap: a request longer than max_context keeps the first max_context - output_len
    tokens of its prompt (the start, where a conversation's shared prefix is; Mooncake's hash
    ids are cut with it); one whose output alone leaves no prompt token is dropped."""
    filters: list[dict[str, Any]] = []

    def account(rule: str, before: int, after: list) -> None:
        filters.append({"rule": rule, "kept": len(after), "dropped": before - len(after)})

    kept = [r for r in records if r.prompt_len > 0 and r.output_len > 0]
    account("prompt and output have at least one token (a replay needs both)", len(records), kept)
    offset = 0.0
    if shaping.window is not None:
        start, end = shaping.window
        before = len(kept)
        kept = [r for r in kept if start <= r.arrival < end]
        account(f"arrives in the window [{_num(start)}, {_num(end)}) s of the source (times then re-based to its start)",
                before, kept)
        offset = start
    scale = shaping.time_scale
    times = [round((r.arrival - offset) / scale, ARRIVAL_DECIMALS) for r in kept]
    if shaping.duration is not None:
        before = len(kept)
        n = sum(1 for t in times if t < shaping.duration)
        kept, times = kept[:n], times[:n]
        account(f"arrives before {_num(shaping.duration)} s (after the time scale)", before, kept)
    if shaping.num is not None:
        before = len(kept)
        kept, times = kept[:shaping.num], times[:shaping.num]
        account(f"among the first {shaping.num} requests", before, kept)

    cap = None
    if shaping.max_context is not None:
        limit = shaping.max_context
        truncated, fitted, fitted_times = 0, [], []
        for rec, t in zip(kept, times):
            if rec.prompt_len + rec.output_len > limit:
                if rec.output_len >= limit:
                    continue
                rec = _truncate(rec, limit - rec.output_len, hash_block)
                truncated += 1
            fitted.append(rec)
            fitted_times.append(t)
        dropped = len(kept) - len(fitted)
        account(f"output_len < max_context {limit} (else dropped: no prompt token would be left)", len(kept), fitted)
        kept, times = fitted, fitted_times
        cap = {"max_context": limit, "truncated": truncated, "dropped": dropped,
               "policy": "prompt + output <= max_context: a longer prompt keeps its first max_context - output_len "
                         "tokens (hash ids cut with it); a request whose output alone reaches max_context is dropped",
               "note": f"max_context {limit}: {truncated} prompts truncated (their starts kept), {dropped} requests dropped"}
    if not kept:
        raise ValueError("no request is left after the filters: " + "; ".join(
            f"{f['rule']}: {f['dropped']} dropped" for f in filters if f["dropped"]))
    requests = [TraceRequest(prompt_len=r.prompt_len, output_len=r.output_len, arrival_time=t,
                             hash_ids=None if r.hash_ids is None else list(r.hash_ids))
                for r, t in zip(kept, times)]
    return requests, filters, cap


def arrival_stats(times: Sequence[float]) -> dict[str, Any]:
    """Span, mean rate and the burstiness of arrivals: the coefficient of variation of the gaps
    (1 for Poisson arrivals, above 1 burstier)."""
    span = times[-1] - times[0]
    gaps = [b - a for a, b in zip(times, times[1:])]
    out: dict[str, Any] = {"span_s": round(span, 3), "mean_rate_per_s": round((len(times) - 1) / span, 4) if span > 0 else None}
    if len(gaps) >= 2:
        mean = sum(gaps) / len(gaps)
        var = sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)
        out["gap_cv"] = round(math.sqrt(var) / mean, 4) if mean > 0 else None
        out["zero_gaps"] = sum(1 for g in gaps if g == 0)
    return out


def production_stats(requests: Sequence[TraceRequest]) -> dict[str, Any]:
    return {"prompt_len": length_stats([r.prompt_len for r in requests]),
            "output_len": length_stats([r.output_len for r in requests]),
            "arrivals": arrival_stats([r.arrival_time for r in requests])}


def shaped_trace(metadata: dict[str, Any], shaping: Shaping, filters: list, requests: list[TraceRequest],
                 cap: dict | None, command: str) -> Trace:
    """A production trace: the source's own metadata, then what shaping did to it (the same keys for
    every source)."""
    metadata = {**metadata, "shaping": shaping.as_metadata(), "filters": filters, "count": len(requests),
                "stats": production_stats(requests), "command": command}
    if cap is not None:
        metadata["context_cap"] = cap
    return Trace(metadata=metadata, requests=requests)

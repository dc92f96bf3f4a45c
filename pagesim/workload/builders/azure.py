"""The Azure LLM inference traces of 2023 (code and conversation services, one hour each):
arrival times and token counts, no prompt content (docs/traces.md)."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from pathlib import Path

from pagesim.workload.builders.common import _require, sha256_of
from pagesim.workload.builders.timeline import (Shaping, SourceError, SourceRecord, check_order,
                                                shape, shaped_trace)
from pagesim.workload.trace import Trace

AZURE_DIR = "traces_public/azure-llm-2023"
AZURE_FILES = {"azure-code": "AzureLLMInferenceTrace_code.csv", "azure-conv": "AzureLLMInferenceTrace_conv.csv"}
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SERVICE = {"azure-code": "code completion", "azure-conv": "conversation"}
TICKS_PER_SECOND = 10_000_000  # the TIMESTAMP column has 100 ns digits


def timestamp_ticks(text: str) -> int:
    """'2023-11-16 18:17:03.9799600' -> 100 ns ticks since the Unix epoch (UTC), exactly:
    datetime keeps only microseconds, so the fraction is read as digits."""
    whole, _, fraction = text.strip().partition(".")
    if not fraction.isdigit() and fraction != "":
        raise ValueError(f"bad fractional seconds in {text!r}")
    seconds = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    digits = (fraction + "0000000")[:7]
    if len(fraction) > 7 and fraction[7:].strip("0"):
        raise ValueError(f"finer than 100 ns: {text!r}")
    return int(seconds) * TICKS_PER_SECOND + int(digits)


def _int_field(path: Path, line: int, name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise SourceError(path, line, name, f"must be an integer, got {value!r}") from None
    if number < 0:
        raise SourceError(path, line, name, f"must be >= 0, got {number}")
    return number


def read_azure_csv(path: Path) -> tuple[list[SourceRecord], str]:
    """Records of an Azure trace CSV in file order, seconds from its first arrival, and the
    first TIMESTAMP (the wall clock of second 0). Malformed rows raise SourceError."""
    text = path.read_text(encoding="utf-8")
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
        raise SourceError(path, 1, None, f"header must be {','.join(AZURE_COLUMNS)}, got {header}")
    records, first = [], None
    origin = None
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) != len(AZURE_COLUMNS):
            missing = AZURE_COLUMNS[min(len(row), len(AZURE_COLUMNS) - 1)]
            raise SourceError(path, line, missing, f"expected {len(AZURE_COLUMNS)} columns, got {len(row)}")
        try:
            ticks = timestamp_ticks(row[0])
        except ValueError as exc:
            raise SourceError(path, line, "TIMESTAMP", f"not a 'YYYY-MM-DD HH:MM:SS.fffffff' time ({exc})") from None
        if origin is None:
            origin, first = ticks, row[0].strip()
        records.append(SourceRecord(line, (ticks - origin) / TICKS_PER_SECOND,
                                    _int_field(path, line, "ContextTokens", row[1]),
                                    _int_field(path, line, "GeneratedTokens", row[2])))
    if not records:
        raise SourceError(path, 2, None, "no records")
    check_order(path, records, "TIMESTAMP")
    return records, first


def build_azure(kind: str, data_dir: Path, shaping: Shaping | None = None, command: str = "") -> Trace:
    shaping = shaping or Shaping()
    rel = f"{AZURE_DIR}/{AZURE_FILES[kind]}"
    path = _require(Path(data_dir) / rel, f"Azure trace {AZURE_FILES[kind]}")
    records, first = read_azure_csv(path)
    requests, filters, cap = shape(records, shaping)
    metadata = {
        "name": kind,
        "description": f"Azure LLM inference trace 2023, {SERVICE[kind]} service: one hour of arrivals with prompt "
                       "(ContextTokens) and output (GeneratedTokens) lengths; no prompt content, so no prefix sharing "
                       "can be recognised.",
        "source": {"file": rel, "file_sha256": sha256_of(path), "records": len(records),
                   "repository": "Azure/AzurePublicDataset @ b469a113cedca53ddc3bdea71a143dc4b7d8700c, data/",
                   "license": "CC-BY-4.0",
                   "cite": "Patel et al., Splitwise: Efficient generative LLM inference using phase splitting, ISCA 2024"},
        "arrival_time": f"TIMESTAMP (wall clock, 100 ns digits, read exactly) as seconds from the first ({first}), "
                        "then shaped (see shaping)",
        "prompt_len": "ContextTokens", "output_len": "GeneratedTokens",
    }
    return shaped_trace(metadata, shaping, filters, requests, cap, command)

"""Reading the measured GPU operator timings (Vidur's CSV formats, ../shared/data/gpu_profiles).

Standard library only: `pagesim calibrate check` and the fit read these files, the simulator never
does (it loads the fitted coefficients shipped in pagesim/sim/data/calibrated/). Every problem is
reported as one line naming the file, the line and the column (`MeasurementError`).

Times in the files are milliseconds per call; everything returned here is in seconds (medians).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from pagesim.inputs import InputValueError, NumberRule, regular_file
from pagesim.sim.cost.calibration import LAYER_OPERATORS, STEP_OPERATORS
from pagesim.sim.cost.layer_ops import LayerShape
from pagesim.sim.specs import ModelSpec

MS = 1e-3
# the one number rule (pagesim.inputs): shapes of a real model, times a real operator can take
# (a denormal or 1e308 ms made `calibrate check --json` print NaN)
SHAPE_INT = NumberRule(lo=1, hi=10_000_000, integer=True)  # model shapes and token counts
BYTES_INT = NumberRule(lo=1, hi=2**40, integer=True, why="bytes")  # all-reduce message sizes (Vidur measures past 10 MB)
MILLISECONDS = NumberRule(lo=0, hi=3_600_000, tiny=1e-9, why="milliseconds, 0 for not measured")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp",
                 "num_tokens", "num_tensor_parallel_workers")
# GPU directory names in the data (Vidur's device names) -> our catalog names.
DATA_GPUS = {"a100": "a100-80gb", "h100": "h100-80gb", "a40": "a40-48gb"}


class MeasurementError(ValueError):
    """A measurement file that cannot be used; the message names the file, line and column."""


def _median_column(op: str) -> str:
    return f"time_stats.{op}.median"


def _rows(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[tuple[int, dict]]]:
    try:
        regular_file(path, "CSV file")  # a FIFO would block the read forever
    except InputValueError as e:
        raise MeasurementError(str(e)) from None
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            missing = [c for c in required if c not in header]
            if missing:
                raise MeasurementError(f"{path}: missing column(s) {', '.join(missing)}")
            return header, [(i + 2, row) for i, row in enumerate(reader)]  # line 1 is the header
    except FileNotFoundError:
        raise MeasurementError(f"{path}: no such file") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise MeasurementError(f"{path}: not a readable CSV file ({e})") from None


def _number(path: Path, line: int, row: dict, column: str, *, integer: bool = False, optional: bool = False,
            rule: NumberRule | None = None):
    raw = (row.get(column) or "").strip()
    if raw == "" and optional:
        return None
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise MeasurementError(f"{path}: line {line}, column {column}: expected {kind}, got {raw!r}") from None
    problem = (rule or (SHAPE_INT if integer else MILLISECONDS)).problem(value)
    if problem:
        raise MeasurementError(f"{path}: line {line}, column {column}: {problem}")
    return value


def _bool(path: Path, line: int, row: dict, column: str) -> bool:
    raw = (row.get(column) or "").strip().lower()
    if raw not in ("true", "false"):
        raise MeasurementError(f"{path}: line {line}, column {column}: expected True or False, got {raw!r}")
    return raw == "true"


# ----------------------------------------------------------------------------- operators (mlp.csv)

@dataclass(frozen=True)
class OperatorRow:
    """One row of an mlp.csv file: a model shape, a TP degree, a token count and the measured
    median seconds of each operator (operators the model does not have are absent)."""

    path: str
    line: int
    shape: LayerShape
    num_tokens: int
    seconds: dict[str, float]

    @property
    def layer_seconds(self) -> float:
        return sum(self.seconds[op] for op in LAYER_OPERATORS if op in self.seconds)



def read_operator_csv(path: str | Path) -> list[OperatorRow]:
    """Every row of a file in the mlp.csv format; the model shape comes from its own columns."""
    path = Path(path)
    header, rows = _rows(path, SHAPE_COLUMNS)
    ops = [op for op in LAYER_OPERATORS + STEP_OPERATORS if _median_column(op) in header]
    if not any(op in LAYER_OPERATORS for op in ops):
        raise MeasurementError(f"{path}: no operator column; expected e.g. {_median_column('attn_pre_proj')}")
    out = []
    for line, row in rows:
        n = {c: _number(path, line, row, c, integer=True) for c in SHAPE_COLUMNS if c != "use_gated_mlp"}
        if n["n_embd"] % n["n_head"] or n["n_head"] % n["n_kv_head"]:
            raise MeasurementError(f"{path}: line {line}, columns n_embd/n_head/n_kv_head: {n['n_embd']}/"
                                   f"{n['n_head']}/{n['n_kv_head']} do not divide into whole heads")
        # one layer of the file's model (parameter count and length unused): a gated MLP is the
        # llama family's, a plain one OPT's
        gated = _bool(path, line, row, "use_gated_mlp")
        spec = ModelSpec(model_name(path), 1, n["n_embd"], n["n_head"], n["n_kv_head"], n["n_embd"] // n["n_head"],
                         n["n_expanded_embd"], n["vocab_size"], num_params=1, max_model_len=4096,
                         architecture="llama" if gated else "opt")
        shape = LayerShape(spec, n["num_tensor_parallel_workers"], rotary=_median_column("attn_rope") in header)
        seconds = {}
        for op in ops:
            v = _number(path, line, row, _median_column(op), optional=True)
            if v is not None and v > 0:
                seconds[op] = v * MS
        out.append(OperatorRow(str(path), line, shape, n["num_tokens"], seconds))
    if not out:
        raise MeasurementError(f"{path}: no data rows")
    return out


def operator_files(data_dir: str | Path, gpu_dir: str) -> list[Path]:
    """compute/<gpu>/<org>/<model>/mlp.csv files of one GPU, sorted."""
    files = sorted((Path(data_dir) / "compute" / gpu_dir).glob("*/*/mlp.csv"))
    if not files:
        raise MeasurementError(f"{Path(data_dir) / 'compute' / gpu_dir}: no */*/mlp.csv files")
    return files


def model_name(path: str | Path) -> str:
    """org/model from a compute/<gpu>/<org>/<model>/mlp.csv path."""
    p = Path(path)
    return f"{p.parent.parent.name}/{p.parent.name}"


# ----------------------------------------------------------------------------- attention

@dataclass(frozen=True)
class AttentionRow:
    """One attention measurement: per GPU, per layer. Decode: `batch` sequences of `context`
    tokens each. Prefill: one sequence computing `new_tokens` after `context` earlier ones."""

    is_prefill: bool
    batch: int
    new_tokens: int
    context: int
    kv_bytes_per_token: int   # one token's K and V, one layer, this GPU's heads
    flops_per_pair: int       # QK^T and PV of one (query, key) pair, one layer, this GPU's heads
    token_bytes: int          # a new token's Q read and O written, one layer, this GPU's query heads
    seconds: float            # kernel + KV-cache write + output copy


ATTENTION_COLUMNS = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "batch_size",
                     "prefill_chunk_size", "kv_cache_size", "is_prefill")


def read_attention_csv(path: str | Path, dtype_bytes: int = 2) -> list[AttentionRow]:
    path = Path(path)
    _, rows = _rows(path, ATTENTION_COLUMNS + tuple(_median_column(op) for op in (
        "attn_decode", "attn_prefill", "attn_input_reshape", "attn_output_reshape")))
    out = []
    for line, row in rows:
        e, q, kv, tp = (_number(path, line, row, c, integer=True)
                        for c in ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers"))
        head_dim = e // q
        prefill = _bool(path, line, row, "is_prefill")
        kernel = _number(path, line, row, _median_column("attn_prefill" if prefill else "attn_decode"))
        extra = sum(_number(path, line, row, _median_column(c), optional=True) or 0.0
                    for c in ("attn_input_reshape", "attn_output_reshape"))
        context = int(_number(path, line, row, "kv_cache_size", optional=True) or 0)
        chunk = int(_number(path, line, row, "prefill_chunk_size", optional=True) or 0)
        out.append(AttentionRow(
            is_prefill=prefill, batch=_number(path, line, row, "batch_size", integer=True),
            new_tokens=chunk if prefill else 1, context=context,
            kv_bytes_per_token=2 * max(kv // tp, 1) * head_dim * dtype_bytes,
            flops_per_pair=4 * (q // tp) * head_dim,
            token_bytes=2 * (q // tp) * head_dim * dtype_bytes, seconds=(kernel + extra) * MS))
    return out


# ----------------------------------------------------------------------------- all-reduce, CPU

@dataclass(frozen=True)
class AllReduceRow:
    workers: int
    bytes: int
    seconds: float


def read_all_reduce_csv(path: str | Path, dtype_bytes: int = 2) -> list[AllReduceRow]:
    """NCCL all-reduce rows with every worker on one node (`devices_per_node == num_workers`);
    `size` counts fp16 elements per worker."""
    path = Path(path)
    _, rows = _rows(path, ("num_workers", "size", "devices_per_node", _median_column("all_reduce")))
    out = []
    for line, row in rows:
        workers = _number(path, line, row, "num_workers", integer=True)
        if _number(path, line, row, "devices_per_node", integer=True) != workers:
            continue
        out.append(AllReduceRow(workers, _number(path, line, row, "size", integer=True, rule=BYTES_INT) * dtype_bytes,
                                _number(path, line, row, _median_column("all_reduce")) * MS))
    return out


@dataclass(frozen=True)
class CpuOverheadRow:
    model: str
    batch: int
    tp: int
    seconds: float  # schedule + prepare inputs + sampler + process outputs, per step


CPU_PARTS = ("schedule_median", "prepare_inputs_e2e_median", "sampler_e2e_median", "process_model_outputs_median")


def read_cpu_overheads_csv(path: str | Path) -> list[CpuOverheadRow]:
    path = Path(path)
    _, rows = _rows(path, CPU_PARTS + ("model_name", "batch_size", "tensor_parallel_degree"))
    return [CpuOverheadRow(row["model_name"], _number(path, line, row, "batch_size", integer=True),
                           _number(path, line, row, "tensor_parallel_degree", integer=True),
                           sum(_number(path, line, row, c) for c in CPU_PARTS) * MS)
            for line, row in rows]

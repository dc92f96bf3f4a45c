"""Fitting the `calibrated` cost model's terms to measured GPU timings (numpy).

`fit_gpu(data_dir, "a100")` reads the measurement files of one GPU (pagesim.sim.cost.measurements)
and returns a `Calibration` (pagesim.sim.cost.calibrated, which documents each term). Every fit
minimizes relative error (a 10 us kernel matters as much as a 3 ms one) with non-negative
coefficients (pagesim.sim.cost.lsq). `exclude_models` leaves models out, for cross-validation.

The GEMM curve is not linear in its parameters; for a fixed sharpness p and floor it is:
(t - floor)^p = s_per_byte^p bytes^p + s_per_flop^p flops^p. So p and the floor are chosen on a
grid (the pair with the smallest mean squared relative error on the real curve), the two slopes by
non-negative least squares at each grid point; the M tile (64 or 128 rows) is chosen the same way.
Deterministic, no optimizer to converge.

`pagesim calibrate fit` writes the shipped coefficients with `write_calibrations`; a test refits
them from the shared data and checks they are reproduced.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pagesim.sim.cost.calibrated import scale_calibration
from pagesim.sim.cost.calibration import (
    ELEMENTWISE_KIND, GEMM_OPERATORS, AttentionTerms, Calibration, CpuTerms, GemmCurve, Line,
)
from pagesim.sim.cost.layer_ops import ELEMENTWISE_OPERATORS
from pagesim.sim.cost.lsq import fit_relative
from pagesim.sim.cost.measurements import (
    DATA_GPUS, AttentionRow, OperatorRow, model_name, operator_files, read_all_reduce_csv, read_attention_csv,
    read_cpu_overheads_csv, read_operator_csv,
)
from pagesim.sim.specs import get_gpu

GEMM_SHARPNESS_GRID = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
GEMM_FLOOR_GRID_S = tuple(i * 0.5e-6 for i in range(17))  # 0 .. 8 us
GEMM_TILE_GRID = (64, 128)  # M-granularity of the tensor-core kernels (Ampere 64/128, Hopper 128 rows)
# Where each GPU's non-compute measurements come from (see gpu_profiles/README.md).
ATTENTION_FILE = "attention/a100_attention.csv"       # measured on A100 (80 GB, Vidur's "a100")
ATTENTION_GPU = "a100-80gb"
CPU_FILE = "cpu_overheads/a100_cpu_overheads.csv"
ALL_REDUCE_FILES = {"a100-80gb": "network/a100_dgx/all_reduce.csv", "h100-80gb": "network/h100_dgx/all_reduce.csv"}
ALL_REDUCE_SCALED_FROM = {"a40-48gb": "a100-80gb"}   # no A40 network file: by interconnect bandwidth


def fit_gemm(m, k, n, seconds, tiles: tuple[int, ...] = GEMM_TILE_GRID) -> GemmCurve:
    """The smooth-roofline GEMM curve through (M, K, N, seconds) samples."""
    m, k, n, t = (np.asarray(a, dtype=float) for a in (m, k, n, seconds))
    x_bytes = 2 * (k * n + m * (k + n))
    best = None
    for tile in tiles:
        x_flops = 2 * np.ceil(m / tile) * tile * k * n
        for p in GEMM_SHARPNESS_GRID:
            xb, xf = x_bytes ** p, x_flops ** p
            for floor in GEMM_FLOOR_GRID_S:
                if floor >= t.min():
                    break
                coef = fit_relative(np.stack([xb, xf], axis=1), (t - floor) ** p)
                pred = floor + (coef[0] * xb + coef[1] * xf) ** (1.0 / p)
                score = float(np.mean((pred / t - 1.0) ** 2))
                if best is None or score < best[0]:
                    best = (score, GemmCurve(float(floor), float(coef[0] ** (1 / p)), float(coef[1] ** (1 / p)), p, tile))
    return best[1]


def fit_line(x, seconds) -> Line:
    coef = fit_relative(np.stack([np.ones(len(x)), np.asarray(x, dtype=float)], axis=1), np.asarray(seconds, float))
    return Line(float(coef[0]), float(coef[1]))


def fit_operators(rows: list[OperatorRow]) -> tuple[GemmCurve, dict[str, Line]]:
    """One GEMM curve over every GEMM sample, one line per elementwise kernel kind."""
    gm, gk, gn, gt = [], [], [], []
    by_kind: dict[str, tuple[list, list]] = {}
    for r in rows:
        for op in GEMM_OPERATORS:
            if op in r.seconds:
                k, n = r.shape.gemm_dims(op)
                gm.append(r.num_tokens), gk.append(k), gn.append(n), gt.append(r.seconds[op])
        for op in ELEMENTWISE_OPERATORS + ("emb",):
            if op in r.seconds:
                xs, ts = by_kind.setdefault(ELEMENTWISE_KIND[op], ([], []))
                xs.append(r.shape.elementwise_bytes(op, r.num_tokens)), ts.append(r.seconds[op])
    return fit_gemm(gm, gk, gn, gt), {kind: fit_line(xs, ts) for kind, (xs, ts) in sorted(by_kind.items())}


def fit_attention(rows: list[AttentionRow]) -> AttentionTerms:
    dec = [r for r in rows if not r.is_prefill]
    pre = [r for r in rows if r.is_prefill]
    d = fit_relative([[1.0, r.batch, r.batch * r.context * r.kv_bytes_per_token] for r in dec], [r.seconds for r in dec])
    pairs = [r.new_tokens * r.context + r.new_tokens * (r.new_tokens + 1) // 2 for r in pre]
    p = fit_relative([[1.0, pr * r.flops_per_pair, r.new_tokens * r.token_bytes] for pr, r in zip(pairs, pre)],
                     [r.seconds for r in pre])
    return AttentionTerms(*map(float, d), *map(float, p))


def fit_all_reduce(path: Path) -> dict[int, Line]:
    rows = read_all_reduce_csv(path)
    out = {}
    for w in sorted({r.workers for r in rows}):
        sel = [r for r in rows if r.workers == w]
        out[w] = fit_line([r.bytes for r in sel], [r.seconds for r in sel])
    return out


def fit_cpu(path: Path) -> CpuTerms:
    rows = read_cpu_overheads_csv(path)
    c = fit_relative([[1.0, r.batch, 1.0 if r.tp > 1 else 0.0] for r in rows], [r.seconds for r in rows])
    return CpuTerms(*map(float, c))


def load_operator_rows(data_dir: str | Path, gpu_dir: str) -> dict[str, list[OperatorRow]]:
    """model name (org/model) -> its rows, for one GPU directory of the data."""
    return {model_name(f): read_operator_csv(f) for f in operator_files(data_dir, gpu_dir)}


def fit_gpu(data_dir: str | Path, gpu_dir: str, exclude_models: tuple[str, ...] = (),
            operator_rows: dict[str, list[OperatorRow]] | None = None) -> Calibration:
    """Calibration of one measured GPU (`a100`, `h100`, `a40`), leaving `exclude_models` out."""
    data_dir = Path(data_dir)
    gpu = DATA_GPUS[gpu_dir]
    per_model = operator_rows if operator_rows is not None else load_operator_rows(data_dir, gpu_dir)
    used = sorted(m for m in per_model if m not in exclude_models)
    gemm, elementwise = fit_operators([r for m in used for r in per_model[m]])
    attention = fit_attention(read_attention_csv(data_dir / ATTENTION_FILE))
    if gpu in ALL_REDUCE_FILES:
        all_reduce = fit_all_reduce(data_dir / ALL_REDUCE_FILES[gpu])
    else:
        base = ALL_REDUCE_SCALED_FROM[gpu]
        all_reduce = scale_calibration(
            Calibration(base, gemm, {}, attention, fit_all_reduce(data_dir / ALL_REDUCE_FILES[base]), CpuTerms(0, 0, 0)),
            get_gpu(base), get_gpu(gpu)).all_reduce
    if gpu != ATTENTION_GPU:  # the attention file is A100's: carried over by the stated rule
        attention = scale_calibration(
            Calibration(ATTENTION_GPU, gemm, {}, attention, {}, CpuTerms(0, 0, 0)),
            get_gpu(ATTENTION_GPU), get_gpu(gpu)).attention
    source = {
        "data": "Vidur GPU profiles (MIT), ../shared/data/gpu_profiles",
        "operators": [f"compute/{gpu_dir}/{m}/mlp.csv" for m in used],
        "attention": ATTENTION_FILE + ("" if gpu == ATTENTION_GPU else f" (scaled from {ATTENTION_GPU} by bandwidth "
                                                                       "and FLOP/s)"),
        "all_reduce": ALL_REDUCE_FILES.get(gpu, f"{ALL_REDUCE_FILES.get(ALL_REDUCE_SCALED_FROM.get(gpu, ''), '')} "
                                                f"(scaled by interconnect bandwidth)"),
        "cpu": CPU_FILE,
    }
    return Calibration(gpu, gemm, elementwise, attention, all_reduce, fit_cpu(data_dir / CPU_FILE), source)


def calibration_json(cal: Calibration) -> str:
    """The shipped file's text: rounded to 6 significant digits, so a refit reproduces it exactly
    despite last-bit differences between numpy builds."""
    def rounded(v):
        if isinstance(v, float):
            return float(f"{v:.6g}")
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in v.items()}
        if isinstance(v, list):
            return [rounded(x) for x in v]
        return v

    return json.dumps(rounded(cal.to_json()), indent=2, sort_keys=True) + "\n"


def write_calibrations(data_dir: str | Path, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for gpu_dir, gpu in DATA_GPUS.items():
        path = out_dir / f"{gpu}.json"
        path.write_text(calibration_json(fit_gpu(data_dir, gpu_dir)))
        written.append(path)
    return written

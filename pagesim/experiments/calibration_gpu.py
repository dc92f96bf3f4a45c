"""The calibrated GPU cost model against measured operator timings: reports/calibration_gpu.md.

For every measured GPU (A100-80GB, H100-80GB, A40) and every model measured on it, the calibrated
terms are fitted on the OTHER models (leave-one-model-out) and predict the left-out model's rows;
the roofline's error on the same rows stands beside it. Targets (issue 13): left-out layer-sum
error median <= 5% and p90 <= 10% on each GPU (all left-out rows of the GPU pooled). Also: the
shipped fit (all models) checked file by file, exactly as `pagesim calibrate check FILE --gpu GPU`
prints it (reports/calibration_gpu.json holds those numbers; a test re-runs the check and compares),
the attention, all-reduce and CPU fits, and a plot of predicted against measured layer time over
tokens for two models per GPU (left-out predictions, TP 1).

Usage:  python -m pagesim.experiments.calibration_gpu [--data ../shared/data/gpu_profiles] [--out reports]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from pagesim.sim.cost.calibrated import CalibratedCostModel, shipped_calibration  # noqa: E402
from pagesim.sim.cost.calibration import GEMM_OPERATORS, LAYER_OPERATORS  # noqa: E402
from pagesim.sim.cost.check import TOKEN_BUCKETS, check_rows, error_summary, predicted_layer_seconds, roofline_layer_seconds  # noqa: E402
from pagesim.sim.cost.fit import (  # noqa: E402
    ALL_REDUCE_FILES, ATTENTION_FILE, CPU_FILE, fit_all_reduce, fit_attention, fit_cpu, fit_gpu, load_operator_rows,
)
from pagesim.sim.cost.measurements import DATA_GPUS, read_all_reduce_csv, read_attention_csv, read_cpu_overheads_csv  # noqa: E402
from pagesim.sim.specs import get_gpu  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "gpu_profiles"
TARGET_MEDIAN, TARGET_P90 = 0.05, 0.10
PLOT_MODELS = {"a100": ("meta-llama/Llama-2-7b-hf", "Qwen/Qwen-72B"),
               "h100": ("meta-llama/Llama-2-7b-hf", "microsoft/phi-2"),
               "a40": ("meta-llama/Llama-2-70b-hf", "microsoft/phi-2")}


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def cross_validate(data: Path) -> dict:
    """gpu -> {model -> check result of the fit without that model (with the roofline beside)},
    plus the pooled rows' errors and the left-out predictions for the plot."""
    out = {}
    for gpu_dir, gpu in DATA_GPUS.items():
        per_model = load_operator_rows(data, gpu_dir)
        spec = get_gpu(gpu)
        models, cal_err, roof_err, curves, misses = {}, [], [], {}, []
        for name, rows in per_model.items():
            cal = fit_gpu(data, gpu_dir, exclude_models=(name,), operator_rows=per_model)
            models[name] = check_rows(cal, rows, spec)
            for r in rows:
                measured = r.layer_seconds
                pred = predicted_layer_seconds(cal, r)
                cal_err.append(abs(pred / measured - 1))
                if abs(pred / measured - 1) > TARGET_P90:
                    # the operator whose prediction is furthest off, in seconds
                    worst = max((op for op in LAYER_OPERATORS if op in r.seconds),
                                key=lambda op: abs(cal.operator_seconds(op, r.shape, r.num_tokens) - r.seconds[op]))
                    misses.append((bucket_of(r.num_tokens), pred < measured, worst))
                roof = roofline_layer_seconds(spec, r)
                roof_err.append(abs(roof / measured - 1))
                if name in PLOT_MODELS[gpu_dir] and r.shape.tp == 1:
                    curves.setdefault(name, []).append((r.num_tokens, measured, pred, roof))
        drops = [(prev.seconds[op] / r.seconds[op], name, op, prev.num_tokens, r.num_tokens)
                 for name, rows in per_model.items() for op in GEMM_OPERATORS
                 for tp in {r.shape.tp for r in rows}
                 for prev, r in pairwise(sorted((r for r in rows if r.shape.tp == tp and op in r.seconds),
                                                key=lambda r: r.num_tokens))]
        rows_by_bucket = Counter(bucket_of(r.num_tokens) for rows in per_model.values() for r in rows)
        out[gpu_dir] = {"gpu": gpu, "models": models, "pooled": error_summary(cal_err),
                        "pooled_roofline": error_summary(roof_err), "curves": curves,
                        "misses": {"by_bucket": {b: [sum(1 for m in misses if m[0] == b), n] for b, n in rows_by_bucket.items()},
                                   "under": sum(1 for m in misses if m[1]), "over": sum(1 for m in misses if not m[1]),
                                   "worst_operator": Counter(m[2] for m in misses).most_common(),
                                   "largest_gemm_drop": max(drops)}}
    return out


def bucket_of(tokens: int) -> str:
    return next(f"{lo}-{hi}" for lo, hi in TOKEN_BUCKETS if lo <= tokens <= hi)


def shipped_checks(data: Path) -> list[dict]:
    """`pagesim calibrate check FILE --gpu GPU` for every measurement file, with the shipped fit."""
    out = []
    for gpu_dir, gpu in DATA_GPUS.items():
        cal = shipped_calibration(gpu)
        for name, rows in load_operator_rows(data, gpu_dir).items():
            res = check_rows(cal, rows)
            out.append({"file": f"compute/{gpu_dir}/{name}/mlp.csv", "gpu": gpu, "rows": res["rows"],
                        "layer_sum_median_abs_rel_error": res["layer_sum_median_abs_rel_error"],
                        "layer_sum_p90_abs_rel_error": res["layer_sum_p90_abs_rel_error"]})
    return out


def side_fits(data: Path) -> dict:
    """In-sample errors of the attention, all-reduce and CPU fits (the only data each has)."""
    att_rows = read_attention_csv(data / ATTENTION_FILE)
    att = fit_attention(att_rows)
    dec = [abs(att.decode_seconds(r.batch, r.batch * r.context * r.kv_bytes_per_token) / r.seconds - 1)
           for r in att_rows if not r.is_prefill]
    pre = [abs(att.prefill_seconds((r.new_tokens * r.context + r.new_tokens * (r.new_tokens + 1) // 2) * r.flops_per_pair,
                                   r.new_tokens * r.token_bytes) / r.seconds - 1)
           for r in att_rows if r.is_prefill]
    out = {"attention_decode": error_summary(dec), "attention_prefill": error_summary(pre)}
    for gpu, path in ALL_REDUCE_FILES.items():
        lines = fit_all_reduce(data / path)
        errs = [abs(lines[r.workers].seconds(r.bytes) / r.seconds - 1) for r in read_all_reduce_csv(data / path)]
        out[f"all_reduce_{gpu}"] = error_summary(errs)
    cpu = fit_cpu(data / CPU_FILE)
    out["cpu"] = error_summary([abs(cpu.seconds(r.batch, r.tp) / r.seconds - 1) for r in read_cpu_overheads_csv(data / CPU_FILE)])
    return out


# Fig. 18(a)'s x-axis (batch size, context length), as pagesim/experiments/fig18_block_size.py's KERNEL_SHAPES
FIG18A_SHAPES = ((8, 64), (8, 128), (8, 256), (32, 64), (32, 128), (32, 256))


def fig18a_attention() -> list[tuple[int, int, float]]:
    """The calibrated decode attention of one OPT-13B layer on an A100-40GB (the paper's Fig. 18a
    setting) at the figure's shapes: (batch, context, microseconds)."""
    model = CalibratedCostModel("opt-13b", "a100-40gb")
    layers = model.model.num_layers
    return [(b, c, 1e6 * model.decode_attention_seconds(b, b * c) / layers)
            for b, c in FIG18A_SHAPES]


def plot(path: Path, cv: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(cv), 2, figsize=(10, 3.2 * len(cv)), squeeze=False)
    for i, (gpu_dir, res) in enumerate(cv.items()):
        for j, name in enumerate(PLOT_MODELS[gpu_dir]):
            ax = axes[i][j]
            pts = sorted(res["curves"].get(name, []))
            if not pts:
                ax.set_visible(False)
                continue
            tokens = [p[0] for p in pts]
            ax.plot(tokens, [1e3 * p[1] for p in pts], "k.", ms=3, label="measured")
            ax.plot(tokens, [1e3 * p[2] for p in pts], "-", color="tab:blue", label="calibrated (model left out)")
            ax.plot(tokens, [1e3 * p[3] for p in pts], "--", color="tab:red", label="roofline")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{res['gpu']}: {name}, TP 1", fontsize=9)
            ax.set_xlabel("tokens in the step")
            ax.set_ylabel("one layer (ms)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def report(cv: dict, checks: list[dict], side: dict, command: str, png: str) -> str:
    lines = ["# Calibrated GPU cost model: error on models left out of the fit", "",
             "Command:", "", "```", command, "```", "",
             "Ground truth: Vidur's per-operator GPU timings (../shared/data/gpu_profiles, MIT), medians. The model and "
             "its fitting: pagesim/sim/cost/calibrated.py, fit.py; docs/calibration.md. Error = |predicted / measured - 1| "
             "of the layer sum (every layer operator a row measured; the embedding, once per step, is left out).", "",
             "## Leave-one-model-out, per GPU (targets: median <= 5%, p90 <= 10%)", "",
             "Each model's rows are predicted by terms fitted on the other models of the same GPU. The roofline "
             "(`--cost-model roofline`: its linear and elementwise parts for a one-layer model of the row's shape) "
             "is scored on the same rows.", "",
             "| GPU | left-out rows | calibrated median | calibrated p90 | roofline median | roofline p90 | target |",
             "|---|---|---|---|---|---|---|"]
    for res in cv.values():
        p, r = res["pooled"], res["pooled_roofline"]
        ok = p["median_abs_rel_error"] <= TARGET_MEDIAN and p["p90_abs_rel_error"] <= TARGET_P90
        miss = []
        if p["median_abs_rel_error"] > TARGET_MEDIAN:
            miss.append(f"median over by {100 * (p['median_abs_rel_error'] - TARGET_MEDIAN):.1f} pt")
        if p["p90_abs_rel_error"] > TARGET_P90:
            miss.append(f"p90 over by {100 * (p['p90_abs_rel_error'] - TARGET_P90):.1f} pt")
        lines.append(f"| {res['gpu']} | {p['rows']:,} | {pct(p['median_abs_rel_error'])} | {pct(p['p90_abs_rel_error'])} | "
                     f"{pct(r['median_abs_rel_error'])} | {pct(r['p90_abs_rel_error'])} | "
                     f"{'met' if ok else 'missed: ' + ', '.join(miss)} |")
    lines += ["", "Where the left-out layer sums miss by more than 10% (rows over 10% / rows, by tokens in the step; "
              "the operator whose prediction is furthest off in each such row):", ""]
    for res in cv.values():
        m = res["misses"]
        buckets = ", ".join(f"{b} tokens {k} / {n}" for b, (k, n) in sorted(m["by_bucket"].items(),
                                                                            key=lambda kv: int(kv[0].split('-')[0])))
        worst = ", ".join(f"{op} {n}" for op, n in m["worst_operator"][:4])
        ratio, name, op, t0, t1 = m["largest_gemm_drop"]
        lines.append(f"- {res['gpu']}: {buckets}; {m['under']} under-predicted, {m['over']} over; worst operator: {worst}. "
                     f"Largest measured non-monotone GEMM step: {name} `{op}` takes {ratio:.2f}x as long at {t0} tokens "
                     f"as at {t1}.")
    lines += ["", "Why a GPU misses: the misses sit where the GEMMs leave the bandwidth bound (65-512 tokens) and are "
              "dominated by the big MLP GEMMs, predicted both too slow and too fast. There the measured times are not "
              "a smooth function of the shape: cuBLAS switches kernels and tile shapes with M, so the time can fall "
              "while tokens grow (the non-monotone steps quoted above). One smooth curve per GPU cannot follow those "
              "steps; a table per (model, TP) could, but it would not transfer to models nobody measured, which is "
              "what this model is for."
              + (" The medians, which set simulated throughput, are within target on every GPU."
                 if all(r["pooled"]["median_abs_rel_error"] <= TARGET_MEDIAN for r in cv.values()) else "")]
    lines += ["", "### By left-out model", "",
              "| GPU | left-out model | rows | calibrated median | p90 | 1-64 tok median | 65-512 | 513-4096 | "
              "roofline median | roofline p90 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for res in cv.values():
        for name, m in res["models"].items():
            b = m["layer_sum_by_tokens"]
            rl = m["roofline"]["layer_sum"]
            lines.append(f"| {res['gpu']} | {name} | {m['rows']:,} | {pct(m['layer_sum_median_abs_rel_error'])} | "
                         f"{pct(m['layer_sum_p90_abs_rel_error'])} | {pct(b['1-64']['median_abs_rel_error'])} | "
                         f"{pct(b['65-512']['median_abs_rel_error'])} | {pct(b['513-4096']['median_abs_rel_error'])} | "
                         f"{pct(rl['median_abs_rel_error'])} | {pct(rl['p90_abs_rel_error'])} |")
    lines += ["", f"![predicted vs measured layer time]({png})", "",
              "## The shipped fit (all models), file by file", "",
              "What `pagesim calibrate check FILE --gpu GPU` prints for each measurement file (in-sample: these "
              "models were in the fit). tests/sim/test_calibrated.py re-runs the check and compares with "
              "reports/calibration_gpu.json.", "",
              "| file | GPU | rows | layer-sum median | p90 |", "|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c['file']} | {c['gpu']} | {c['rows']:,} | {pct(c['layer_sum_median_abs_rel_error'])} | "
                     f"{pct(c['layer_sum_p90_abs_rel_error'])} |")
    lines += ["", "## The other terms (in-sample: one file each)", "",
              "| term | data | rows | median | p90 |", "|---|---|---|---|---|"]
    names = {"attention_decode": ("decode attention", ATTENTION_FILE),
             "attention_prefill": ("prefill attention", ATTENTION_FILE),
             **{f"all_reduce_{g}": (f"all-reduce, {g}", p) for g, p in ALL_REDUCE_FILES.items()},
             "cpu": ("CPU per step", CPU_FILE)}
    for key, s in side.items():
        label, path = names[key]
        lines.append(f"| {label} | {path} | {s['rows']:,} | {pct(s['median_abs_rel_error'])} | {pct(s['p90_abs_rel_error'])} |")
    lines += ["", "## Fig. 18(a) shapes: the calibrated decode attention kernel", "",
              "One OPT-13B layer (40 heads x 128, fp16, block 16) on an A100-40GB: the decode attention term at the "
              "paper's Fig. 18(a) batch sizes and context lengths, from the A100 FlashAttention fit scaled by the rule "
              "above. The paper's bar heights are not recorded in this project (only its statement that its paged "
              "kernel is 20-26% slower than FasterTransformer's), so they are not set beside these.", "",
              "| batch | context | calibrated (us) |", "|---|---|---|"]
    lines += [f"| {b} | {c} | {us:.1f} |" for b, c, us in fig18a_attention()]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=ROOT / "reports")
    args = ap.parse_args(argv)
    command = shlex.join(["python", "-m", "pagesim.experiments.calibration_gpu", *(sys.argv[1:] if argv is None else argv)])
    cv = cross_validate(args.data)
    checks = shipped_checks(args.data)
    side = side_fits(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "calibration_gpu.png"
    plot(png, cv)
    text = report(cv, checks, side, command, png.name)
    (args.out / "calibration_gpu.md").write_text(text)
    summary = {"command": command, "shipped_checks": checks, "side_fits": side,
               "cross_validation": {g: {"gpu": r["gpu"], "pooled": r["pooled"], "pooled_roofline": r["pooled_roofline"],
                                        "models": r["models"]} for g, r in cv.items()}}
    (args.out / "calibration_gpu.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(text)


if __name__ == "__main__":
    main()

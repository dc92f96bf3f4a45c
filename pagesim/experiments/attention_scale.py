"""reports/sim2real_attention.md: how the H100 runs' errors move with the decode attention's time
scale alone, the one engine parameter whose share of a step grows with context.

    python -m pagesim.experiments.attention_scale [--data DIR] [--out reports] [--scales 0.836,1.0,1.2,1.35]

Every shared H100 run (../shared/data/real_vllm, read in place) is validated under the shipped
vllm-0.15 profile with only `attention_time_scale` changed (the other fitted parameters as
shipped). Beside the errors: the replay's mean decode batch and context per sequence over its
decode-only steps, which say how much of a step the attention is. This is a diagnostic, not a
fit: no parameter is chosen here (reports/sim2real.md holds the fitted profile's held-out errors).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pagesim.experiments.sim2real import ANALYSIS_MARK, DATA, _mean_abs, _pct, errors_row, shared_runs, write_profile

REPORT_MARK = ANALYSIS_MARK.replace("sim2real.py", "attention_scale.py")


def decode_shape(validation) -> tuple[float, float]:
    """Mean sequences and mean context tokens per sequence (whole blocks, unshared) over the replay's decode-only steps."""
    steps = [s for s in validation.replay.metrics.steps if s.num_prefill_tokens == 0 and s.num_decode_seqs]
    if not steps:
        return 0.0, 0.0
    block_size = validation.config.block_size
    seqs = sum(s.num_decode_seqs for s in steps) / len(steps)
    context = sum(s.kv_blocks_logical * block_size / s.num_decode_seqs for s in steps) / len(steps)
    return seqs, context


def main(argv=None) -> Path:
    from pagesim.realruns import load_real_run
    from pagesim.sim.cost.engine import load_engine_profile
    from pagesim.validate import kept_up, validate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=Path("reports"))
    ap.add_argument("--scales", default=None, help="comma-separated attention_time_scale values (default: the "
                    "shipped one, 1.0, 1.2, 1.35)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    base = load_engine_profile("vllm-0.15")
    shipped = base.params.attention_time_scale
    scales = [float(s) for s in args.scales.split(",")] if args.scales else [shipped, 1.0, 1.2, 1.35]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for scale in scales:
            path = Path(tmp) / f"attention-{scale:g}.json"
            write_profile(path, replace(base, name=f"vllm-0.15-attention-{scale:g}",
                                        params=replace(base.params, attention_time_scale=scale)), [])
            engines[scale] = str(path)
        for run_path in shared_runs(args.data)["h100"]:
            real = load_real_run(run_path)
            row = {"run": real.name, "kept_up": kept_up(real), "by_scale": {}}
            for scale in scales:
                v = validate(real, gpu="h100-80gb", engine=engines[scale])
                row["by_scale"][scale] = errors_row(v)
                if scale == shipped or "shape" not in row:
                    row["shape"] = decode_shape(v)
                    row["model"], row["tp"] = Path(v.config.model).parent.name or v.config.model, v.config.tp
            print(f"{real.name}: " + ", ".join(f"{s:g}: E2E {_pct(row['by_scale'][s]['e2e_mean'])}" for s in scales),
                  flush=True)
            rows.append(row)
    return write_report(rows, scales, shipped, args, argv, time.perf_counter() - started)


def write_report(rows, scales, shipped, args, argv, seconds) -> Path:
    report = args.out / "sim2real_attention.md"
    analysis = ""
    if report.exists() and REPORT_MARK in report.read_text():
        analysis = report.read_text().split(REPORT_MARK, 1)[1]
    head = "| run | model (TP) | server kept up | decode batch | context / seq | " + " | ".join(
        f"E2E / TTFT / ITL at {s:g}{' (shipped)' if s == shipped else ''}" for s in scales) + " |"
    lines = [
        "# Decode attention's time scale against the H100 runs",
        "",
        f"Made by `python -m pagesim.experiments.attention_scale{''.join(' ' + a for a in (argv if argv is not None else sys.argv[1:]))}` "
        f"in {seconds:.0f} s. Each run validated under the shipped vllm-0.15 profile with only "
        "`attention_time_scale` changed; errors signed (predicted / measured - 1) over the requests that succeeded. "
        "Decode batch and context per sequence: the replay's means over its decode-only steps (shipped scale). "
        "A diagnostic, not a fit: the shipped profile's held-out errors are in reports/sim2real.md.",
        "",
        head,
        "|" + "---|" * (5 + len(scales)),
    ]
    for r in rows:
        seqs, context = r["shape"]
        cells = [" / ".join(_pct(r["by_scale"][s][m]) for m in ("e2e_mean", "ttft_mean", "itl_mean")) for s in scales]
        lines.append(f"| {r['run']} | {r['model']} ({r['tp']}) | {'yes' if r['kept_up'] else 'no'} | {seqs:.0f} | "
                     f"{context:,.0f} | " + " | ".join(cells) + " |")
    for label, group in (("kept up", [r for r in rows if r["kept_up"]]), ("overloaded", [r for r in rows if not r["kept_up"]]),
                         ("all", rows)):
        cells = []
        for s in scales:
            flat = [{"e": r["by_scale"][s]} for r in group]
            cells.append(" / ".join(_pct(_mean_abs(flat, "e", m)).lstrip("+") for m in ("e2e_mean", "ttft_mean", "itl_mean")))
        lines.append(f"| **mean abs, {label}** ({len(group)}) | | | | | " + " | ".join(cells) + " |")
    lines += ["", REPORT_MARK + (analysis or "\n\n(analysis to be written)\n")]
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines))
    print(f"wrote {report}")
    return report


if __name__ == "__main__":
    main()

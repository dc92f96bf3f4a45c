#!/usr/bin/env python
"""Fig. 11: input and output length distributions of the ShareGPT and Alpaca traces.

    python -m pagesim.experiments.fig11_lengths [--smoke] [--full] [--out-dir reports/figures]

Writes fig11_lengths.{png,csv,md}. The .csv holds the histograms (trace, kind, bin_lo, bin_hi,
count, share); the .md compares the means with the paper's. For ShareGPT the paper's means are
over the whole filtered pool (input + output <= 2048), which the trace's metadata records; our
10,000-request trace is a seeded sample of that pool, compared within 3 standard errors. --smoke
uses the first 200 requests of each trace; --full changes nothing (the traces are small).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from pagesim.experiments.figures import (Row, trace_file, base_parser, command_line, pyplot, save_figure, start_figure, within,
                                 write_csv, write_report)
from pagesim.experiments.paper import FIG11_MEANS

from pagesim.workload.trace import load_trace

STEM = "fig11_lengths"
CSV_COLUMNS = ["trace", "kind", "bin_lo", "bin_hi", "count", "share"]
BINS = {"sharegpt": (32, 2048), "alpaca": (8, 640)}  # bin width, upper edge (tokens)
TITLES = {"sharegpt": "(a) ShareGPT", "alpaca": "(b) Alpaca"}
SMOKE_REQUESTS = 200
SE_TOLERANCE = 3.0  # sample means: within this many standard errors of the paper's mean
ROUNDING = 0.005  # pool means: the paper prints two decimals


def histogram(values: list[int], width: int, upper: int) -> list[tuple[int, int, int]]:
    counts = [0] * math.ceil(upper / width)
    for v in values:
        counts[min(v // width, len(counts) - 1)] += 1
    return [(i * width, (i + 1) * width, c) for i, c in enumerate(counts)]


def mean_rows(name: str, trace, lens: dict) -> list[Row]:
    paper = FIG11_MEANS[name]
    meta = trace.metadata
    rows = []
    pool = meta.get("pool")
    if pool:  # the paper's population: the filtered pool the trace samples
        for kind in ("prompt_len", "output_len"):
            ours = pool[kind]["mean"]
            p = getattr(paper, kind)
            ok = within(ours, p, abs_=ROUNDING)
            rows.append(Row(f"{name} mean {kind} (filtered pool, {pool[kind]['count']:,} pairs)", p, ours,
                            f"+-{ROUNDING} (paper's rounding)", ok,
                            "" if ok else "pool filter differs from the paper's", paper.source))
    n = len(lens["prompt_len"])
    explanation = (meta.get("paper") or {}).get("explanation", "")
    for kind in ("prompt_len", "output_len"):
        values = lens[kind]
        ours = statistics.fmean(values)
        se = statistics.stdev(values) / math.sqrt(n) if n > 1 else float("inf")
        p = getattr(paper, kind)
        ok = within(ours, p, abs_=SE_TOLERANCE * se)
        if ok:
            reason = f"SE {se:.2f}"
        elif n < 1000:
            reason = f"only {n} requests (smoke run); SE {se:.2f}"
        elif explanation:
            reason = f"SE {se:.2f}. {explanation}"
        else:
            reason = f"SE {se:.2f}; the sample differs from the paper's population"
        rows.append(Row(f"{name} mean {kind} (our trace, {n:,} requests)", p, ours,
                        f"+-{SE_TOLERANCE:g} SE = +-{SE_TOLERANCE * se:.2f}", ok, reason, paper.source))
    return rows


def plot(path: Path, hists: dict, means: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, name in zip(axes, ("sharegpt", "alpaca")):
        paper = FIG11_MEANS[name]
        for kind, color, label in (("prompt_len", "tab:blue", "Input"), ("output_len", "tab:orange", "Output")):
            bins = hists[name][kind]
            total = sum(c for _, _, c in bins) or 1
            width = bins[0][1] - bins[0][0]
            ax.bar([lo for lo, _, _ in bins], [c / total / width for _, _, c in bins], width=width, align="edge",
                   alpha=0.55, color=color,
                   label=f"{label} (mean: ours {means[name][kind]:.2f}, paper {getattr(paper, kind):.2f})")
        ax.set_title(TITLES[name])
        ax.set_xlabel("# Tokens")
        ax.set_ylabel("Density")
        ax.set_xlim(0, 2000 if name == "sharegpt" else 200)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict:
    args, timer, files = start_figure(base_parser(__doc__.splitlines()[0]), argv, STEM)
    rows, csv_rows, hists, means, lines = [], [], {}, {}, []
    for name in ("sharegpt", "alpaca"):
        trace = load_trace(trace_file(name))
        reqs = trace.requests[:SMOKE_REQUESTS] if args.smoke else trace.requests
        lens = {"prompt_len": [r.prompt_len for r in reqs], "output_len": [r.output_len for r in reqs]}
        width, upper = BINS[name]
        hists[name] = {k: histogram(v, width, upper) for k, v in lens.items()}
        means[name] = {k: statistics.fmean(v) for k, v in lens.items()}
        for kind, bins in hists[name].items():
            total = sum(c for _, _, c in bins)
            csv_rows += [{"trace": name, "kind": kind, "bin_lo": lo, "bin_hi": hi, "count": c, "share": f"{c / total:.6f}"}
                         for lo, hi, c in bins]
        rows += mean_rows(name, trace, lens)
        lines.append(f"- {name}: {len(reqs):,} requests from traces/{name}.json; "
                     f"medians input {statistics.median(lens['prompt_len']):g}, output {statistics.median(lens['output_len']):g}; "
                     f"max input {max(lens['prompt_len'])}, output {max(lens['output_len'])}.")
    write_csv(files["csv"], CSV_COLUMNS, csv_rows)
    plot(files["png"], hists, means)
    notes = "\n".join(lines + [
        f"- Histograms: bins of {BINS['sharegpt'][0]} tokens (ShareGPT) and {BINS['alpaca'][0]} (Alpaca); "
        "the last bin holds everything above its lower edge. Lengths are OPT tokens.",
        "- ShareGPT: the paper's means are over all pairs with input + output <= 2048; the trace metadata records "
        "that pool's means, and the trace is a seeded 10,000-request sample of it.",
        "- Alpaca: our trace is a 5,000-record sample of the 52K records (see the trace metadata).",
        f"- Run time: {timer.elapsed():.1f} s.",
    ])
    write_report(files["md"], "Fig. 11: input/output length distributions", command_line(__file__, argv), rows,
                 [("Notes", notes)])
    return {"rows": rows, "files": files}


if __name__ == "__main__":
    main()

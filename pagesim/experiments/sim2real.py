"""reports/sim2real.md: how well pagesim predicts real vLLM servers, on runs each fit did not see.

    python -m pagesim.experiments.sim2real [--data DIR] [--out reports] [--quick]

For every shared real run (../shared/data/real_vllm, read in place, never copied):
- H100-80GB, vLLM 0.15.1 (9 runs): the vllm-0.15 engine profile is fitted (pagesim.engine_fit, as
  `pagesim calibrate engine` does) on the runs whose server kept up (no client timeouts), leaving
  each of them out in turn; the overloaded runs, never in any fit, are predicted by the fit on all
  of them. Each held-out profile is written beside the report.
- RTX PRO 6000 (3 runs, vLLM 0.19): the vllm-0.19 profile (the H100 fit's parameters) on a GPU
  without operator measurements (its kernel terms scaled through the specs).
- A100-80GB, DistServe's early-2024 vLLM (8 runs): the paper-era engine.
Beside each: the paper-era engine and the roofline on the same run. Then the published errors
of other simulators, a figure of predicted against measured per-request E2E for 4 runs, and the
analysis (written by hand below the generated tables, kept when the script reruns).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import json
import os
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PAGESIM_DATA_DIR", ROOT.parent / "shared" / "data")) / "real_vllm"
# Published errors on the same H100 runs (inference-sim/sim-to-real-accuracy-validation, the BLIS
# team's study, as quoted in pagesim issue 23): mean |error| of the mean E2E.
PUBLISHED = [("BLIS (trained physics)", "6.6-8.7 %"), ("LLMServingSim", "21.5 %"), ("llm-optimizer", "22.3 %"),
             ("AIConfigurator", "53.1 %"), ("Vidur", "619 %")]
PUBLISHED_BEST = "over that study's 38 experiments the best median error is E2E 6.8 %, TTFT 18.4 %, ITL 6.5 %"
ANALYSIS_MARK = "<!-- analysis: hand-written, kept by pagesim/experiments/sim2real.py -->"
METRICS = ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90", "itl_mean")


def llmservingsim_published(run_dirs) -> list[str]:
    """LLMServingSim's own predictions of its runs (validation/summary.txt: 'Metric vLLM Sim Diff%')."""
    out = []
    for d in run_dirs:
        path = Path(d) / "validation" / "summary.txt"
        if not path.exists():
            continue
        diffs = {}
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "Mean" and parts[0] in ("TTFT", "TPOT", "Latency"):
                diffs[parts[0]] = parts[-1]
        if diffs:
            out.append(f"{Path(d).name}: E2E {diffs.get('Latency', '-')}, TTFT {diffs.get('TTFT', '-')}, "
                       f"TPOT {diffs.get('TPOT', '-')}")
    return out


def shared_runs(data: Path) -> dict[str, list[Path]]:
    blis = sorted((data / "blis-h100-vllm0.15" / "replay_data").glob("*.json.gz"))
    return {"h100": [p for p in blis if not p.name.endswith("_ground_truth.json.gz")],
            "rtx": sorted(p.parent.parent for p in (data / "llmservingsim-vllm0.19").glob("*/*/vllm/requests.jsonl")),
            "a100": sorted((data / "distserve-a100").rglob("*.exp"))}


def errors_row(validation) -> dict:
    return {m: validation.overall.get(m, {}).get("error") for m in METRICS}


def run_group(paths, gpu, engine_for_run, baselines=True, progress=print):
    """validate() each run under its engine, and under the paper engine and the roofline."""
    from pagesim.realruns import load_real_run
    from pagesim.validate import validate

    rows = []
    for path in paths:
        real = load_real_run(path)
        started = time.perf_counter()
        main = validate(real, gpu=gpu, engine=engine_for_run(real))
        row = {"run": real.name, "model": main.config.model, "tp": main.config.tp, "gpu": main.config.gpu,
               "engine": main.config.engine, "counts": main.counts, "pagesim": errors_row(main),
               "validation": main, "seconds": time.perf_counter() - started}
        if baselines:
            row["paper"] = errors_row(validate(real, gpu=gpu, engine="paper"))
            row["roofline"] = errors_row(validate(real, gpu=gpu, cost_model="roofline"))
        progress(f"{real.name}: E2E {_pct(row['pagesim']['e2e_mean'])} TTFT {_pct(row['pagesim']['ttft_mean'])} "
                 f"ITL {_pct(row['pagesim']['itl_mean'])} ({row['seconds']:.1f} s)")
        rows.append(row)
    return rows


def saved_fit(paths, out_dir: Path):
    """The profiles a previous run of this script wrote (--reuse-fit), as fit_h100 returns them."""
    from pagesim.realruns import load_real_run
    from pagesim.sim.cost.engine import load_engine_profile

    profiles = out_dir / "profiles"
    full = load_engine_profile(str(profiles / "all-stable.json"))
    engines = {}
    for p in paths:
        name = load_real_run(p).name
        fold = profiles / f"without-{name}.json"
        engines[name] = str(fold if fold.exists() else profiles / "all-stable.json")
    return engines, full, list(full.provenance["runs"])


def fit_h100(paths, out_dir: Path, progress=print, max_iterations: int = 4, refine: int = 1):
    """The H100 fit: leave-one-run-out over the runs without client timeouts; profiles written."""
    from pagesim.engine_fit import fit_engine
    from pagesim.realruns import load_real_run
    from pagesim.sim.cost.engine import load_engine_profile
    from pagesim.validate import fit_run, kept_up, leave_one_out

    base = load_engine_profile("vllm-0.15")
    runs = [load_real_run(p) for p in paths]
    stable = [r for r in runs if kept_up(r)]
    fit_runs = [fit_run(r, gpu="h100-80gb", engine="vllm-0.15") for r in stable]
    full = fit_engine(fit_runs, base, max_iterations=max_iterations, progress=progress)
    profiles = out_dir / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    write_profile(profiles / "all-stable.json", replace(base, name="vllm-0.15-all-stable", params=full.params),
                  [r.name for r in stable])
    loo = leave_one_out(fit_runs, base, full.params, refine=refine,
                        progress=lambda name, entry: progress(f"fold without {name}: {entry['params']}"))
    engines = {}
    for r in runs:
        if r.name in loo:
            params = loo[r.name]["params"]
            path = profiles / f"without-{r.name}.json"
            from pagesim.sim.cost.engine import EngineParams
            write_profile(path, replace(base, name=f"vllm-0.15-without-{r.name}", params=EngineParams(**params)),
                          [s.name for s in stable if s.name != r.name])
            engines[r.name] = str(path)
        else:
            engines[r.name] = str(profiles / "all-stable.json")
    return engines, full, [r.name for r in stable]


def fit_distserve(paths, out_dir: Path, progress=print):
    """An eager engine (no CUDA graphs, tokens delivered at their own step) fitted to DistServe's
    runs, leave one run out; each fold's profile written."""
    from pagesim.engine_fit import fit_engine
    from pagesim.realruns import load_real_run
    from pagesim.sim.cost.engine import EngineParams, EngineProfile
    from pagesim.validate import fit_run, leave_one_out

    base = EngineProfile("distserve-2024", "DistServe's early-2024 vLLM fork (eager, Ray workers)", cuda_graphs=False,
                         output_delay_steps=0)
    runs = [load_real_run(p) for p in paths]
    fit_runs = [fit_run(r, gpu="a100-80gb", engine=_write_base(base, out_dir)) for r in runs]
    full = fit_engine(fit_runs, base, progress=progress)
    loo = leave_one_out(fit_runs, base, full.params)
    engines = {}
    for r in runs:
        path = out_dir / "profiles" / f"distserve-without-{r.name}.json"
        write_profile(path, replace(base, name=f"distserve-2024-without-{r.name}",
                                    params=EngineParams(**loo[r.name]["params"])), [s.name for s in runs if s is not r])
        engines[r.name] = str(path)
    return engines


def _write_base(profile, out_dir: Path) -> str:
    path = out_dir / "profiles" / f"{profile.name}-start.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_profile(path, profile, [])
    return str(path)


def write_profile(path: Path, profile, runs: list[str]) -> None:
    data = profile.to_json()
    data["provenance"] = {"fitted_by": "pagesim/experiments/sim2real.py (pagesim.engine_fit)", "runs": runs}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %"


def _mean_abs(rows, key, metric):
    values = [abs(r[key][metric]) for r in rows if r.get(key) and r[key].get(metric) is not None]
    return sum(values) / len(values) if values else None


def scatter(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = rows[:4]
    fig, axes = plt.subplots(1, len(picks), figsize=(4.2 * len(picks), 4.0))
    for ax, row in zip(axes if len(picks) > 1 else [axes], picks):
        v = row["validation"]
        records = {r.request_id: r for r in v.replay.metrics.requests if r.status == "finished"}
        xs, ys = [], []
        for i, r in enumerate(v.run.requests):
            if r.ok and i in records:
                xs.append(r.e2e_s)
                ys.append(records[i].e2e_latency)
        ax.scatter(xs, ys, s=2, alpha=0.3)
        top = max(max(xs), max(ys))
        ax.plot([0, top], [0, top], color="black", linewidth=0.8)
        ax.set_title(short_name(row["run"]), fontsize=8)
        ax.set_xlabel("measured E2E (s)")
        ax.set_ylabel("predicted E2E (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def short_name(run: str) -> str:
    """A run's name without the campaign's date and time prefix (20260217-155451-), where it has one."""
    return re.sub(r"^\d{8}-\d{6}-", "", run)


def gap_pairs(validation) -> list[tuple[object, float]]:
    """Each compared request with a gap between output tokens in both runs: (the real request,
    the replay's mean gap, (E2E - TTFT) / (tokens - 1), in seconds), in the real run's order."""
    records = {r.request_id: r for r in validation.replay.metrics.requests if r.status == "finished"}
    pairs = []
    for r in validation.run.requests:
        rec = records.get(r.index)
        if r.itl_s is None or rec is None or rec.total_output_len < 2:
            continue
        pairs.append((r, (rec.e2e_latency - rec.ttft) / (rec.total_output_len - 1)))
    return pairs


def drift(validation, parts: int = 10) -> list[tuple[float, float, int]]:
    """Per tenth of a run by arrival: (measured / predicted mean gap between output tokens,
    the measured gap in ms, the requests the real server held at the tenth's first arrival)."""
    pairs = sorted((r.arrival_s, r.itl_s, predicted) for r, predicted in gap_pairs(validation))
    size = len(pairs) // parts
    out = []
    for k in range(parts if size else 0):
        chunk = pairs[k * size:(k + 1) * size]
        real, predicted = sum(p[1] for p in chunk), sum(p[2] for p in chunk)
        out.append((real / predicted, 1000 * real / len(chunk), validation.run.held_at(chunk[0][0])))
    return out


# requests held, the bins' edges: 128 is the running slots; the bins below it give the excess before a
# queue forms, the base the held requests add to
HELD_BINS = (64, 96, 128, 200, 300, 500, 800, 1200)


def excess_by_held(validation, samples: int = 9) -> dict[tuple[int, int], tuple[int, float, float]]:
    """The compared requests binned by how many requests the real server held, on average over
    `samples` moments across each one's decode (first token to last): per bin (low, high), the
    count and the measured and predicted mean gap between output tokens in ms."""
    pairs = gap_pairs(validation)
    spans = [(r.arrival_s + r.ttft_s, r.arrival_s + r.e2e_s) for r, _ in pairs]  # first and last token
    moments = [first + (last - first) * k / (samples - 1) for first, last in spans for k in range(samples)]
    counts = validation.run.held_counts(moments)
    bins: dict[tuple[int, int], list] = {}
    for i, (r, predicted) in enumerate(pairs):
        held = sum(counts[i * samples:(i + 1) * samples]) / samples
        for low, high in zip(HELD_BINS, HELD_BINS[1:]):
            if low <= held < high:
                bins.setdefault((low, high), []).append((r.itl_s, predicted))
    return {b: (len(v), 1000 * sum(x for x, _ in v) / len(v), 1000 * sum(y for _, y in v) / len(v))
            for b, v in sorted(bins.items()) if len(v) >= 10}


def excess_table(rows) -> list[str]:
    """Measured less predicted gap (ms) by the requests held, for the runs that held more than
    their running slots."""
    from pagesim.validate import running_slots

    bins = list(zip(HELD_BINS, HELD_BINS[1:]))
    lines = ["| run | " + " | ".join(f"{lo:,}-{hi:,} held" for lo, hi in bins) + " |", "|---|" + "---|" * len(bins)]
    for r in rows:
        v = r["validation"]
        if v.run.peak_held()[0] <= running_slots(v.run, v.config):
            continue
        cells = excess_by_held(v)
        lines.append(f"| {short_name(r['run'])} | " + " | ".join(
            "-" if b not in cells else f"{cells[b][1] - cells[b][2]:+.1f} ({cells[b][0]:,})" for b in bins) + " |")
    return lines


def drift_table(rows) -> list[str]:
    lines = ["| run | " + " | ".join(f"{k + 1}" for k in range(10)) + " |", "|---|" + "---|" * 10]
    for r in rows:
        cells = [f"{ratio:.2f} ({held})" for ratio, _, held in drift(r["validation"])]
        lines.append(f"| {short_name(r['run'])} | " + " | ".join(cells) + " |")
    return lines


def table(rows, keys=("pagesim", "paper", "roofline")) -> list[str]:
    head = "| run | model (TP) | compared | " + " | ".join(
        f"{k} E2E / TTFT / ITL" for k in keys) + " | pagesim E2E p90 / TTFT p90 |"
    lines = [head, "|" + "---|" * (4 + len(keys))]
    for r in rows:
        cells = []
        for k in keys:
            e = r.get(k)
            cells.append("-" if not e else f"{_pct(e['e2e_mean'])} / {_pct(e['ttft_mean'])} / {_pct(e['itl_mean'])}")
        p = r["pagesim"]
        model = str(r["model"])
        model = Path(model).parent.name if model.endswith("config.json") else model.rsplit("/", 1)[-1]
        lines.append(f"| {r['run']} | {model} ({r['tp']}) | "
                     f"{r['counts']['compared']:,} | " + " | ".join(cells) + f" | {_pct(p['e2e_p90'])} / {_pct(p['ttft_p90'])} |")
    lines.append("| **mean abs** | | | " + " | ".join(
        " / ".join(_pct(_mean_abs(rows, k, m)).replace("+", "") for m in ("e2e_mean", "ttft_mean", "itl_mean"))
        for k in keys) + " | |")
    return lines


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument("--quick", action="store_true", help="no baselines, one fit iteration (a smoke run)")
    parser.add_argument("--reuse-fit", action="store_true", help="take the fitted profiles a previous run wrote under "
                        "OUT/sim2real/profiles (the validations only)")
    parser.add_argument("--refine", type=int, default=1, help="re-solves of each leave-one-out fold on its own "
                        "training runs (each replays them; 0: the fold's solve is linearised at the full fit)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    groups = shared_runs(args.data)
    out_dir = args.out / "sim2real"
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.reuse_fit:
        engines, full, stable = saved_fit(groups["h100"], out_dir)
    else:
        engines, full, stable = fit_h100(groups["h100"], out_dir, max_iterations=1 if args.quick else 4,
                                         refine=0 if args.quick else args.refine)
    h100 = run_group(groups["h100"], "h100-80gb", lambda real: engines[real.name], baselines=not args.quick)
    # the vllm-0.19 profile ships the H100 fit's parameters (no v0.19 run on a GPU with operator data)
    rtx = run_group(groups["rtx"], "rtx-pro-6000-96gb", lambda real: str(out_dir / "profiles" / "all-stable.json"),
                    baselines=not args.quick)
    a100 = run_group(groups["a100"], "a100-80gb", lambda real: "paper", baselines=False)
    # the same runs with an eager engine profile fitted to them (`pagesim calibrate engine`'s use:
    # a cluster of one's own), each run predicted by the fit on the other seven
    a100_engines = fit_distserve(groups["a100"], out_dir)
    a100_fit = run_group(groups["a100"], "a100-80gb", lambda real: a100_engines[real.name], baselines=False)
    scatter(h100, out_dir / "e2e_scatter.png")
    with open(out_dir / "errors.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "run", "system"] + list(METRICS))
        for group, rows in (("h100", h100), ("rtx", rtx), ("a100", a100), ("a100-fitted", a100_fit)):
            for r in rows:
                for key in ("pagesim", "paper", "roofline"):
                    if r.get(key):
                        w.writerow([group, r["run"], key] + [r[key][m] for m in METRICS])
    report = args.out / "sim2real.md"
    analysis = ""
    if report.exists() and ANALYSIS_MARK in report.read_text():
        analysis = report.read_text().split(ANALYSIS_MARK, 1)[1]
    lines = [
        "# pagesim against real vLLM servers",
        "",
        f"Made by `python -m pagesim.experiments.sim2real{''.join(' ' + a for a in (argv if argv is not None else sys.argv[1:]))}` "
        f"in {time.perf_counter() - started:.0f} s"
        + (" (the validations only: the H100 fits are those a run without `--reuse-fit` wrote under "
           "sim2real/profiles)" if args.reuse_fit else "") + ". Errors are signed "
        "(predicted / measured - 1) over the requests that succeeded in the real run and finished in the replay. "
        "ITL is the token-weighted mean gap; TTFT and E2E are per-request means and p90s.",
        "",
        "## H100-80GB, vLLM 0.15.1: each run's error with a profile fitted without it",
        "",
        f"Fit set (runs whose server kept up, no client timeouts): {', '.join(stable)}. Each of them is predicted by "
        "the profile fitted on the others; the overloaded runs (client timeouts at 300 s) were in no fit and are "
        "predicted by the fit on all of the fit set. `paper` is the eager 2023-24 engine the operator measurements "
        "describe, `roofline` the datasheet roofline, both with the same scheduler and settings.",
        "",
        *table(h100),
        "",
        "Fitted on all of the fit set (the shipped `vllm-0.15` profile): `"
        + json.dumps({k: float(f"{v:.4g}") for k, v in vars(full.params).items()}) + "`",
        "",
        "Published on the same campaign: " + "; ".join(f"{n} {e}" for n, e in PUBLISHED) + f" ({PUBLISHED_BEST}).",
        "",
        "![predicted against measured E2E](sim2real/e2e_scatter.png)",
        "",
        "Over time: each run's requests in ten parts by arrival; per part the measured over the predicted mean gap "
        "between output tokens ((E2E - TTFT) / (tokens - 1), the replay under the profile above), and in brackets "
        "the requests the real server held (sent, not finished, not given up) at the part's first arrival.",
        "",
        *drift_table(h100),
        "",
        "By the requests held: the runs whose real server held more requests than its running slots, their compared "
        "requests binned by the requests held on average over each one's decode (9 moments from first to last "
        "token); per bin the measured less the predicted mean gap between output tokens in ms, and in brackets "
        "the requests in it (bins of fewer than 10 left out). The bins under 128 held come before any queue: "
        "the base that the held requests add to.",
        "",
        *excess_table(h100),
        "",
        "## RTX PRO 6000 (no operator measurements), vLLM 0.19: the vllm-0.19 profile, never fitted to these runs",
        "",
        *table(rtx),
        "",
        "LLMServingSim's own predictions of the same runs (its `validation/summary.txt`, from layer profiles measured "
        "on this GPU, casys-kaist/LLMServingSim 5daddb2): " + "; ".join(llmservingsim_published(groups["rtx"])) + ". "
        "pagesim has no measurement of this GPU: its kernel terms are the A100's scaled by the datasheet "
        "(time per byte x1.28, per FLOP x0.62). Its GPUs talk over PCIe without P2P (LLMServingSim's own cluster "
        "file for this machine: 16 GB/s, 20 us), where vLLM runs no custom all-reduce: every all-reduce and the "
        "expert-parallel exchange are NCCL's ring on that link (docs/calibration.md).",
        "",
        "By the requests held, as for the H100 runs above, but with the engine's own clock: these runs recorded each "
        "request's first- and last-token times in the server (requests.jsonl), so the measured gaps between output "
        "tokens carry no client delay (the running slots: 128 per data-parallel rank).",
        "",
        *excess_table(rtx),
        "",
        "## A100-80GB, DistServe's early-2024 vLLM: the paper-era engine, and an engine fitted to these runs",
        "",
        "The paper-era engine as the operator measurements give it (no parameter fitted to these runs):",
        "",
        *table(a100, keys=("pagesim",)),
        "",
        "An eager engine profile (no CUDA graphs, tokens delivered at their own step) fitted by "
        "`pagesim.engine_fit` to these runs, each run predicted by the fit on the other seven "
        "(what `pagesim calibrate engine` does for a cluster of one's own):",
        "",
        *table(a100_fit, keys=("pagesim",)),
        "",
        ANALYSIS_MARK + (analysis or "\n\n(analysis to be written)\n"),
    ]
    report.write_text("\n".join(lines))
    print(f"wrote {report}")
    return report


if __name__ == "__main__":
    main()

"""The page's plots of one or more runs, overlaid in one colour per run: quantities over time from
steps.csv (and waste.csv), and latency distributions from requests.csv. A panel that a run's
files cannot give is left out with a sentence that says why."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.view.charts import (BINS, MAX_RAW_POINTS, color, counts_over_time, distribution, draw_series,
                                 legend_outside, new_figure, over_time, to_svg)
from pagesim.view.runs import Run

WASTE_PARTS = (("token_states", "token states", "#1f77b4"), ("reserved", "reserved, not yet used", "#aec7e8"),
               ("internal_fragmentation", "internal fragmentation", "#ff7f0e"),
               ("external_fragmentation", "external fragmentation", "#d62728"), ("free", "free", "#dddddd"))


@dataclass
class Panel:
    """A titled plot (an <svg> element) with its caption, or, with no plot, why there is none."""

    title: str
    svg: str | None
    note: str = ""


def time_axis_label(runs: list[Run]) -> str:
    clocks = sorted({r.clock for r in runs})
    return f"seconds since the first arrival ({' / '.join(clocks)} time)"


def stepped(runs: list[Run]) -> list[tuple[int, Run]]:
    return [(i, r) for i, r in enumerate(runs) if r.steps and r.steps["time"]]


def sampled(run: Run) -> bool:
    """steps.csv holds one step per second (--steps sampled), not every step."""
    return (run.summary.get("num_steps") or 0) > len(run.steps["time"])


def steps_caption(runs: list[tuple[int, Run]]) -> str:
    parts = []
    for _, r in runs:
        n = len(r.steps["time"])
        if sampled(r):
            parts.append(f"{r.label}: {n:,} of {r.summary['num_steps']:,} steps (steps.csv holds the first step of "
                         "each second: --steps sampled)")
        elif n > MAX_RAW_POINTS:
            parts.append(f"{r.label}: {n:,} steps, drawn as the time-weighted mean over each of {BINS} time bins "
                         "(the shaded band: the bin's least and greatest step)")
        else:
            parts.append(f"{r.label}: {n:,} steps, each drawn")
    return "; ".join(parts) + "."


def time_panels(runs: list[Run]) -> list[Panel]:
    with_steps = stepped(runs)
    missing = [r for r in runs if not (r.steps and r.steps["time"])]
    why = ""
    if missing:
        why = " ".join(f"{r.label}: {_no_steps_reason(r)}" for r in missing)
    if not with_steps:
        return [Panel("Over time", None, f"No step panels: {why}")] + _waste_panels(runs)
    span = max(r.steps["time"][-1] - r.origin for _, r in with_steps)
    caption = steps_caption(with_steps) + (f" Not shown: {why}" if why else "")
    panels = [_lines(with_steps, span, runs, "Batch size", "requests running",
                     [("num_running_requests", "-", "")], caption)]
    if any("kv_utilization" in r.steps for _, r in with_steps):
        panels.append(_lines([(i, r) for i, r in with_steps if "kv_utilization" in r.steps], span, runs,
                             "KV cache use", "share of the KV pool used (%)", [("kv_utilization", "-", "")],
                             "Blocks in use over the pool's blocks, step by step.", scale=100.0))
    queues = [(name, style, word) for name, style, word in (("num_running_requests", "-", "running"),
                                                            ("num_waiting", "--", "waiting"),
                                                            ("num_swapped", ":", "swapped"))]
    panels.append(_lines(with_steps, span, runs, "Queues", "requests", queues,
                         "Running (solid), waiting (dashed) and swapped-out (dotted) requests after each step."))
    panels.append(_events(with_steps, span, runs))
    return panels + _waste_panels(runs)


def _waste_panels(runs: list[Run]) -> list[Panel]:
    panels = [_waste(r) for r in runs if r.waste and r.waste["time"]]
    no_waste = [r.label for r in runs if not (r.waste and r.waste["time"])]
    if no_waste:
        panels.append(Panel("KV cache waste", None, f"No waste samples for {', '.join(no_waste)}: waste.csv is "
                            "written by a replay that samples the KV cache's waste (waste_interval_s in its "
                            "configuration, as the paper's Fig. 2 does)."))
    return panels


def _no_steps_reason(run: Run) -> str:
    if not run.simulated and "num_kv_blocks" in run.summary and run.summary["num_kv_blocks"] is None:
        return "measured over HTTP (pagesim bench), which sees no engine steps."
    below = " (the per-replica steps are under Per replica)" if run.replica_steps else ""
    return f"no steps.csv in its folder{below}; --out writes one unless --steps none."


def _lines(with_steps, span, runs, title, ylabel, columns, caption, scale: float = 1.0) -> Panel:
    """Step columns over time: one colour per run, one line style per column (columns are
    (name, style, word)); the legend names the runs, and the styles where there are several."""
    from matplotlib.lines import Line2D

    fig, (ax,) = new_figure()
    for i, r in with_steps:
        s = r.steps
        for name, style, _ in columns:
            if name in s:
                values = [v * scale if v is not None else None for v in s[name]]
                draw_series(ax, over_time(s["time"], s["duration"], values, r.origin, span), r.label, color(i), style)
    ax.set_xlabel(time_axis_label(runs))
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, span)
    ax.set_ylim(bottom=0)
    handles = [Line2D([], [], color=color(i), lw=1.5) for i, _ in with_steps] if len(with_steps) > 1 else []
    labels = [r.label for _, r in with_steps] if len(with_steps) > 1 else []
    if len(columns) > 1:
        handles += [Line2D([], [], color="#444", ls=style, lw=1.2) for _, style, _ in columns]
        labels += [word for _, _, word in columns]
    if handles:
        legend_outside(ax, handles, labels)
    return Panel(title, to_svg(fig), caption)


def _events(with_steps, span, runs) -> Panel:
    kinds = (("num_preempted", "preempted requests"), ("blocks_swapped_out", "blocks swapped out"),
             ("blocks_swapped_in", "blocks swapped in"))
    totals = {(i, name): sum(v or 0 for v in r.steps.get(name, ())) for i, r in with_steps for name, _ in kinds}
    if not any(totals.values()):
        labels = ", ".join(r.label for _, r in with_steps)
        return Panel("Preemptions and swaps", None, f"No preemption and no swap in {labels}: nothing to plot.")
    shown = [(name, word) for name, word in kinds if any(totals[(i, name)] for i, _ in with_steps)]
    fig, axes = new_figure(height=1.6, rows=len(shown))
    width = None
    for ax, (name, word) in zip(axes, shown):
        for i, r in with_steps:
            if name in r.steps:
                starts, sums, width = counts_over_time(r.steps["time"], r.steps[name], r.origin, span)
                ax.stairs(sums, starts + [starts[-1] + width], color=color(i), label=r.label, lw=1)
        ax.set_ylabel(word.replace(" ", "\n", 1))
        ax.set_xlim(0, span)
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel(time_axis_label(runs))
    if len(with_steps) > 1:
        legend_outside(axes[0])
    total_text = "; ".join(f"{r.label}: " + ", ".join(f"{int(totals[(i, n)]):,} {w}" for n, w in kinds)
                           for i, r in with_steps)
    return Panel("Preemptions and swaps", to_svg(fig),
                 f"Counts in each time bin of {width:.3g} s. Totals: {total_text}.")


def _waste(run: Run) -> Panel:
    import numpy as np

    w = run.waste
    t = np.asarray(w["time"], dtype=float) - run.origin
    parts = [np.asarray([v or 0 for v in w[name]], dtype=float) for name, _, _ in WASTE_PARTS]
    total = np.sum(parts, axis=0)
    total[total == 0] = 1
    fig, (ax,) = new_figure()
    ax.stackplot(t, [p / total * 100 for p in parts], labels=[label for _, label, _ in WASTE_PARTS],
                 colors=[c for _, _, c in WASTE_PARTS], step="pre")
    ax.set_ylim(0, 100)
    ax.set_xlim(0, float(t[-1]) if len(t) else 1)
    ax.set_xlabel(time_axis_label([run]))
    ax.set_ylabel("share of KV slots (%)")
    legend_outside(ax)
    means = ", ".join(f"{label} {np.mean(p / total) * 100:.1f} %" for (_, label, _), p in zip(WASTE_PARTS, parts))
    return Panel(f"KV cache waste: {run.label}", to_svg(fig),
                 f"{len(t):,} samples of the KV pool's slots (waste.csv); mean shares: {means}.")


# ----------------------------------------------------------------------------- latency

def request_latencies(run: Run) -> dict[str, list[float]]:
    """TTFT, TPOT and end-to-end latency of the finished requests, in seconds, from their times."""
    q = run.requests
    out = {"ttft": [], "tpot": [], "e2e": []}
    for status, arrival, first, finish, length in zip(q["status"], q["arrival_time"], q["first_token_time"],
                                                      q["finish_time"], q["output_len"]):
        if status != "finished" or first is None or finish is None:
            continue
        out["ttft"].append(first - arrival)
        out["e2e"].append(finish - arrival)
        if length and length >= 2:
            out["tpot"].append((finish - first) / (length - 1))
    return out


def step_gaps(run: Run) -> tuple[list[float], list[float]]:
    """Inter-token gaps estimated from steps.csv, as (gap, sequences with that gap) pairs. A sequence
    decoded in a step got its last token at the last step that decoded, or, where it was prefilled
    since, at its prefill step (a prefill-only step holds the decoding sequences back: their gap
    spans it). Gaps across a preemption are not seen; with parallel samples a prefill's forks are
    counted as the one sequence it scheduled."""
    s = run.steps
    if "num_decode_seqs" not in s or len(s["time"]) < 2:
        return [], []
    t, decoded = s["time"], s["num_decode_seqs"]
    scheduled = s.get("num_scheduled_seqs") or decoded
    gaps, weights = [], []
    last_decode, prefilled = None, []  # (step, sequences prefilled in it) since the last decoding step
    for k, (d, n) in enumerate(zip(decoded, scheduled)):
        d, n = int(d or 0), int(n or 0)
        if d:
            rest = d
            for j, count in reversed(prefilled):  # (the newest first: an older one may have finished)
                fresh = min(count, rest)
                if fresh:
                    gaps.append(t[k] - t[j])
                    weights.append(fresh)
                    rest -= fresh
            if rest and last_decode is not None:
                gaps.append(t[k] - t[last_decode])
                weights.append(rest)
            last_decode, prefilled = k, []
        if n > d:
            prefilled.append((k, n - d))
    return gaps, weights


def latency_panels(runs: list[Run]) -> list[Panel]:
    with_requests = [(i, r) for i, r in enumerate(runs) if r.requests and r.requests["status"]]
    if not with_requests:
        return [Panel("Latency", None, "No latency panels: no run has a requests.csv with requests in it.")]
    latencies = {i: request_latencies(r) for i, r in with_requests}
    panels = []
    for key, title, what in (("ttft", "Time to first token", "TTFT"),
                             ("tpot", "Time per output token", "TPOT: (finish - first token) / (output - 1)"),
                             ("e2e", "End-to-end latency", "E2E")):
        samples = [(r.label, color(i), latencies[i][key], None) for i, r in with_requests if latencies[i][key]]
        if not samples:
            panels.append(Panel(title, None, f"No {what}: no finished request has one."))
            continue
        unit, factor = ("ms", 1e3) if key == "tpot" else ("s", 1.0)
        scaled = [(label, c, [v * factor for v in values], w) for label, c, values, w in samples]
        counts = "; ".join(f"{r.label}: {len(latencies[i][key]):,} requests" for i, r in with_requests)
        panels.append(Panel(title, distribution(scaled, unit, what.split(":")[0]),
                            f"{what}, over the finished requests of requests.csv ({counts})."))
    panels.append(_itl_panel(runs))
    return panels


def _itl_panel(runs: list[Run]) -> Panel:
    title = "Inter-token latency"
    samples, notes = [], []
    for i, r in enumerate(runs):
        if not (r.steps and r.steps["time"]):
            notes.append(f"{r.label}: no steps.csv, and requests.csv holds no per-token times")
            continue
        if sampled(r):
            notes.append(f"{r.label}: steps.csv holds one step per second (--steps sampled), not the gaps between steps")
            continue
        gaps, weights = step_gaps(r)
        if not gaps:
            notes.append(f"{r.label}: no decode step")
            continue
        samples.append((r.label, color(i), [g * 1e3 for g in gaps], weights))
        mean = sum(g * w for g, w in zip(gaps, weights)) / sum(weights) * 1e3
        stated = r.summary.get("mean_itl_ms")
        notes.append(f"{r.label}: {int(sum(weights)):,} gaps, mean {mean:.2f} ms"
                     + (f" (summary.json's mean ITL over every token's time: {stated:.2f} ms)" if stated else ""))
    text = "; ".join(notes) + "."
    if not samples:
        return Panel(title, None, f"No ITL distribution: {text}")
    return Panel(title, distribution(samples, "ms", "ITL", counted="tokens"),
                 "Gaps between a sequence's tokens, estimated from steps.csv (requests.csv holds no per-token "
                 "times): the time from the step that gave a sequence its last token to the next step that decodes "
                 f"it, counted once per sequence (a gap across a preemption is not seen). {text}")

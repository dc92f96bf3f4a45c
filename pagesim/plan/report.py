"""The plan's report: DIR/report.md (+ DIR/plots/*.png) and DIR/report.html (one self-contained
file: inline CSS, a few lines of inline script that sort the tables, the same plots embedded as
base64 PNG, no external resource), plus DIR/plan.json and DIR/report.csv (every configuration,
raw numbers). Both documents are rendered from one list of blocks so they cannot drift apart.

Configurations whose results are identical (swap and recompute when nothing is preempted, say)
share one table row, one plotted point and one latency curve, which lists the values that varied.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from pagesim.plan.planner import ConfigResult, Plan
from pagesim.plan.report_render import Bullets, Figure, Heading, Link, Para, Table, render_html, render_markdown
from pagesim.plan import report_fleet, report_trust
from pagesim.plan.run import MIN_TAIL_REQUESTS
from pagesim.plan.steady import MIN_WINDOW_SERVICES, NUM_BATCHES
from pagesim.plots import log_axis
from pagesim.sim.cost.paged_blocks import not_modelled_reason

HEADROOM_WARNING = 0.10  # below this spare capacity a recommendation carries a warning
VARIED = ("block_size", "preemption", "max_num_seqs")  # what may differ within one hardware's merged row

# -- formatting helpers -----------------------------------------------------------------------


def _num(v, digits: int = 2, unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{unit}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _slo_value(name: str, v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if name == "goodput" else f"{v:.3g} s" if v >= 0.01 else f"{v * 1000:.3g} ms"


def _config_words(r: ConfigResult) -> str:
    p = r.point
    return f"{p.gpu}, tp {p.tp}, block {p.block_size}, {p.preemption} preemption, max {p.max_num_seqs} seqs"


def _limiting(r: ConfigResult) -> str:
    return ", ".join(r.limiting) if r.limiting else ("none up to the search cap" if r.capped else "-")


def _outcome(r: ConfigResult) -> tuple:
    """Everything the report shows of a result except the settings that may vary within a row."""
    op = r.operating
    return (r.point.gpu, r.point.tp, r.capacity, r.replicas, r.cost_per_hour, r.cost_per_m_output_tokens, r.headroom,
            tuple(sorted(op.values.items())) if op else None, op.stats.get("mean_kv_utilization") if op else None,
            op.preemptions_per_request if op else None, tuple(r.limiting), r.reason, r.capped, r.capacity_low,
            r.capacity_high, r.num_probes)


def merge_identical(results: list[ConfigResult], key=_outcome) -> list[list[ConfigResult]]:
    """Results grouped by identical outcome, in the order of each group's first member."""
    groups: dict[tuple, list[ConfigResult]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    return list(groups.values())


def _values(group: list[ConfigResult], name: str) -> str:
    return ", ".join(str(v) for v in sorted({getattr(r.point, name) for r in group}))


def _group_label(group: list[ConfigResult], plan: Plan) -> str:
    """A curve's or point's legend: the settings that vary across the plan, with every value the
    group holds (b8,16 recompute,swap)."""
    parts = []
    for name, prefix in (("block_size", "b"), ("preemption", ""), ("max_num_seqs", "s")):
        if len({getattr(x.point, name) for x in plan.results}) > 1:
            parts.append(prefix + _values(group, name).replace(", ", ","))
    return " ".join(parts) or "this configuration"


# -- content ----------------------------------------------------------------------------------


def build_blocks(plan: Plan) -> list:
    slo_text = ", ".join(s.describe() for s in plan.slos)
    st, se = plan.settings, plan.search
    trace_what = f"`{plan.trace_path}`" + (f" ({plan.trace_name})" if plan.trace_name else "")
    blocks: list = [
        Heading(1, f"Capacity plan: {plan.model} on {plan.trace_path.rsplit('/', 1)[-1]} at {plan.target_rate:g} req/s"),
        Heading(2, "Inputs"),
        Para(f"Reproduce with: `{plan.command}`"),
        Bullets([
            f"model: `{plan.model}`; trace: {trace_what}, sha256 `{plan.trace_digest[:16]}...`",
            f"target: {plan.target_rate:g} req/s in total; SLOs: {slo_text}; minimum headroom {plan.min_headroom:g}",
            "grid: GPUs " + ", ".join(sorted({r.point.gpu for r in plan.results}))
            + "; tp " + ", ".join(str(t) for t in sorted({r.point.tp for r in plan.results}))
            + "; block size " + ", ".join(str(b) for b in sorted({r.point.block_size for r in plan.results}))
            + "; preemption " + ", ".join(sorted({r.point.preemption for r in plan.results}))
            + "; max_num_seqs " + ", ".join(str(s) for s in sorted({r.point.max_num_seqs for r in plan.results}))
            + f" ({len(plan.results)} configurations)",
            f"each run: max({st.num_requests}, rate x {st.min_duration_s:g} s) Poisson arrivals at the rate under test, "
            f"seed {st.seed} at every rate; "
            f"requests arriving in the first {st.warmup_fraction:g} of the arrival span are left out of the statistics; "
            f"max_num_batched_tokens {st.batched_tokens}, swap space {st.swap_space_gib:g} GiB/GPU, "
            f"cost model `{st.cost_model}`" + (f" (profile `{st.profile}`: every GPU's step times come from this "
                                               "profile, not from the GPU named)" if st.profile else "")
            + f"; a probe runs again with more requests until its steady state is judged, at most "
            f"{st.max_requests_per_probe:,} (Method); {plan.seeds} arrival seed(s) per capacity",
            f"search: from {se.start_rate:g} req/s, x{se.growth:g} to bracket, then geometric bisection to a relative "
            f"tolerance of {se.tolerance:g}; range {se.min_rate:g}-{se.max_rate:g} req/s per replica",
            f"prices: {plan.prices.path}, retrieved {plan.prices.retrieved or '?'}: "
            + ", ".join(f"{g} ${p:.2f}/GPU-h" for g, p in sorted(plan.prices.usd_per_gpu_hour.items())),
        ]),
        Heading(2, "Recommendation"),
    ]
    best, second = plan.recommendation, plan.runner_up
    if best is None:
        blocks += _no_configuration(plan, slo_text)
    else:
        blocks.append(Para(f"**Cheapest meeting the target: {_deployment(best)}.** {_detail(best, plan)}"))
        blocks += _headroom_warning(best, "the recommendation")
        blocks += report_trust.uncertainty_warning(best, "the recommendation")
        if second is not None:
            blocks.append(Para(f"**Runner-up (the cheapest on other hardware): {_deployment(second)}.** "
                               f"{_detail(second, plan)}"))
            blocks += _headroom_warning(second, "the runner-up")
            blocks += report_trust.uncertainty_warning(second, "the runner-up")
        else:
            blocks.append(Para("Runner-up: none (only one configuration meets the SLOs)."))
    unpriced = [r for r in plan.results if r.feasible and r.cost_per_hour is None]
    if unpriced:
        blocks.append(Para("Not ranked (no price for the GPU): " + "; ".join(r.point.label for r in unpriced)))
    blocks += report_trust.longer_blocks(plan)
    blocks += report_fleet.fleet_blocks(plan)
    blocks += [Heading(2, "All configurations"), _all_table(plan)]
    blocks += [Para("capacity: highest sustainable rate of one replica; interval: its uncertainty (seeds and the "
                    "cost model's measured error); probes: rates its search judged; costs: measured on that GPU or "
                    "scaled from another; headroom: spare share of the deployed "
                    "capacity; KV util. and preemptions/request at the operating point (target / replicas per "
                    "replica); limiting: what fails just above the capacity. Configurations with identical results "
                    "share a row, which lists every block size, preemption mode and max seqs it covers. Click a "
                    "column header (in report.html) to sort."),
               Link("Every configuration, one row each, as CSV: report.csv", "report.csv")]
    blocks += [Heading(2, "Cost against latency")]
    blocks += [_pareto_figure(plan)]
    blocks += [Heading(2, "Latency against rate")]
    blocks += [f for f in _latency_figures(plan)]
    blocks += [Heading(2, "Cost against capacity"), _cost_figure(plan)]
    blocks += [Heading(2, "Sensitivity to block size and preemption mode"), _sensitivity_figure(plan),
               _sensitivity_table(plan), Para(_sensitivity_summary(plan))]
    blocks += [Heading(2, "Method"), Bullets([
        "sustainable rate: judged at steady state: every SLO holds over the measured requests, no request is "
        "rejected, and the number of requests in the system does not grow. A pass counts only on a run whose "
        f"measurement window spans at least {MIN_WINDOW_SERVICES:g} mean service times, with at least "
        f"{MIN_TAIL_REQUESTS} measured requests beyond each percentile SLO's rank, and whose queue is flat: the 95% "
        f"t interval of the least-squares slope through {NUM_BATCHES} batch means of the number in the system lies "
        f"below {plan.search.tolerance:g} x the rate; otherwise the probe runs again with more requests (the same seed), "
        f"up to {st.max_requests_per_probe:,}. A failed SLO decides at once (a run starts empty, the most favourable "
        "state); a growing queue (interval above 0, slope above the bound) decides when two runs in a row show it",
        "goodput: the fraction of measured requests meeting every latency threshold individually",
        "recommendation: the cheapest by cost per hour (ties: more headroom, then fewer GPUs); runner-up: the "
        "cheapest on another GPU or tp",
        "replicas = ceil(target / (capacity x (1 - minimum headroom))); headroom = 1 - target / (replicas x capacity)",
        "cost per hour = replicas x tp x price per GPU-hour; cost per million output tokens = cost per hour / "
        "(target x mean output tokens per request x 3600) x 1e6",
        "the simulator replays the paper's vLLM scheduler (FCFS, iteration-level batching, paged KV cache); "
        "latencies come from its cost model, not from measurements on the GPUs",
    ])]
    blocks += report_trust.trust_blocks(plan)
    return blocks


def _deployment(r: ConfigResult) -> str:
    p = r.point
    gpus = f"{r.replicas} x {p.tp} x {p.gpu}" if p.tp > 1 else f"{r.replicas} x {p.gpu}"
    return (f"{gpus} ({r.replicas} replica{'s' if r.replicas != 1 else ''}; block {p.block_size}, "
            f"{p.preemption} preemption, max {p.max_num_seqs} seqs)")


def _headroom_warning(r: ConfigResult, which: str) -> list:
    if r.headroom is None or r.headroom >= HEADROOM_WARNING:
        return []
    return [Para(f"**Warning: {which} keeps only {_pct(r.headroom)} headroom** (below {HEADROOM_WARNING:.0%}): a "
                 f"load {_pct(r.headroom / (1 - r.headroom))} above the target, or a simulator error of that size, "
                 "breaks the SLOs. Plan with `--min-headroom 0.1` (or more) to buy spare capacity.")]


def _detail(r: ConfigResult, plan: Plan) -> str:
    op = r.operating
    vals = ", ".join(f"{k} {_slo_value(k, v)}" for k, v in (op.values.items() if op else []))
    return (f"${r.cost_per_hour:,.2f}/h, ${_num(r.cost_per_m_output_tokens, 3)} per million output tokens; "
            f"capacity {r.capacity:.2f} req/s per replica (limited by {_limiting(r)}; interval "
            f"{report_trust.interval_text(r)}; {report_trust.knee_text(r)}), headroom {_pct(r.headroom)}. "
            f"At the operating point ({plan.target_rate / r.replicas:.2f} req/s per replica): {vals}, "
            f"mean KV utilization {_pct(op.stats.get('mean_kv_utilization') if op else None)}, "
            f"{_num(op.preemptions_per_request if op else None, 3)} preemptions per request."
            + ("" if op is None or op.sustainable else
               f" Note: the operating point itself fails {', '.join(op.violations)} (run-to-run noise below the "
               "capacity): add replicas or headroom."))


def _no_configuration(plan: Plan, slo_text: str) -> list:
    lowest = plan.search.min_rate
    rows = []
    for r in plan.results:
        best = r.best_values()
        rows.append([r.point.label, ", ".join(f"{k} {_slo_value(k, v)}" for k, v in best.items()) or "-",
                     _num(min((p.rate for p in r.points), default=None), 3), r.reason or "-"])
    return [
        Para(f"**No configuration meets {slo_text}** at any rate of at least {lowest:g} req/s per replica, so no "
             f"deployment serves {plan.target_rate:g} req/s within these SLOs. The closest each configuration came "
             "(its values at the lowest rate simulated):"),
        Table(["configuration", "best achieved", "at req/s", "why"], rows),
    ]


def _all_table(plan: Plan) -> Table:
    order = {id(r): i for i, r in enumerate(plan.ranking)}
    results = sorted(plan.results, key=lambda r: (order.get(id(r), len(order)), 0))
    slo_names = [s.name for s in plan.slos]
    headers = ["#", "gpu", "tp", "block", "preemption", "max seqs", "capacity (req/s/replica)", "interval", "probes",
               "costs", "replicas", "GPUs",
               "$/h", "$/M out tok", "headroom", "KV util.", "preempt./req"] + \
              [f"{n} @op" for n in slo_names] + ["limiting"]
    rows, keys = [], []
    for group in merge_identical(results):
        r = group[0]
        p, op = r.point, r.operating
        rank = order.get(id(r))
        ranks = sorted(order[id(x)] + 1 for x in group if id(x) in order)
        kv = op.stats.get("mean_kv_utilization") if op else None
        per_request = op.preemptions_per_request if op else None
        values = [op.values.get(n) if op else None for n in slo_names]
        contiguous = ranks == list(range(ranks[0], ranks[0] + len(ranks))) if ranks else False
        shown_rank = ("-" if not ranks else f"{ranks[0]}-{ranks[-1]}" if contiguous and len(ranks) > 1
                      else ", ".join(map(str, ranks)))
        rows.append([shown_rank, p.gpu, str(p.tp), _values(group, "block_size"),
                     _values(group, "preemption"), _values(group, "max_num_seqs"), _num(r.capacity, 2),
                     "-" if r.capacity_low is None else f"{r.capacity_low:.2f}-{r.capacity_high:.2f}",
                     str(r.num_probes), r.costs,
                     _num(r.replicas, 0), _num(r.num_gpus, 0), _num(r.cost_per_hour, 2),
                     _num(r.cost_per_m_output_tokens, 3), _pct(r.headroom), _pct(kv), _num(per_request, 3)]
                    + [_slo_value(n, v) for n, v in zip(slo_names, values)]
                    + [_limiting(r) if r.feasible else f"infeasible: {r.reason}"])
        keys.append([rank + 1 if rank is not None else None, None, p.tp, None, None, None, r.capacity, r.capacity_low,
                     r.num_probes, None, r.replicas,
                     r.num_gpus, r.cost_per_hour, r.cost_per_m_output_tokens, r.headroom, kv, per_request]
                    + values + [None])
    return Table(headers, rows, keys)


def _sensitivity_table(plan: Plan) -> Table:
    blocks = sorted({r.point.block_size for r in plan.results})
    modes = sorted({r.point.preemption for r in plan.results})
    groups = sorted({(r.point.gpu, r.point.tp, r.point.max_num_seqs) for r in plan.results})
    cap = {(r.point.gpu, r.point.tp, r.point.max_num_seqs, r.point.block_size, r.point.preemption): r.capacity
           for r in plan.results}
    # where block size is not in the step time the row's differences are KV memory's alone (report_trust)
    engine = report_trust.replay_engine_profile(plan)
    priced = lambda g: "yes" if not_modelled_reason(g, plan.settings.cost_model, engine) is None else "no"  # noqa: E731
    headers = ["gpu", "tp", "max seqs"] + [f"b{b} {m}" for b in blocks for m in modes] + ["block size in step time"]
    rows = [[g, str(t), str(s)] + [_num(cap.get((g, t, s, b, m)), 2) for b in blocks for m in modes] + [priced(g)]
            for g, t, s in groups]
    return Table(headers, rows)


def _sensitivity_summary(plan: Plan) -> str:
    """One sentence per hardware group: how far capacity moves across block sizes and modes,
    compared with the search's tolerance (a spread inside it is not a measured difference)."""
    parts = []
    for gpu, tp, seqs in sorted({(r.point.gpu, r.point.tp, r.point.max_num_seqs) for r in plan.results}):
        caps = [r.capacity for r in plan.results if (r.point.gpu, r.point.tp, r.point.max_num_seqs) == (gpu, tp, seqs)
                and r.capacity is not None]
        if len(caps) < 2:
            continue
        spread = max(caps) / min(caps) - 1
        verdict = "within the search tolerance" if spread <= plan.search.tolerance else "more than the search tolerance"
        parts.append(f"{gpu} tp{tp} s{seqs}: {min(caps):.2f}-{max(caps):.2f} req/s ({spread:.1%}, {verdict})")
    if not parts:
        return "Only one block size and preemption mode per hardware was searched (or none met the SLOs)."
    return ("Capacity across block sizes and preemption modes, per hardware: " + "; ".join(parts) + ". With the same "
            "arrivals at every rate (common random numbers), the SLO usually breaks at the same burst, so "
            "configurations whose latencies differ below that point can still share a capacity; the latency "
            "curves above show those differences.")


# -- plots --------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    # No version/date metadata: the same plan gives the same bytes.
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _panels(plan: Plan):
    """(gpu, tp) panels, each with its configurations."""
    keys = sorted({(r.point.gpu, r.point.tp) for r in plan.results})
    return [(k, [r for r in plan.results if (r.point.gpu, r.point.tp) == k]) for k in keys]


def _grid(plt, n: int, width: float = 4.0, height: float = 3.0, max_cols: int = 4):
    cols = min(n, max_cols)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = "os^vD<>p"


def _latency_figures(plan: Plan) -> list[Figure]:
    """One figure per SLO, one panel per (gpu, tp); configurations with the same curve drawn once.
    Panels are wide and get their own y range, and curves differ in marker and line style, so
    close curves stay apart."""
    plt = _pyplot()
    figures = []
    panels = _panels(plan)
    for slo in plan.slos:
        fig, axes = _grid(plt, len(panels), width=5.2, height=3.6, max_cols=2)
        for ax, ((gpu, tp), results) in zip(axes, panels):
            def curve(r):
                return tuple((p.rate, p.values.get(slo.name)) for p in r.points if p.values.get(slo.name) is not None)
            for i, group in enumerate(g for g in merge_identical(results, curve) if curve(g[0])):
                pts = curve(group[0])
                line, = ax.plot([x for x, _ in pts], [y for _, y in pts], marker=MARKERS[i % len(MARKERS)], ms=4,
                                ls=LINE_STYLES[i % len(LINE_STYLES)], lw=1.2, label=_group_label(group, plan))
                if group[0].capacity is not None:
                    ax.axvline(group[0].capacity, color=line.get_color(), lw=0.8, ls=":")
            ax.axhline(slo.threshold, color="red", ls="--", lw=1, label="SLO")
            ax.set_title(f"{gpu} tp{tp}", fontsize=10)
            log_axis(ax.xaxis)
            if slo.is_latency:
                log_axis(ax.yaxis)
            ax.set_xlabel("rate per replica (req/s)", fontsize=9)
            ax.set_ylabel(slo.name + (" (s/token)" if slo.metric == "normalized_latency" else " (s)" if slo.is_latency else ""),
                          fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        fig.suptitle(f"{slo.describe()}: every simulated rate (dotted: capacity)", fontsize=11)
        figures.append(Figure(f"latency_{slo.name}", f"{slo.name} against the offered rate per replica, per "
                              "configuration (dashed: the SLO; dotted: the capacity found; configurations with the "
                              "same curve share one line)", _png(fig)))
    return figures


def _pareto_slo(plan: Plan):
    """The latency SLO the cost/latency plot uses: the first p99 one, else the first latency one."""
    latency = [s for s in plan.slos if s.is_latency]
    return next((s for s in latency if s.stat == "p99"), latency[0] if latency else None)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower is better on each), by
    increasing first coordinate."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def _pareto_figure(plan: Plan) -> Figure:
    plt = _pyplot()
    slo = _pareto_slo(plan)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    plotted = [r for r in plan.results if r.cost_per_hour is not None and r.operating and slo is not None
               and r.operating.values.get(slo.name) is not None]
    # configurations that land on the same spot are one point, labelled with their count
    groups = merge_identical(plotted, lambda r: (r.point.gpu, r.cost_per_hour, r.operating.values[slo.name]))
    points = [(g[0].operating.values[slo.name], g[0].cost_per_hour) for g in groups]
    markers = dict(zip(sorted({r.point.gpu for r in plan.results}), MARKERS))
    for gpu in sorted({g[0].point.gpu for g in groups}):
        mine = [i for i, g in enumerate(groups) if g[0].point.gpu == gpu]
        ax.scatter([points[i][0] for i in mine], [points[i][1] for i in mine], marker=markers[gpu], s=40, label=gpu,
                   alpha=0.8, zorder=3)
    front = pareto_front(points)
    if front:
        xs = [points[i][0] for i in front]
        ys = [points[i][1] for i in front]
        ax.step(xs, ys, where="post", color="0.4", lw=1, ls="--", label="Pareto front", zorder=2)
        for i in front:
            g = groups[i]
            ax.annotate(f"{g[0].point.gpu} x{g[0].replicas * g[0].point.tp}" + (f" ({len(g)} configs)" if len(g) > 1 else ""),
                        points[i], fontsize=7, xytext=(6, 6), textcoords="offset points")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no configuration meets the SLOs", ha="center", va="center", transform=ax.transAxes)
    if slo is not None:
        ax.axvline(slo.threshold, color="red", ls="--", lw=1)
        log_axis(ax.xaxis)  # tail latencies span decades below the SLO
        ax.set_xlabel(f"{slo.name} at the operating point (s, log scale); dashed: the SLO")
    ax.set_ylabel(f"$/h to serve {plan.target_rate:g} req/s")
    ax.grid(True, alpha=0.3)
    ax.set_title("cost against tail latency (configurations on the same spot drawn once)", fontsize=10)
    return Figure("pareto", f"cost per hour against {slo.name if slo else 'latency'} at the operating point; the "
                  "dashed line joins the configurations nothing beats on both", _png(fig))


def _cost_figure(plan: Plan) -> Figure:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = merge_identical([r for r in plan.results if r.cost_per_hour is not None],
                             lambda r: (r.point.gpu, r.capacity, r.cost_per_hour))  # one point per spot
    markers = dict(zip(sorted({r.point.gpu for r in plan.results}), MARKERS))
    for gpu in sorted({g[0].point.gpu for g in groups}):
        gs = [g for g in groups if g[0].point.gpu == gpu]
        ax.scatter([g[0].capacity for g in gs], [g[0].cost_per_hour for g in gs], marker=markers[gpu], label=gpu,
                   alpha=0.8)
        for g in gs:
            if len(g) > 1:  # identical results drawn once
                ax.annotate(f"x{len(g)}", (g[0].capacity, g[0].cost_per_hour), fontsize=6, xytext=(4, -9),
                            textcoords="offset points")
    best, second = plan.recommendation, plan.runner_up
    # the labels sit in the axes' top left corner, a line from each to its point: inside the axes
    # wherever the point is (a label beside a point at the right edge ran off the figure)
    for r, text, corner in ((best, "cheapest", (0.03, 0.95)), (second, "runner-up", (0.03, 0.87))):
        if r is not None:
            ax.annotate(f"{text}: {r.point.label}", (r.capacity, r.cost_per_hour), fontsize=7, xytext=corner,
                        textcoords="axes fraction", ha="left", va="top",
                        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"})
    if not groups:
        ax.text(0.5, 0.5, "no configuration meets the SLOs", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("capacity per replica (req/s)")
    ax.set_ylabel(f"$/h to serve {plan.target_rate:g} req/s")
    ax.set_title("cost against capacity (xN: N configurations on the same spot)", fontsize=10)
    return Figure("cost_capacity", "cost per hour of the deployment serving the target, against one replica's "
                  "capacity", _png(fig))


def _sensitivity_figure(plan: Plan) -> Figure:
    plt = _pyplot()
    groups = sorted({(r.point.gpu, r.point.tp, r.point.max_num_seqs) for r in plan.results})
    blocks = sorted({r.point.block_size for r in plan.results})
    modes = sorted({r.point.preemption for r in plan.results})
    if len(blocks) < 2:  # one point per line: nothing to draw a curve through, so say what was searched
        fig, ax = plt.subplots(figsize=(6, 1.6))
        ax.axis("off")
        ax.text(0.5, 0.5, f"one block size searched ({blocks[0] if blocks else '-'}): no sensitivity to draw.\n"
                "Give --block-size 8,16,32 (and --preemption recompute,swap) to compare them.",
                ha="center", va="center", fontsize=9, transform=ax.transAxes)
        return Figure("sensitivity", "capacity against block size: only one block size was searched", _png(fig))
    fig, axes = _grid(plt, len(groups), 3.6, 2.8)
    for ax, (gpu, tp, seqs) in zip(axes, groups):
        for i, mode in enumerate(modes):
            caps = []
            for b in blocks:
                r = next((r for r in plan.results if (r.point.gpu, r.point.tp, r.point.max_num_seqs,
                                                       r.point.block_size, r.point.preemption) == (gpu, tp, seqs, b, mode)), None)
                caps.append(r.capacity if r is not None and r.capacity is not None else float("nan"))
            # larger hollow markers under smaller filled ones: equal capacities stay visible
            ax.plot([str(b) for b in blocks], caps, marker=MARKERS[i % len(MARKERS)], ms=max(9 - 3 * i, 3),
                    mfc="none" if i == 0 else None, ls=LINE_STYLES[i % len(LINE_STYLES)], label=mode)
        ax.set_title(f"{gpu} tp{tp} s{seqs}", fontsize=9)
        ax.set_xlabel("block size", fontsize=8)
        ax.set_ylabel("capacity (req/s)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle("capacity per replica by block size and preemption mode", fontsize=10)
    return Figure("sensitivity", "capacity per replica against block size, one line per preemption mode", _png(fig))


def figure_names(plan: Plan) -> list[str]:
    return ["pareto"] + [f"latency_{s.name}" for s in plan.slos] + ["cost_capacity", "sensitivity"]


def write_csv(plan: Plan, path: Path) -> None:
    """Every configuration, one row each (identical ones not merged), raw numbers in SI units."""
    slo_names = [s.name for s in plan.slos]
    rank = {id(r): i + 1 for i, r in enumerate(plan.ranking)}
    rows = plan.table()
    columns = ["rank"] + [k for k in rows[0] if k not in ("operating_values", "limiting")] + \
              [f"{n}_at_operating_point" for n in slo_names] + ["limiting"] if rows else ["rank"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for r, row in zip(plan.results, rows):
            values = row.pop("operating_values") or {}
            row.update({f"{n}_at_operating_point": values.get(n) for n in slo_names})
            row["limiting"] = " ".join(row["limiting"])
            row["rank"] = rank.get(id(r))
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def write_report(plan: Plan, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    blocks = build_blocks(plan)
    for b in blocks:
        if isinstance(b, Figure):
            (out / "plots" / f"{b.name}.png").write_bytes(b.png)
    title = next(b.text for b in blocks if isinstance(b, Heading))
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "plan.json", "csv": out / "report.csv"}
    paths["md"].write_text(render_markdown(blocks))
    paths["html"].write_text(render_html(blocks, title))
    write_csv(plan, paths["csv"])
    paths["json"].write_text(json.dumps(plan.to_dict(), indent=1, sort_keys=True) + "\n")
    return paths

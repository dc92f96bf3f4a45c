"""The plan report's plots (PNG bytes, no metadata, so the same plan gives the same bytes) and the
grouping of configurations with identical results, which the plots and the tables share (one
point, one curve, one row per group)."""

from __future__ import annotations

import io

from pagesim.plan.planner import ConfigResult, Plan
from pagesim.plan.report_render import Figure
from pagesim.plots import log_axis

# -- identical results -------------------------------------------------------------------------


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


def settings_values(group: list[ConfigResult], name: str) -> str:
    return ", ".join(str(v) for v in sorted({getattr(r.point, name) for r in group}))


def group_label(group: list[ConfigResult], plan: Plan) -> str:
    """A curve's or point's legend: the settings that vary across the plan, with every value the
    group holds (b8,16 recompute,swap)."""
    parts = []
    for name, prefix in (("block_size", "b"), ("preemption", ""), ("max_num_seqs", "s")):
        if len({getattr(x.point, name) for x in plan.results}) > 1:
            parts.append(prefix + settings_values(group, name).replace(", ", ","))
    return " ".join(parts) or "this configuration"



# -- plots ------------------------------------------------------------------------------------


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


def latency_figures(plan: Plan) -> list[Figure]:
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
                                ls=LINE_STYLES[i % len(LINE_STYLES)], lw=1.2, label=group_label(group, plan))
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


def pareto_figure(plan: Plan) -> Figure:
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


def cost_figure(plan: Plan) -> Figure:
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


def sensitivity_figure(plan: Plan) -> Figure:
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

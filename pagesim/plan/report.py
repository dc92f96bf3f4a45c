"""The plan's report: DIR/report.md (+ DIR/plots/*.png) and DIR/report.html (one self-contained
file: inline CSS, the same plots embedded as base64 PNG, no external resource), plus
DIR/plan.json. Both documents are rendered from one list of blocks so they cannot drift apart.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from pagesim.plan.planner import ConfigResult, Plan
from pagesim.plan.run import KEEP_UP_RATIO

# -- blocks -------------------------------------------------------------------------------------


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str  # may hold **bold** and `code`


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Figure:
    name: str  # file stem under plots/
    caption: str
    png: bytes


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
            f"cost model `{st.cost_model}`" + (f" (profile `{st.profile}`)" if st.profile else ""),
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
        if second is not None:
            blocks.append(Para(f"**Runner-up (the cheapest on other hardware): {_deployment(second)}.** "
                               f"{_detail(second, plan)}"))
        else:
            blocks.append(Para("Runner-up: none (only one configuration meets the SLOs)."))
    unpriced = [r for r in plan.results if r.feasible and r.cost_per_hour is None]
    if unpriced:
        blocks.append(Para("Not ranked (no price for the GPU): " + "; ".join(r.point.label for r in unpriced)))
    blocks += [Heading(2, "All configurations"), _all_table(plan)]
    blocks += [Para("capacity: highest sustainable rate of one replica; headroom: spare share of the deployed "
                    "capacity; KV util. and preemptions/request at the operating point (target / replicas per "
                    "replica); limiting: what fails just above the capacity.")]
    blocks += [Heading(2, "Latency against rate")]
    blocks += [f for f in _latency_figures(plan)]
    blocks += [Heading(2, "Cost against capacity"), _cost_figure(plan)]
    blocks += [Heading(2, "Sensitivity to block size and preemption mode"), _sensitivity_figure(plan),
               _sensitivity_table(plan), Para(_sensitivity_summary(plan))]
    blocks += [Heading(2, "Method"), Bullets([
        "sustainable rate: every SLO holds over the measured requests, no request is rejected, and the replica "
        f"keeps up: the backlog (waiting + swapped requests) when the last request arrives is at most "
        f"{1 - KEEP_UP_RATIO:.0%} of the requests that arrived in the measurement window",
        "goodput: the fraction of measured requests meeting every latency threshold individually",
        "recommendation: the cheapest by cost per hour (ties: more headroom, then fewer GPUs); runner-up: the "
        "cheapest on another GPU or tp",
        "replicas = ceil(target / (capacity x (1 - minimum headroom))); headroom = 1 - target / (replicas x capacity)",
        "cost per hour = replicas x tp x price per GPU-hour; cost per million output tokens = cost per hour / "
        "(target x mean output tokens per request x 3600) x 1e6",
        "the simulator replays the paper's vLLM scheduler (FCFS, iteration-level batching, paged KV cache); "
        "latencies come from its cost model, not from measurements on the GPUs",
    ] + (["the roofline cost model charges block size only through swap and copy traffic (it has no per-block "
          "attention-kernel cost, the effect behind the paper's Fig. 18b), so block size acts here through memory "
          "alone: fragmentation and preemptions"] if st.cost_model == "roofline" else []))]
    return blocks


def _deployment(r: ConfigResult) -> str:
    p = r.point
    gpus = f"{r.replicas} x {p.tp} x {p.gpu}" if p.tp > 1 else f"{r.replicas} x {p.gpu}"
    return (f"{gpus} ({r.replicas} replica{'s' if r.replicas != 1 else ''}; block {p.block_size}, "
            f"{p.preemption} preemption, max {p.max_num_seqs} seqs)")


def _detail(r: ConfigResult, plan: Plan) -> str:
    op = r.operating
    vals = ", ".join(f"{k} {_slo_value(k, v)}" for k, v in (op.values.items() if op else []))
    return (f"${r.cost_per_hour:,.2f}/h, ${_num(r.cost_per_m_output_tokens, 3)} per million output tokens; "
            f"capacity {r.capacity:.2f} req/s per replica (limited by {_limiting(r)}), headroom {_pct(r.headroom)}. "
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
    headers = ["#", "gpu", "tp", "block", "preemption", "max seqs", "capacity (req/s/replica)", "replicas", "GPUs",
               "$/h", "$/M out tok", "headroom", "KV util.", "preempt./req"] + \
              [f"{n} @op" for n in slo_names] + ["limiting"]
    rows = []
    for r in results:
        p, op = r.point, r.operating
        rank = order.get(id(r))
        rows.append([str(rank + 1) if rank is not None else "-", p.gpu, str(p.tp), str(p.block_size), p.preemption,
                     str(p.max_num_seqs), _num(r.capacity, 2), _num(r.replicas, 0), _num(r.num_gpus, 0),
                     _num(r.cost_per_hour, 2), _num(r.cost_per_m_output_tokens, 3), _pct(r.headroom),
                     _pct(op.stats.get("mean_kv_utilization") if op else None),
                     _num(op.preemptions_per_request if op else None, 3)]
                    + [_slo_value(n, op.values.get(n)) if op else "-" for n in slo_names]
                    + [_limiting(r) if r.feasible else f"infeasible: {r.reason}"])
    return Table(headers, rows)


def _sensitivity_table(plan: Plan) -> Table:
    blocks = sorted({r.point.block_size for r in plan.results})
    modes = sorted({r.point.preemption for r in plan.results})
    groups = sorted({(r.point.gpu, r.point.tp, r.point.max_num_seqs) for r in plan.results})
    cap = {(r.point.gpu, r.point.tp, r.point.max_num_seqs, r.point.block_size, r.point.preemption): r.capacity
           for r in plan.results}
    headers = ["gpu", "tp", "max seqs"] + [f"b{b} {m}" for b in blocks for m in modes]
    rows = [[g, str(t), str(s)] + [_num(cap.get((g, t, s, b, m)), 2) for b in blocks for m in modes]
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


def _grid(plt, n: int, width: float = 4.0, height: float = 3.0):
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat


def _line_label(r: ConfigResult, plan: Plan) -> str:
    parts = []
    if len({x.point.block_size for x in plan.results}) > 1:
        parts.append(f"b{r.point.block_size}")
    if len({x.point.preemption for x in plan.results}) > 1:
        parts.append(r.point.preemption)
    if len({x.point.max_num_seqs for x in plan.results}) > 1:
        parts.append(f"s{r.point.max_num_seqs}")
    return " ".join(parts) or "this configuration"


def _latency_figures(plan: Plan) -> list[Figure]:
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter

    figures = []
    panels = _panels(plan)
    for slo in plan.slos:
        fig, axes = _grid(plt, len(panels))
        for ax, ((gpu, tp), results) in zip(axes, panels):
            for r in results:
                pts = [p for p in r.points if p.values.get(slo.name) is not None]
                if pts:
                    line, = ax.plot([p.rate for p in pts], [p.values[slo.name] for p in pts], marker=".",
                                    label=_line_label(r, plan))
                    if r.capacity is not None:
                        ax.axvline(r.capacity, color=line.get_color(), lw=0.8, ls=":")
            ax.axhline(slo.threshold, color="red", ls="--", lw=1, label="SLO")
            ax.set_title(f"{gpu} tp{tp}", fontsize=9)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on short ranges
            if slo.is_latency:
                ax.set_yscale("log")
            ax.set_xlabel("rate per replica (req/s)", fontsize=8)
            ax.set_ylabel(slo.name + (" (s/token)" if slo.metric == "normalized_latency" else " (s)" if slo.is_latency else ""),
                          fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
        fig.suptitle(f"{slo.describe()}: every simulated rate (dotted: capacity)", fontsize=10)
        figures.append(Figure(f"latency_{slo.name}", f"{slo.name} against the offered rate per replica, per "
                              "configuration (dashed: the SLO; dotted: the capacity found)", _png(fig)))
    return figures


def _cost_figure(plan: Plan) -> Figure:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    priced = [r for r in plan.results if r.cost_per_hour is not None]
    markers = dict(zip(sorted({r.point.gpu for r in plan.results}), "osD^v<>p"))
    for gpu in sorted({r.point.gpu for r in priced}):
        rs = [r for r in priced if r.point.gpu == gpu]
        ax.scatter([r.capacity for r in rs], [r.cost_per_hour for r in rs], marker=markers[gpu], label=gpu, alpha=0.8)
    best, second = plan.recommendation, plan.runner_up
    for r, text, offset in ((best, "cheapest", (8, 10)), (second, "runner-up", (8, -18))):
        if r is not None:
            ax.annotate(f"{text}: {r.point.label}", (r.capacity, r.cost_per_hour), fontsize=7,
                        xytext=offset, textcoords="offset points", arrowprops={"arrowstyle": "-", "lw": 0.5})
    if not priced:
        ax.text(0.5, 0.5, "no configuration meets the SLOs", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("capacity per replica (req/s)")
    ax.set_ylabel(f"$/h to serve {plan.target_rate:g} req/s")
    ax.set_title("cost against capacity (one point per configuration)", fontsize=10)
    return Figure("cost_capacity", "cost per hour of the deployment serving the target, against one replica's "
                  "capacity", _png(fig))


def _sensitivity_figure(plan: Plan) -> Figure:
    plt = _pyplot()
    groups = sorted({(r.point.gpu, r.point.tp, r.point.max_num_seqs) for r in plan.results})
    blocks = sorted({r.point.block_size for r in plan.results})
    modes = sorted({r.point.preemption for r in plan.results})
    fig, axes = _grid(plt, len(groups), 3.6, 2.8)
    for ax, (gpu, tp, seqs) in zip(axes, groups):
        for mode in modes:
            caps = []
            for b in blocks:
                r = next((r for r in plan.results if (r.point.gpu, r.point.tp, r.point.max_num_seqs,
                                                       r.point.block_size, r.point.preemption) == (gpu, tp, seqs, b, mode)), None)
                caps.append(r.capacity if r is not None and r.capacity is not None else float("nan"))
            ax.plot([str(b) for b in blocks], caps, marker="o", label=mode)
        ax.set_title(f"{gpu} tp{tp} s{seqs}", fontsize=9)
        ax.set_xlabel("block size", fontsize=8)
        ax.set_ylabel("capacity (req/s)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle("capacity per replica by block size and preemption mode", fontsize=10)
    return Figure("sensitivity", "capacity per replica against block size, one line per preemption mode", _png(fig))


def figure_names(plan: Plan) -> list[str]:
    return [f"latency_{s.name}" for s in plan.slos] + ["cost_capacity", "sensitivity"]


# -- rendering ----------------------------------------------------------------------------------


def render_markdown(blocks: list) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(b.headers) + " |", "|" + "---|" * len(b.headers)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Figure):
            out.append(f"![{b.caption}](plots/{b.name}.png)\n\n*{b.caption}*")
    return "\n\n".join(out) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f0f0f0}td:nth-child(-n+6){text-align:left}code{background:#f4f4f4;padding:1px 3px;font-size:90%}
img{max-width:100%}figure{margin:1em 0}figcaption{font-style:italic;font-size:13px}"""


def _inline(text: str) -> str:
    t = html.escape(text, quote=False)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", t)


def render_html(blocks: list, title: str) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
           f"<style>{_CSS}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            out.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b.headers)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(b, Figure):
            data = base64.b64encode(b.png).decode()
            out.append(f'<figure id="{b.name}"><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(plan: Plan, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    blocks = build_blocks(plan)
    for b in blocks:
        if isinstance(b, Figure):
            (out / "plots" / f"{b.name}.png").write_bytes(b.png)
    title = next(b.text for b in blocks if isinstance(b, Heading))
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "plan.json"}
    paths["md"].write_text(render_markdown(blocks))
    paths["html"].write_text(render_html(blocks, title))
    paths["json"].write_text(json.dumps(plan.to_dict(), indent=1, sort_keys=True) + "\n")
    return paths

"""The plan's report: DIR/report.md (+ DIR/plots/*.png) and DIR/report.html (one self-contained
file: inline CSS, a few lines of inline script that sort the tables, the same plots embedded as
base64 PNG, no external resource), plus DIR/plan.json and DIR/report.csv (every configuration,
raw numbers). Both documents are rendered from one list of blocks so they cannot drift apart.

Configurations whose results are identical (swap and recompute when nothing is preempted, say)
share one table row, one plotted point and one latency curve, which lists the values that varied.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from pagesim.plan.planner import ConfigResult, Plan
from pagesim.plan.report_render import Bullets, Figure, Heading, Link, Para, Table, render_html, render_markdown
from pagesim.plan import report_fleet, report_trust
from pagesim.plan.report_plots import (cost_figure, latency_figures, merge_identical, pareto_figure,
                                       settings_values, sensitivity_figure)
from pagesim.plan.run import MIN_TAIL_REQUESTS
from pagesim.plan.steady import MIN_WINDOW_SERVICES, NUM_BATCHES
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


# violation names as the report says them: "undecided" alone read as a cause ("limited by undecided")
LIMITING_WORDS = {"undecided": "queue trend undecided at the longest probe"}


def _limiting(r: ConfigResult) -> str:
    if not r.limiting:
        return "none up to the search cap" if r.capped else "-"
    return ", ".join(LIMITING_WORDS.get(v, v) for v in r.limiting)



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
            + (f"max_model_len {st.max_model_len}, " if st.max_model_len else "")
            + _step_budget(st, plan) + f", swap space {st.swap_space_gib:g} GiB/GPU, "
            f"cost model `{st.cost_model}`" + (f" (profile `{st.profile}`: every GPU's step times come from this "
                                               "profile, not from the GPU named)" if st.profile else "")
            + f"; a probe is extended to more requests (one replay continued, judged on its first requests) until "
            f"its steady state is judged, at most "
            f"{st.max_requests_per_probe:,} (Method); {plan.seeds} arrival seed(s) per capacity",
            f"search: short scouting probes from {se.start_rate:g} req/s, x{se.growth:g} to bracket, then geometric "
            f"bisection; from the scouted capacity, full probes step towards the knee and bisect to a relative "
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
                    "cost model's measured error); probes: rates its search judged with full steady-state probes "
                    "(after short scouting probes); costs: measured on that GPU or "
                    "scaled from another; headroom: spare share of the deployed "
                    "capacity; KV util. and preemptions/request at the operating point (target / replicas per "
                    "replica); limiting: what fails just above the capacity (a queue trend still undecided at the longest "
                    "probe counts as unsustainable). Configurations with identical results "
                    "share a row, which lists every block size, preemption mode and max seqs it covers. Click a "
                    "column header (in report.html) to sort."),
               Link("Every configuration, one row each, as CSV: report.csv", "report.csv")]
    blocks += [Heading(2, "Cost against latency")]
    blocks += [pareto_figure(plan)]
    blocks += [Heading(2, "Latency against rate")]
    blocks += [f for f in latency_figures(plan)]
    blocks += [Heading(2, "Cost against capacity"), cost_figure(plan)]
    blocks += [Heading(2, "Sensitivity to block size and preemption mode"), sensitivity_figure(plan),
               _sensitivity_table(plan), Para(_sensitivity_summary(plan))]
    blocks += [Heading(2, "Method"), Bullets([
        "sustainable rate: judged at steady state: every SLO holds over the measured requests, no request is "
        "rejected, and the number of requests in the system does not grow. A pass counts only on a run whose "
        f"measurement window spans at least {MIN_WINDOW_SERVICES:g} mean service times, with at least "
        f"{MIN_TAIL_REQUESTS} measured requests beyond each percentile SLO's rank, and whose queue is flat: the 95% "
        f"t interval of the least-squares slope through {NUM_BATCHES} batch means of the number in the system lies "
        f"below {plan.search.tolerance:g} x the rate; otherwise the probe is extended: its replay (the same seed) continues "
        f"and the next checkpoint judges more of its first requests, up to {st.max_requests_per_probe:,}. A failed SLO decides at once (a run starts empty, the most favourable "
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
        rows.append([shown_rank, p.gpu, str(p.tp), settings_values(group, "block_size"),
                     settings_values(group, "preemption"), settings_values(group, "max_num_seqs"), _num(r.capacity, 2),
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


def _step_budget(st, plan) -> str:
    """The runs' prefill mode and step budget (per GPU where it differs: a chunk budget is the GPU's)."""
    budgets = {gpu: st.batched_tokens_on(gpu) for gpu in dict.fromkeys(r.point.gpu for r in plan.results)}
    shown = ", ".join(f"{b:,} on {gpu}" for gpu, b in budgets.items()) if len(set(budgets.values())) > 1 \
        else f"{next(iter(budgets.values()), 0):,}"
    return ("chunked prefill" if st.chunked else "whole prompts") + f", max_num_batched_tokens {shown}"

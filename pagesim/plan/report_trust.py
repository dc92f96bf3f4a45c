"""The plan report's sections on how far to trust it: each capacity's interval and the knee's
bracket, the recommendation replayed on longer runs, where each GPU's costs come from, what is
extrapolated, and where block size enters the step time (and where the cost model leaves it out)."""

from __future__ import annotations

import csv

from pagesim.plan.planner import LONGER_MARGIN, ConfigResult, Plan
from pagesim.plan.report_render import Bullets, Heading, Para, Table
from pagesim.plan.uncertainty import ERRORS_CSV, ERRORS_NAME
from pagesim.sim.cost.engine import load_engine_profile
from pagesim.sim.cost.paged_blocks import PAPER_BLOCK_TERM, SOURCE, not_modelled_reason
from pagesim.sim.engine import ReplayConfig


def _rate(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def interval_text(r: ConfigResult) -> str:
    """'7.10-8.90 req/s (seeds 8.00, 7.90, 8.10; cost model +-9.3 %)'."""
    if r.capacity_low is None:
        return "-"
    seeds = ", ".join(_rate(c) for c in r.seed_capacities)
    model = f"cost model +-{r.model_error:.1%}" if r.model_error is not None else "cost-model error unknown"
    return f"{r.capacity_low:.2f}-{r.capacity_high:.2f} req/s (seeds {seeds}; {model})"


def knee_text(r: ConfigResult) -> str:
    upper = f"{r.knee:.2f}" if r.knee is not None else "above the search cap"
    scouts = f" after {r.num_scouts} short scouting probes" if r.num_scouts else ""
    return f"knee bracketed in [{r.capacity:.2f}, {upper}] req/s by {r.num_probes} full probes{scouts}"


def uncertainty_warning(r: ConfigResult, which: str) -> list:
    if not r.feasible or not r.uncertain_headroom:
        return []
    per_replica = r.capacity * (1 - r.headroom)
    return [Para(f"**Warning: {which}'s headroom ({100 * r.headroom:.1f}%) is inside its uncertainty**: the capacity "
                 f"may be as low as {r.capacity_low:.2f} req/s per replica, below the {per_replica:.2f} req/s each of "
                 f"its {r.replicas} replica(s) would carry. Add a replica or raise `--min-headroom` to "
                 f"{1 - r.capacity_low / r.capacity:.2f} to be covered.")]


def longer_blocks(plan: Plan) -> list:
    best = plan.recommendation
    blocks: list = [Heading(2, "Checked against longer runs")]
    if best is None or best.longer is None:
        reason = "no configuration was recommended" if best is None else "the check was switched off (--check-longer 0)"
        return blocks + [Para(f"Not run: {reason}.")]
    check = best.longer
    slo_names = [s.name for s in plan.slos]
    rows = []
    for what, ev, expect in (("operating point", check.operating, True),
                             (f"capacity + {LONGER_MARGIN:.0%}", check.above, False)):
        values = ", ".join(f"{n} {_value(ev.values.get(n))}" for n in slo_names)
        meets = check.meets(ev)
        verdict = ("meets the SLOs" + (" (steady state undecided at this length)" if ev.violations else "") if meets
                   else "fails: " + ", ".join(ev.violations))
        ok = meets == expect
        rows.append([what, f"{ev.rate:.2f}", f"{ev.num_requests:,}", values, verdict,
                     ("as expected" if ok else "**NOT as expected**")])
    holds = "holds" if check.holds else "**does not hold**"
    return blocks + [
        Para(f"The recommendation ({best.point.label}) replayed with {check.factor:g} x the requests a probe starts "
             f"with (one replica, the same seed and trace): at its operating point it must meet the SLOs, at its "
             f"capacity + {LONGER_MARGIN:.0%} it must not. The check {holds}."),
        Table(["run", "req/s per replica", "requests", "SLO values", "verdict", "expected"], rows),
    ]


def _value(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def trust_blocks(plan: Plan) -> list:
    st = plan.settings
    per_gpu = {}
    for r in plan.results:
        per_gpu.setdefault(r.point.gpu, r)
    items = []
    for gpu, r in sorted(per_gpu.items()):
        error = f"+-{r.model_error:.1%} ({r.model_error_basis})" if r.model_error is not None else r.model_error_basis
        items.append(f"{gpu}: kernel costs {r.costs or 'unknown'}; cost-model error {error or 'unknown'}")
    models = _validated_models()
    extrapolated = [g for g, r in sorted(per_gpu.items()) if r.costs.startswith("scaled")]
    blocks: list = [Heading(2, "How sure these capacities are"), Para(
        f"Each capacity carries an interval: the lowest and highest capacity over {plan.seeds} arrival seeds "
        f"(seed {st.seed} and the next ones, each searched from the first seed's capacity), widened by the cost "
        "model's measured step-time error (a capacity moves about as much as the step time). A recommendation whose "
        "headroom is inside that interval is flagged."), Bullets(items)]
    notes = []
    if extrapolated:
        notes.append("extrapolated beyond the measurements: the kernel costs of " + ", ".join(extrapolated)
                     + " (scaled from another GPU by memory bandwidth and FLOP/s)")
    if models:
        named = any(_in(plan.model, run) for run in models)
        notes.append(f"the cost model's error was measured on {len(models)} real vLLM runs ({ERRORS_NAME}); "
                     f"`{plan.model}` " + ("is among their models" if named else
                                          "is not among their models, so its error is carried over from them"))
    notes += block_size_notes(plan)
    return blocks + [Bullets(notes)]


def replay_engine_profile(plan: Plan) -> str | None:
    """The current-vLLM engine profile the plan's replays run the calibrated kernels under (the
    ReplayConfig default), or None for the paper-era engine (the kernels as measured)."""
    engine = getattr(plan.settings, "engine", ReplayConfig.engine)
    return None if load_engine_profile(engine).measured_eager else engine


def block_size_notes(plan: Plan) -> list[str]:
    """Where block size is in the step time (decode attention's per-block gather and partial last
    block, pagesim/sim/cost/paged_blocks.py) and where it is not, with the reason."""
    gpus = sorted({r.point.gpu for r in plan.results})
    reasons = {g: not_modelled_reason(g, plan.settings.cost_model, replay_engine_profile(plan)) for g in gpus}
    priced = [g for g in gpus if reasons[g] is None]
    notes = []
    if priced:
        notes.append(f"block size on {', '.join(priced)}: decode attention pays a gather per block "
                     f"({PAPER_BLOCK_TERM.gather_slots_per_block:.2f} slot-reads) and the partial last block's empty "
                     f"slots, on top of KV memory and swap/copy traffic; the one parameter is fitted to {SOURCE}")
    for reason in sorted({r for r in reasons.values() if r is not None}):
        named = [g for g in gpus if reasons[g] == reason]
        notes.append(f"block size is not modelled in the step time on {', '.join(named)} ({reason}): it acts only "
                     "through KV memory (fragmentation, preemptions) and swap/copy traffic, and configurations "
                     "differing only in block size can show identical capacities for that reason")
    return notes


def _validated_models() -> list[str]:
    """The real runs (their names) the cost model's error was measured on."""
    try:
        with open(ERRORS_CSV, newline="") as f:
            return sorted({row["run"] for row in csv.DictReader(f) if row.get("system") == "pagesim"})
    except (OSError, KeyError):
        return []


def _in(model: str, runs: str) -> bool:
    return model.lower().replace(".", "-") in runs.lower()

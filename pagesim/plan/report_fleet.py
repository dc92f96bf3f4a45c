"""The plan report's section on fleets sized by simulating the cluster (pagesim.plan.fleet)."""

from __future__ import annotations

from pagesim.plan.fleet import MAX_UNITS_FACTOR
from pagesim.plan.planner import Plan
from pagesim.plan.report_render import Heading, Para, Table


def _signed_usd(v: float) -> str:
    return f"{'-' if v < 0 else '+'}${abs(v):,.2f}"


def _ratio(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _staleness_sentence(values: set[float]) -> str:
    """What the simulated routers saw of the loads, and when (ClusterSpec.staleness_s)."""
    if values == {0.0}:
        return ("The router read the replicas' loads (waiting and running requests, KV usage) at every decision "
                "(--staleness 0).")
    every = " or ".join(f"{v:g} s" for v in sorted(values))
    return (f"The router's view of the replicas' loads (waiting and running requests, KV usage) was refreshed every "
            f"{every} (--staleness), as a router scraping /metrics sees them; its own counts of the requests it sent "
            "stay current.")


def fleet_blocks(plan: Plan) -> list:
    """[] for a plan that sized no fleet."""
    sized = [(r, f) for r in plan.results for f in r.fleet]
    if not sized:
        return []
    blocks: list = [Heading(2, "Fleets simulated as clusters"), Para(
        f"Each feasible configuration's fleet, simulated whole: the router in front of the replicas, the cluster at "
        f"the target {plan.target_rate:g} req/s, judged by the same steady-state probe as one replica (the cluster's "
        "summary as the run's). The search starts at the ideal count, ceil(target / capacity of one replica) as "
        "above (in units of P + D replicas for a P:D ratio), and steps down while one unit fewer still sustains the "
        f"target, or up until one does (at most {MAX_UNITS_FACTOR} x the start). Router cost: (replicas found - "
        "ideal replicas) x tp x price, what the router and the load imbalance cost against perfect balancing; "
        "negative where the cluster does better than independent replicas (round-robin and least-outstanding "
        "smooth Poisson arrivals). Imbalance at the count found: max / mean and coefficient of variation over the "
        "replicas of requests served and of busy time (under P:D within each role, the larger of the two). "
        + _staleness_sentence({f.shape.staleness_s for _, f in sized}))]
    ranking = plan.fleet_ranking
    if ranking:
        r, f = ranking[0]
        blocks.append(Para(f"**Cheapest simulated fleet: {f.shape.counts(f.units)} replica(s) of {r.point.label} "
                           f"behind {f.shape.label}, ${f.cost_per_hour:,.2f}/h** (the ideal: {f.ideal_replicas} "
                           f"replica(s); router cost {_signed_usd(f.router_cost_per_hour)}/h)."))
    else:
        blocks.append(Para("**No simulated fleet sustains the target** (see why in the table)."))
    headers = ["configuration", "fleet", "replicas", "ideal", "extra", "router cost $/h", "$/h", "requests max/mean",
               "requests CV", "busy max/mean", "busy CV", "counts tried", "why not one unit fewer"]
    rows = []
    for r, f in sized:
        imb = f.imbalance
        tried = ", ".join(f"{f.shape.counts(u)} {'ok' if ok else 'fails'}" for u, ok in sorted(f.tried.items()))
        why = (", ".join(f.below.violations) if f.below else "one unit is the least") if f.replicas else (f.reason or "")
        rows.append([r.point.label, f.shape.label, f.shape.counts(f.units) if f.units else "-", str(f.ideal_replicas),
                     f"{f.extra_replicas:+d}" if f.replicas else "-",
                     f"{f.router_cost_per_hour:+,.2f}" if f.router_cost_per_hour is not None else "-",
                     f"{f.cost_per_hour:,.2f}" if f.cost_per_hour is not None else "-",
                     _ratio(imb.get("requests_max_over_mean")), _ratio(imb.get("requests_cv")),
                     _ratio(imb.get("busy_max_over_mean")), _ratio(imb.get("busy_cv")), tried, why])
    blocks.append(Table(headers, rows))
    return blocks

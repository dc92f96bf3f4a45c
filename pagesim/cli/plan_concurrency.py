"""`pagesim plan --target-concurrency U`: capacity in closed-loop clients per configuration
(pagesim.plan.concurrency), the replicas and cost to serve U concurrent clients, the cheapest."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path


REQUESTS_PER_CLIENT = 5  # a run holds at least this many requests per client (else its clients barely cycle)


def plan_closed_loop(loaded, trace: Path, grid, settings, slos, target: int, price_table, out: Path, as_json: bool,
                     command: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from pagesim.cli.checks import progress_bar
    from pagesim.plan.concurrency import max_concurrency
    from pagesim.results import results_folder

    max_clients = max(1, settings.num_requests // REQUESTS_PER_CLIENT)
    rows = []
    with progress_bar("plan", "configurations", len(grid), Console(stderr=True), quiet=as_json) as advance:
        for k, point in enumerate(grid):
            cfg = replace(settings.replay_config(point, 1.0), num_requests=settings.num_requests, warmup_s=0.0)
            found = max_concurrency(loaded, cfg, slos, max_clients, settings.warmup_fraction)
            replicas = found.replicas_for(target)
            price = price_table.price(point.gpu)
            cost = replicas * point.tp * price if replicas is not None and price is not None else None
            rows.append({"configuration": point.label, "point": asdict(point), "clients_per_replica": found.concurrency,
                         "capped": found.capped, "replicas": replicas, "cost_per_hour": cost,
                         "at_capacity": None if found.at_capacity is None else asdict(found.at_capacity),
                         "points": [asdict(p) for p in found.points]})
            advance(k + 1)
    priced = sorted((r for r in rows if r["cost_per_hour"] is not None), key=lambda r: r["cost_per_hour"])
    plan = {"command": command, "trace": str(trace), "target_concurrency": target,
            "slos": [s.describe() for s in slos], "configurations": rows,
            "recommendation": priced[0]["configuration"] if priced else None,
            "max_clients": max_clients,
            "method": "pagesim.plan.concurrency: the most closed-loop clients one replica serves within the SLOs "
                      f"(doubling from 1, then bisection, up to --num-requests / {REQUESTS_PER_CLIENT}), "
                      "replicas = ceil(target / that)"}
    with results_folder(out) as staging:
        (staging / "plan_concurrency.json").write_text(json.dumps(plan, indent=2, sort_keys=True, allow_nan=False) + "\n")
    if as_json:
        sys.stdout.write(json.dumps(plan, indent=2, sort_keys=True, allow_nan=False) + "\n")
        return
    table = Table(title=escape(f"{target} concurrent clients · " + ", ".join(s.describe() for s in slos)),
                  title_justify="left")
    for name in ("configuration", "clients/replica", "req/s at capacity", "replicas", "$/h"):
        table.add_column(name, justify="left" if name == "configuration" else "right")
    for r in rows:
        at = r["at_capacity"]
        clients = "-" if r["clients_per_replica"] is None else f"{r['clients_per_replica']}{'+' if r['capped'] else ''}"
        table.add_row(r["configuration"], clients, f"{at['request_throughput']:.2f}" if at else "-",
                      str(r["replicas"] or "-"), f"{r['cost_per_hour']:,.2f}" if r["cost_per_hour"] is not None else "-")
    console = Console()
    console.print(table)
    best = priced[0] if priced else None
    console.print(f"cheapest: {best['replicas']} replica(s) of {best['configuration']}: ${best['cost_per_hour']:,.2f}/h"
                  if best else "no configuration meets the SLOs with one client", markup=False)
    if any(r["capped"] for r in rows):
        console.print(f"+: within the SLOs at the most clients tried ({max_clients} = --num-requests / "
                      f"{REQUESTS_PER_CLIENT}); raise --num-requests to find the limit", markup=False)
    console.print(f"wrote {out}/plan_concurrency.json", markup=False)

"""`pagesim plan`: capacity planning under latency SLOs, with an HTML and markdown report."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import (FRACTION, JOBS, NON_NEGATIVE, NUM_REQUESTS, OUT_DIR, POSITIVE, RATE, SECONDS, SEED, TOKENS,
                                WORKERS, fail,
                                input_file, progress_bar)
from pagesim.cli.config_file import config_option, print_reproduce
from pagesim.cli.replay import DEFAULTS, WORKLOAD
from pagesim.sim.cost import DEFAULT_COST_MODEL

DEFAULT_GPUS = "a100-40gb,a100-80gb,h100-80gb,h200"


def _ints(option: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{option}: expected comma-separated integers, got {text!r}")
    if not values:
        fail(f"{option}: no value given")
    return values


def _names(option: str, text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        fail(f"{option}: no value given")
    return names


@app.command()
def plan(
    config: Optional[Path] = config_option(),
    model: str = typer.Option(..., help="model from the catalog (pagesim model list), e.g. llama-2-7b, or a Hugging Face config.json"),
    kv_cache_dtype: str = typer.Option("auto", help="KV cache element type: auto (the model's dtype) or fp8 (1 byte)"),
    trace: Path = typer.Option(..., help="trace file (see docs/traces.md)"),
    target_rate: Optional[float] = typer.Option(None, parser=RATE, help="total request rate to serve, req/s"),
    target_concurrency: Optional[int] = typer.Option(None, min=1, help="instead of --target-rate: closed-loop "
                                                     "clients to serve (each sending when its last request ended); "
                                                     "capacity per replica is then in clients"),
    slo: str = typer.Option(..., help="SLOs, e.g. ttft_p99=2.0,tpot_p99=0.1,goodput=0.9 (seconds; see docs/plan.md)"),
    gpus: str = typer.Option(DEFAULT_GPUS, help="GPUs to compare (comma-separated catalog names)"),
    tp: str = typer.Option("1", help="tensor-parallel degrees to try, e.g. 1,2,4,8"),
    block_size: str = typer.Option("16", help="KV block sizes to try, e.g. 8,16,32"),
    preemption: str = typer.Option(DEFAULTS.preemption, help="preemption modes to try: recompute,swap,auto"),
    max_num_seqs: str = typer.Option("256", help="max running sequences to try, e.g. 128,256"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, parser=TOKENS, help="tokens per step (default: max(2560, "
                                                         "max model length); with chunked prefill the GPU's: 2048 or 8192)"),
    chunked_prefill: Optional[bool] = typer.Option(None, "--chunked-prefill/--no-chunked-prefill",
                                                   help="split prompts to fill the step budget (default: as vLLM, on "
                                                   "for a model longer than 32K tokens)"),
    max_model_len: Optional[int] = typer.Option(None, parser=TOKENS, help="longest sequence (default: the model's); "
                                                "the step's default token budget and activations follow it"),
    num_requests: int = typer.Option(WORKLOAD.num_requests, parser=NUM_REQUESTS, help="requests of a probe's first run, at least"),
    max_requests: int = typer.Option(40_000, parser=NUM_REQUESTS, help="most requests a probe runs to judge steady state"),
    min_measured: int = typer.Option(1000, parser=NUM_REQUESTS, help="measured requests a pass needs, at least (fewer "
                                     "flatter the knee: lower it only for quick looks)"),
    seeds: int = typer.Option(3, parser=JOBS, help="arrival seeds each capacity is searched for (its interval)"),
    check_longer: float = typer.Option(10.0, parser=NON_NEGATIVE, help="replay the recommendation this many times longer (0: no check)"),
    min_duration: float = typer.Option(60.0, parser=SECONDS, help="seconds of arrivals per run, at least (more requests at high rates)"),
    warmup_fraction: float = typer.Option(0.2, parser=FRACTION, help="share of each run's arrival span left out of the statistics"),
    tolerance: float = typer.Option(0.02, parser=POSITIVE, help="relative tolerance of the rate search"),
    start_rate: float = typer.Option(1.0, parser=RATE, help="first rate per replica the search tries, req/s"),
    min_rate: float = typer.Option(0.01, parser=RATE, help="below this rate a configuration is called infeasible, req/s"),
    min_headroom: float = typer.Option(0.0, parser=FRACTION, help="spare capacity to keep: replicas = ceil(target / (capacity x (1 - h)))"),
    prices: Optional[Path] = typer.Option(None, help="GPU prices file (default: pagesim/plan/gpu_prices.json)"),
    cost_model: str = typer.Option(DEFAULT_COST_MODEL, help="calibrated, roofline or profiled (with --profile)"),
    profile: Optional[Path] = typer.Option(None, help="profile file for --cost-model profiled"),
    force: bool = typer.Option(False, "--force", help="use a --profile measured on another model or GPU anyway"),
    seed: int = typer.Option(WORKLOAD.seed, parser=SEED, help="seed of the arrival process (the same at every rate)"),
    jobs: int = typer.Option(0, parser=WORKERS, help="parallel workers (0: the CPU count)"),
    backend: str = typer.Option("local", help="local (process pool) or ray (RAY_ADDRESS, or a local cluster)"),
    cache_dir: Path = typer.Option(Path(".pagesim-cache/plan"), parser=OUT_DIR, help="cache of simulated runs"),
    no_cache: bool = typer.Option(False, "--no-cache", help="simulate every run again, store nothing"),
    out: Path = typer.Option(..., parser=OUT_DIR, help="write report.md, report.html, plan.json and plots/ here"),
    as_json: bool = typer.Option(False, "--json", help="print plan.json's content instead of the table"),
    fleet: bool = typer.Option(False, "--fleet", help="also size each configuration's fleet by simulating the cluster "
                               "(routers round-robin, least-outstanding, prefix-affinity; co-located)"),
    router: Optional[str] = typer.Option(None, help="with or instead of --fleet: the routers to size fleets for, "
                                         "comma-separated (see docs/cluster.md)"),
    pd: Optional[str] = typer.Option(None, "--pd", help="with or instead of --fleet: co-located (none) and P:D ratios "
                                     "to size fleets for, e.g. none,1:1,1:3"),
    staleness: Optional[float] = typer.Option(None, parser=SECONDS, help="with or instead of --fleet: seconds between "
                                              "refreshes of the simulated fleets' router view of the loads (as replay "
                                              "--staleness; default 0: read at every decision)"),
) -> None:
    """Find, for each configuration, the highest rate one replica sustains within the SLOs; then the
    replicas and cost to serve TARGET_RATE, the cheapest configuration, and a report."""
    from rich.console import Console

    from pagesim.cli.tables import Column, print_rows

    from pagesim.plan import make_plan
    from pagesim.plan.fleet import DEFAULT_ROUTERS, parse_fleet
    from pagesim.plan.backends import BACKENDS, BackendUnavailable
    from pagesim.plan.grid import RunSettings, expand_grid
    from pagesim.plan.prices import load_prices
    from pagesim.plan.report import write_report
    from pagesim.results import results_folder
    from pagesim.plan.search import SearchSettings
    from pagesim.plan.slo import SLOError, parse_slos
    from pagesim.sim.specs import get_model, is_config_path, with_kv_cache_dtype
    from pagesim.workload.trace import TraceError, find_trace, load_trace

    if (target_rate is None) == (target_concurrency is None):
        fail("give --target-rate (open-loop req/s) or --target-concurrency (closed-loop clients), one of them")
    if backend not in BACKENDS:
        fail(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    try:
        spec = get_model(model)  # a catalog id or a config.json (kept as a path: the runs resolve it again)
        model = model if is_config_path(model) else spec.name
        slos = parse_slos(slo)
        grid = expand_grid(_names("--gpus", gpus), _ints("--tp", tp), _ints("--block-size", block_size),
                           _names("--preemption", preemption),
                           _ints("--max-num-seqs", max_num_seqs))
        settings = RunSettings(model, num_requests, min_duration, warmup_fraction, max_num_batched_tokens, cost_model=cost_model,
                               profile=str(profile) if profile else None, seed=seed, force_profile=force,
                               kv_cache_dtype=kv_cache_dtype, max_requests_per_probe=max_requests,
                               min_measured_requests=min_measured, max_model_len=max_model_len,
                               chunked_prefill=chunked_prefill)
        with_kv_cache_dtype(spec, kv_cache_dtype)  # checks the name
        search = SearchSettings(start_rate=start_rate, tolerance=tolerance, min_rate=min_rate)
        if target_rate is not None:
            settings.requests_at(start_rate)  # --min-duration x the first rate within what one run may hold
        price_table = load_prices(prices)
        wants_fleet = fleet or router is not None or pd is not None or staleness is not None
        shapes = parse_fleet(router or ",".join(DEFAULT_ROUTERS), pd or "none", staleness or 0.0) if wants_fleet else []
        if shapes and target_concurrency is not None:
            fail("--fleet, --router, --pd and --staleness size fleets for --target-rate (open-loop arrivals), not "
                 "--target-concurrency")
        if shapes:
            settings.requests_at(target_rate)  # a fleet's runs are at the target rate: within what one run may hold
        loaded = load_trace(input_file(find_trace(trace), "trace file"))
    except KeyError as e:
        fail(e.args[0])
    except (SLOError, ValueError, OSError, TraceError) as e:
        fail(str(e))
    from pagesim.sim.cost import COST_MODELS

    if cost_model.lower() not in COST_MODELS:
        fail(f"unknown cost model {cost_model!r}; known: {', '.join(sorted(COST_MODELS))}")
    if profile is not None and cost_model.lower() != "profiled":
        fail(f"--profile is read only by --cost-model profiled (this plan uses {cost_model})")
    if profile is not None:
        input_file(profile, "profile file")

    if target_concurrency is not None:
        from pagesim.cli.plan_concurrency import plan_closed_loop

        return plan_closed_loop(loaded, trace, grid, settings, slos, target_concurrency, price_table, out, as_json,
                                "pagesim " + shlex.join(sys.argv[1:]))
    # The full command, every option explicit, so the report reproduces even if defaults change.
    words = (["pagesim", "plan", "--model", model, "--trace", str(trace), "--target-rate", f"{target_rate:.12g}",
             "--slo", ",".join(f"{s.name}={s.threshold:.12g}" for s in slos),
             "--gpus", ",".join(dict.fromkeys(p.gpu for p in grid)),
             "--tp", tp, "--block-size", block_size, "--preemption", preemption, "--max-num-seqs", max_num_seqs,
             *(["--max-model-len", str(max_model_len)] if max_model_len is not None else []),
             "--chunked-prefill" if settings.chunked else "--no-chunked-prefill",
             # (a chunk budget left to its default is each GPU's own: then no one number to write)
             *(["--max-num-batched-tokens", str(settings.batched_tokens_on(grid[0].gpu))]
               if max_num_batched_tokens is not None or not settings.chunked else []),
             "--num-requests", str(num_requests),
             "--max-requests", str(max_requests), "--min-measured", str(min_measured), "--seeds", str(seeds), "--check-longer", f"{check_longer:.12g}",
             "--min-duration", f"{min_duration:.12g}",
             "--warmup-fraction", f"{warmup_fraction:.12g}", "--tolerance", f"{tolerance:.12g}",
             "--start-rate", f"{start_rate:.12g}", "--min-rate", f"{min_rate:.12g}",
             "--min-headroom", f"{min_headroom:.12g}", "--cost-model", cost_model, "--seed", str(seed)]
             + (["--prices", str(prices)] if prices else []) + (["--profile", str(profile)] if profile else [])
             + (["--force"] if force else [])
             + (["--router", ",".join(dict.fromkeys(s.router for s in shapes)),
                 "--pd", ",".join(dict.fromkeys("none" if s.pd is None else f"{s.pd[0]}:{s.pd[1]}" for s in shapes)),
                 "--staleness", f"{shapes[0].staleness_s:.12g}"]
                if shapes else []))
    command = shlex.join(words + ["--out", str(out)])

    workers = jobs or os.cpu_count() or 1
    console = Console(stderr=True)
    started = time.perf_counter()
    with progress_bar("plan", "configurations", len(grid), console, quiet=as_json) as advance:
        finished = []
        try:
            result = make_plan(model=model, trace=loaded, trace_path=str(trace), target_rate=target_rate, slos=slos,
                               grid=grid, settings=settings, search=search, min_headroom=min_headroom,
                               prices=price_table, cache_dir=None if no_cache else cache_dir, backend=backend,
                               jobs=workers, command=command, seeds=seeds, longer_factor=check_longer, fleet=shapes,
                               on_result=lambda r: (finished.append(r), advance(len(finished))))
        except (BackendUnavailable, ValueError) as e:  # a setting no configuration can run with (not "infeasible")
            fail(str(e))
    elapsed = time.perf_counter() - started
    with results_folder(out) as staging:
        paths = {key: out / path.relative_to(staging) for key, path in write_report(result, staging).items()}
    simulated = sum(r.num_simulated for r in result.results)
    cached = sum(r.num_cached for r in result.results)
    if as_json:
        sys.stdout.write(paths["json"].read_text())
        return
    con = Console()
    costs = f" · costs from profile {profile.name}, not the GPUs named" if cost_model.lower() == "profiled" and profile else ""
    columns = [Column(name, "left" if name in ("configuration", "limiting") else "right")
               for name in ("#", "configuration", "capacity/replica", "interval", "kernel costs", "replicas", "$/h",
                            "$/M out tok", "headroom", "limiting")]
    rank = {id(r): i + 1 for i, r in enumerate(result.ranking)}
    rows = [[str(rank.get(id(r), "-")), r.point.label, f"{r.capacity:.2f}" if r.capacity else "-",
             f"{r.capacity_low:.2f}-{r.capacity_high:.2f}" if r.capacity_low is not None else "-", r.costs,
             str(r.replicas or "-"), f"{r.cost_per_hour:,.2f}" if r.cost_per_hour is not None else "-",
             f"{r.cost_per_m_output_tokens:.3f}" if r.cost_per_m_output_tokens is not None else "-",
             f"{100 * r.headroom:.1f}%" if r.headroom is not None else "-",
             ", ".join(r.limiting) if r.feasible else (r.reason or "")]
            for r in sorted(result.results, key=lambda r: rank.get(id(r), 10**9))]
    print_rows(con, f"{model} · {target_rate:g} req/s · " + ", ".join(s.describe() for s in slos) + costs, columns, rows)
    best = result.recommendation
    if best is None:
        con.print("[bold]no configuration meets " + ", ".join(s.describe() for s in slos) + "[/] (see the report)")
    else:
        con.print(f"[bold]cheapest:[/] {best.replicas} replica(s) of {best.point.label}: ${best.cost_per_hour:,.2f}/h")
        if best.uncertain_headroom:
            con.print(f"[bold]warning:[/] its headroom is inside its uncertainty (capacity may be {best.capacity_low:.2f} "
                      "req/s per replica); see the report")
        if best.longer is not None:
            con.print(f"checked {best.longer.factor:g} x longer: " + ("holds" if best.longer.holds else
                      "[bold]does not hold[/] (see the report)"))
    if shapes:
        print_fleets(con, result)
    con.print(f"{simulated} runs simulated, {cached} from the cache, {elapsed:.1f} s of wall time; "
              f"wrote {paths['md']}, {paths['html']}, {paths['json']}", markup=False)  # paths may hold "[/bold]"
    print_reproduce(shlex.join(words + ["--out"]) + " NEW_FOLDER")


def print_fleets(con, result) -> None:
    """The simulated fleets, cheapest first, and what the router costs against the ideal."""
    from pagesim.cli.tables import Column, print_rows

    columns = [Column(n, "left" if n in ("configuration", "fleet") else "right")
               for n in ("configuration", "fleet", "replicas", "ideal", "router cost $/h", "$/h", "requests max/mean")]
    rows = [[r.point.label, f.shape.label, f.shape.counts(f.units), str(f.ideal_replicas),
             f"{f.router_cost_per_hour:+,.2f}", f"{f.cost_per_hour:,.2f}",
             f"{f.imbalance['requests_max_over_mean']:.3f}" if f.imbalance.get("requests_max_over_mean") else "-"]
            for r, f in result.fleet_ranking]
    print_rows(con, "fleets simulated as clusters at the target rate", columns, rows)
    if result.fleet_ranking:
        r, f = result.fleet_ranking[0]
        con.print(f"[bold]cheapest simulated fleet:[/] {f.shape.counts(f.units)} replica(s) of {r.point.label} behind "
                  f"{f.shape.label}: ${f.cost_per_hour:,.2f}/h")
    else:
        con.print("[bold]no simulated fleet sustains the target[/] (see the report)")

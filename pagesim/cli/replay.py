"""`pagesim replay TRACE`: simulate serving a trace and print a summary."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.api import RENAMED_OPTIONS
from pagesim.cli import app
from pagesim.cli.checks import (Number, BLOCKS, REPLICAS, BLOCK_SIZE, BURSTINESS, NUM_REQUESTS, POSITIVE_SECONDS, RATE_OR_TRACE,
                                RUN_OUT_DIR, SAMPLES, SECONDS, SEED, SEQS, SWAP_GIB, TOKENS, TP, WORKERS, check_arrival_flags,
                                check_run_size, check_workload, fail, given, load_trace_file, progress_bar, warn)
from pagesim.cli.config_file import config_extra, config_option, print_reproduce
from pagesim.cli.summary_table import _fmt, print_summary  # noqa: F401 (run and bench print it through here too)
from pagesim.core.config import CHOICES
from pagesim.core.config import SERVING_DEFAULTS as DEFAULTS
from pagesim.sim.cost.names import DEFAULT_COST_MODEL, DEFAULT_ENGINE, ENGINE_NAMES
from pagesim.metrics.files import STEPS_CHOICES
from pagesim.workload.requests import WORKLOAD_DEFAULTS as WORKLOAD

# The options' choices and defaults come from the one serving configuration (pagesim.core.config).
Policy = enum.Enum("Policy", {name: name for name in CHOICES["policy"]}, type=str)
Preemption = enum.Enum("Preemption", {name: name for name in CHOICES["preemption"]}, type=str)
GPU_MEMORY_SHARE = Number(lo=0, lo_open=True, hi=1)  # vLLM's --gpu-memory-utilization, in (0, 1]
KVCacheDtype = enum.Enum("KVCacheDtype", {name: name for name in ("auto", "fp8")}, type=str)
Steps = enum.Enum("Steps", {name: name for name in STEPS_CHOICES}, type=str)
# summary.json's config names three options by their ReplayConfig fields: --config takes both names
CONFIG_FIELD_KEYS = {field: flag for flag, field in RENAMED_OPTIONS.items()}
BATCHED_TOKENS_HELP = ("tokens computed in one step, at most (default: max(2560, the model's max length); with "
                       "--chunked-prefill vLLM's: 8192 on a GPU of 70 GiB or more other than the A100, else 2048)")


@app.command()
def replay(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    config: Optional[Path] = config_option(lambda ctx: config_only_keys(ctx), aliases=CONFIG_FIELD_KEYS),
    model: str = typer.Option("opt-13b", help="model from the catalog (pagesim model list) or a Hugging Face config.json"),
    gpu: str = typer.Option("a100-40gb", help="GPU from the catalog"),
    tp: int = typer.Option(1, "--tp", "--tensor-parallel-size", parser=TP, help="tensor-parallel degree"),
    ep: int = typer.Option(1, parser=TP, help="expert parallelism of a MoE: experts split over this many GPUs "
                           "(ep / tp data-parallel attention ranks, as vLLM's --enable-expert-parallel)"),
    kv_cache_dtype: KVCacheDtype = typer.Option("auto", help="KV cache element type: auto (the model's dtype) or fp8 "
                                                "(1 byte, as vLLM's --kv-cache-dtype fp8)"),
    policy: Policy = typer.Option(DEFAULTS.policy, help="KV cache system"),
    block_size: int = typer.Option(DEFAULTS.block_size, parser=BLOCK_SIZE, help="tokens per KV block"),
    preemption: Preemption = typer.Option(DEFAULTS.preemption, help="auto: recompute single sequences, swap groups"),
    rate: float = typer.Option(WORKLOAD.rate, parser=RATE_OR_TRACE, help="arrival rate in req/s (0: use the trace's own arrival times)"),
    burstiness: float = typer.Option(WORKLOAD.burstiness, parser=BURSTINESS, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: int = typer.Option(WORKLOAD.num_requests, parser=NUM_REQUESTS, help="requests to replay (the trace is cycled if it holds "
                                     "fewer)"),
    duration: Optional[float] = typer.Option(None, parser=POSITIVE_SECONDS, help="seconds of arrivals instead of a request count"),
    concurrency: Optional[str] = typer.Option(None, help="closed loop: N clients, each sending its next request (or "
                                              "session) when its last one ended; a list (1,2,4,8) sweeps them"),
    max_num_seqs: int = typer.Option(DEFAULTS.max_num_seqs, parser=SEQS, help="sequences running at once, at most"),
    max_num_batched_tokens: Optional[int] = typer.Option(DEFAULTS.max_num_batched_tokens, parser=TOKENS,
                                                         help=BATCHED_TOKENS_HELP),
    max_model_len: Optional[int] = typer.Option(DEFAULTS.max_model_len, parser=TOKENS,
                                                help="longest sequence (default: the model's)"),
    swap_space: float = typer.Option(4.0, parser=SWAP_GIB, help="GiB of host memory per GPU for swapped blocks"),
    num_gpu_blocks: Optional[int] = typer.Option(None, "--num-gpu-blocks", "--num-gpu-blocks-override", parser=BLOCKS,
                                                 help="KV pool size in blocks (default: sized from model and GPU)"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, parser=GPU_MEMORY_SHARE, help="share of GPU memory the "
                                                           "engine may use (default: the paper's 0.95; vllm-v1: 0.9)"),
    prefix_caching: bool = typer.Option(DEFAULTS.prefix_caching, "--prefix-caching/--no-prefix-caching",
                                        "--enable-prefix-caching",
                                        help="automatic prefix caching"),
    chunked_prefill: Optional[bool] = typer.Option(None, "--chunked-prefill/--no-chunked-prefill",
                                                   "--enable-chunked-prefill",
                                                   help="split prompts to fill the token budget (default: as vLLM, "
                                                   "on for vllm-v1 and for a model longer than 32K tokens)"),
    n: Optional[int] = typer.Option(None, parser=SAMPLES, help="parallel samples for every request"),
    beam_width: Optional[int] = typer.Option(None, parser=SAMPLES, help="beam search of this width for every request "
                                             "(simulated beam ancestry: pagesim/sim/beam_model.py)"),
    beam_ancestry: Optional[Path] = typer.Option(None, help="beam-ancestry measurements to fit the simulated beam search "
                                                 "from (default: pagesim/sim/data/beam_ancestry_smollm2.json)"),
    warmup: float = typer.Option(0.0, parser=SECONDS, help="leave requests arriving in the first S seconds out of "
                                 "latency statistics"),
    cost_model: str = typer.Option(DEFAULT_COST_MODEL, help="calibrated (fitted to measured GPU timings), roofline, constant or "
                                   "profiled"),
    engine: str = typer.Option(DEFAULT_ENGINE, help="engine profile for the calibrated cost model: how the serving engine "
                               f"runs the kernels ({', '.join(ENGINE_NAMES)}, or a profile .json; docs/calibration.md)"),
    profile: Optional[Path] = typer.Option(None, help="profile file for --cost-model profiled"),
    force: bool = typer.Option(False, "--force", help="use a --profile measured on another model or GPU anyway"),
    seed: int = typer.Option(WORKLOAD.seed, parser=SEED, help="seed of the arrival process"),
    replicas: Optional[int] = typer.Option(None, parser=REPLICAS, help="simulate a cluster of this many replicas "
                                           "behind a router (docs/cluster.md)"),
    router: Optional[str] = typer.Option(None, help="the cluster's router (default round-robin; docs/cluster.md)"),
    staleness: Optional[float] = typer.Option(None, parser=SECONDS, help="seconds between refreshes of the router's "
                                              "view of the replicas' loads (default 0: read at every decision)"),
    pd: Optional[str] = typer.Option(None, "--pd", help="P:D: a cluster of P prefill and D decode replicas (P/D "
                                     "disaggregation; the KV moves over --link)"),
    link: Optional[str] = typer.Option(None, help="with --pd: the link KV moves over (nvlink, infiniband, "
                                       "infiniband-hdr, pcie; default infiniband)"),
    cluster: Optional[Path] = typer.Option(None, help="a cluster file (TOML or YAML): replica groups, router, links "
                                           "(docs/cluster.md)"),
    lockstep: Optional[bool] = typer.Option(None, "--lockstep", help="the --replicas are the data-parallel ranks of a "
                                            "MoE with expert parallelism: they step together (docs/cluster.md)"),
    jobs: int = typer.Option(0, parser=WORKERS, help="a cluster whose router reads no load (round-robin, random) "
                             "replays its replicas apart, in this many processes (0: the CPUs this command may use; "
                             "the outputs are the same for any count)"),
    autoscale: Optional[str] = typer.Option(None, help="a replica count that follows load: KEY=VALUE,... of metric "
                                            "(queue|kv), up_at, down_at, min, max, startup, cooldown, interval "
                                            "(docs/cluster.md)"),
    out: Optional[Path] = typer.Option(None, parser=RUN_OUT_DIR, help="write requests.csv, steps.csv and summary.json here"),
    steps: Steps = typer.Option(Steps.all, help="steps.csv rows --out writes: every step, the first of each simulated "
                                "second, or none"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    html: bool = typer.Option(False, "--html", help="also write the run's page, --out's report.html (pagesim view)"),
) -> None:
    """Replay TRACE through the engine core in simulated time."""
    from pagesim.api import finish_replay, prepare_replay

    duration = check_arrival_flags(ctx, duration=duration)
    if profile is not None and cost_model.lower() != "profiled":
        fail(f"--profile is read only by --cost-model profiled (this run uses {cost_model})")
    if html and out is None:
        fail("--html writes report.html into the --out folder: give --out")
    if out is None and given(ctx, "steps"):
        warn(f"--steps {steps.value} chooses the steps.csv rows --out writes; without --out nothing is written")
    loaded = load_trace_file(trace)
    if prefix_caching and not any(r.prompt_token_ids or r.hash_ids for r in loaded.requests):
        warn(f"--prefix-caching: {trace} has no prompt_token_ids or hash_ids, so no prefix can be recognised and nothing is cached")
    check_run_size(rate or None, num_requests, duration)
    options = dict(model=model, gpu=gpu, tp=tp, ep=ep, kv_cache_dtype=kv_cache_dtype.value, policy=policy,
                   block_size=block_size, preemption=preemption, rate=rate,
                   burstiness=burstiness, num_requests=None if duration is not None else num_requests,
                   duration=duration, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                   max_model_len=max_model_len, swap_space=swap_space, num_gpu_blocks=num_gpu_blocks,
                   prefix_caching=prefix_caching, chunked_prefill=chunked_prefill, n=n, beam_width=beam_width,
                   beam_ancestry=beam_ancestry,
                   cost_model=cost_model, engine=engine, profile=profile, seed=seed, warmup=warmup, force=force,
                   gpu_memory_utilization=gpu_memory_utilization)
    drop_preset_defaults(ctx, options)
    options.update(config_extra(ctx))  # the file's ReplayConfig fields that have no flag
    if any(v is not None for v in (replicas, router, staleness, pd, link, cluster, autoscale, lockstep)):
        from pagesim.cli.cluster import replay_cluster

        levels = concurrency_levels(concurrency)
        if len(levels) > 1:
            fail("--concurrency: a cluster takes one client count (a sweep runs on one replica)")
        options["concurrency"] = levels[0]
        return replay_cluster(ctx, trace, loaded, options, dict(replicas=replicas, router=router, staleness=staleness,
                                                                pd=pd, link=link, cluster=cluster, autoscale=autoscale,
                                                                lockstep=lockstep),
                              out, steps.value, as_json, warmup, duration, jobs)
    if jobs:
        fail("--jobs replays a cluster's replicas in parallel: give --replicas or --cluster too")
    levels = concurrency_levels(concurrency)
    if len(levels) > 1:
        return replay_sweep(loaded, trace, options, levels, out, as_json)
    options["concurrency"] = levels[0]
    try:
        # per-step records only for a steps.csv
        sim = prepare_replay(loaded, keep_steps=out is not None and steps.value != "none", **options)
    except (KeyError, ValueError, OSError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))
    check_workload(sim.requests, warmup, duration)
    for note in sim.notes:
        if note.startswith("what-if"):
            warn(note)

    with progress_bar("replay", "requests", len(sim.requests), quiet=as_json) as advance:
        sim.on_progress = advance
        result = finish_replay(sim, trace)
    cfg = sim.cfg
    summary = result.summary if out is None else dict(result.summary, reproduce=reproduce_line(trace, steps.value))
    emit_results(summary, result.metrics, out, as_json,
                 f"{cfg.policy} · {hardware_label(cfg, result.summary)}{engine_label(cfg)} · block {cfg.block_size}",
                 steps.value,
                 reproduce=None if out is None else reproduce_line(trace, steps.value, out / "summary.json"))
    if html:
        from pagesim.view import write_report

        write_report([out], out / "report.html")
        typer.echo(f"wrote {out / 'report.html'}", err=as_json)  # (--json: stdout holds the JSON alone)


def concurrency_levels(text: str | int | None) -> list[int | None]:
    """--concurrency's values: [None] (open loop), one N, or a sweep (each >= 1, in the order given)."""
    if text is None:
        return [None]
    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        fail(f"--concurrency: expected a client count or a comma-separated list of them, got {text!r}")
    if not levels or min(levels) < 1 or max(levels) > MAX_CLIENTS:
        fail(f"--concurrency: each value must be an integer in [1, {MAX_CLIENTS:,}], got {text!r}")
    return levels


MAX_CLIENTS = 1_000_000  # (as --num-requests: more clients than a run may hold requests is no closed loop)


SWEEP_COLUMNS = ("concurrency", "request_throughput", "output_token_throughput", "ttft_p50", "ttft_p99", "tpot_p50",
                 "tpot_p99", "e2e_p50", "e2e_p99", "num_rejected")


def replay_sweep(loaded, trace: Path, options: dict, levels: list[int], out: Path | None, as_json: bool) -> None:
    """One replay per concurrency (write_sweep says what comes out)."""
    from pagesim.api import finish_replay, prepare_replay

    runs = []
    for level in levels:
        try:
            sim = prepare_replay(loaded, keep_steps=False, **dict(options, concurrency=level))
        except (KeyError, ValueError, OSError) as e:
            fail(str(e.args[0] if isinstance(e, KeyError) else e))
        with progress_bar(f"concurrency {level}", "requests", len(sim.requests), quiet=as_json) as advance:
            sim.on_progress = advance
            run = finish_replay(sim, trace)
        runs.append((level, run.summary, run.metrics))
    write_sweep(runs, trace, out, as_json)


def write_sweep(runs: list[tuple[int, dict, object]], trace: Path, out: Path | None, as_json: bool) -> None:
    """A sweep's runs, (concurrency, summary, metrics) each (replay's and bench's): a table of each
    one's throughput and latencies; --out writes each run's folder (concurrency-N/, no steps.csv)
    and sweep.csv; --json prints the summaries as a list."""
    rows = [[level] + [summary.get(c) for c in SWEEP_COLUMNS[1:]] for level, summary, _ in runs]
    if out is not None:
        from pagesim.metrics.files import write_rows_csv
        from pagesim.results import results_folder

        with results_folder(out) as folder:
            for level, summary, metrics in runs:
                metrics.write(folder / f"concurrency-{level}", summary, steps="none")
            write_rows_csv(folder / "sweep.csv", SWEEP_COLUMNS, rows)
    if as_json:
        sys.stdout.write(json.dumps([summary for _, summary, _ in runs], indent=2, sort_keys=True, allow_nan=False)
                         + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"closed-loop sweep of {trace}", title_justify="left")
    for name in ("N", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50", "E2E p99",
                 "rejected"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(_fmt(v, digits=2 if i in (2, 7, 8) else 3) for i, v in enumerate(row)))
    Console().print(table)
    if out is not None:
        Console().print(f"wrote {out}/sweep.csv and {len(runs)} run folders (concurrency-N/)", markup=False)


def config_only_keys(ctx) -> dict:
    """The ReplayConfig fields without a flag that a --config file may set (summary.json's config
    holds them all), each checked as ReplayConfig checks it."""
    from pagesim.api import replay_config, replay_options

    flags = {p.name for p in ctx.command.params}

    def checker(name: str):
        def check(value):
            replay_config(**{name: value})
            return value
        return check

    return {name: checker(name) for name in replay_options() if name not in flags}


THIS_SUMMARY = "SUMMARY_JSON"  # in summary.json's "reproduce": the file itself (printed as its path)


def reproduce_line(trace: Path, steps: str, summary: Path | str = THIS_SUMMARY) -> str:
    """The command that re-creates a run from its summary.json's config. summary.json stores it
    naming itself THIS_SUMMARY, not by its folder, so a run's summary.json is the same bytes
    wherever it is written; the line printed names the file."""
    import shlex

    words = ["pagesim", "replay", str(trace), "--config", str(summary)]
    words += ["--steps", steps] if steps != "all" else []
    return shlex.join(words + ["--out"]) + " NEW_FOLDER"


def hardware_label(cfg, summary: dict) -> str:
    """What the step costs describe: the model on its GPUs (marking kernel terms scaled from another
    GPU), or, for a profiled cost model, the profile itself rather than a GPU it never measured."""
    from pathlib import PurePath

    if cfg.cost_model.lower() == "profiled" and cfg.profile:
        return f"{cfg.model} · costs from profile {PurePath(cfg.profile).name}"
    label = f"{cfg.model} on {cfg.tp} x {cfg.gpu}"
    scaled = (summary.get("cost_model") or {}).get("calibration_source", {}).get("scaled_from")
    return label + (f" (kernel terms scaled from {scaled})" if scaled else "")


def engine_label(cfg) -> str:
    """' · engine NAME' where the calibrated cost model runs under an engine profile."""
    if cfg.cost_model.lower() != "calibrated":
        return ""
    from pathlib import PurePath

    return f" · engine {PurePath(cfg.engine).stem if cfg.engine.endswith('.json') else cfg.engine}"


def drop_preset_defaults(ctx: typer.Context, options: dict) -> None:
    """Options left at their defaults give way to the named system's presets (--policy vllm-v1
    turns chunked prefill and prefix caching on unless a flag says otherwise)."""
    from pagesim.sim.engine import policy_preset

    policy = getattr(options.get("policy"), "value", options.get("policy"))
    try:
        preset = policy_preset(policy, options["gpu"])
    except KeyError as e:  # an unknown --gpu
        fail(str(e.args[0]))
    for name in preset:
        if name in options and not given(ctx, name):
            del options[name]


def emit_results(summary: dict, metrics, out: Path | None, as_json: bool, title: str, steps: str = "all",
                 reproduce: str | None = None, written: list[str] | None = None) -> None:
    """What `replay` and `run` do with a finished run: write the results folder (atomically),
    then print the summary as JSON or as a table. steps: which steps.csv rows (STEPS_CHOICES);
    reproduce: the command that re-creates the run, printed after the table; written: the files
    metrics.write() writes, where they are not a single run's. A run whose queue grew says so in
    its notes (pagesim.plan.overload)."""
    from pagesim.plan.grid import RunSettings

    requests = getattr(metrics, "requests", None) or []
    if len(requests) >= RunSettings.min_measured_requests:  # (fewer are never judged: no planner import)
        from pagesim.plan.overload import overload_note

        note = overload_note(requests, summary, summary.get("warmup_s") or 0.0)
        if note is not None:
            summary = dict(summary, notes=[*summary.get("notes", []), note])
    if out is not None:
        from pagesim.results import results_folder

        with results_folder(out) as folder:
            metrics.write(folder, summary, steps)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n")
    else:
        from rich.console import Console

        print_summary(summary, Console(), title)
        if out is not None:
            written = written or (("requests.csv", "steps.csv", "summary.json") if steps != "none"
                                  else ("requests.csv", "summary.json"))
            Console().print(f"wrote {out}/" + ", ".join(written), markup=False)
        if reproduce:
            print_reproduce(reproduce)

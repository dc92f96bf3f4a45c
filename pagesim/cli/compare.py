"""`pagesim compare TRACE --profile PROFILE`: the same requests on the executor and in the
simulator (cost model `profiled`), and the relative error of the summary metrics.
`pagesim compare TRACE --endpoint URL`: the same, with the requests sent to a running server over
HTTP (`pagesim bench`) in place of the in-process executor."""

from __future__ import annotations

import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import List, Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import (BLOCKS, BLOCK_SIZE, NON_NEGATIVE, NUM_REQUESTS, OUT_DIR, OUT_FILE, POSITIVE_INT, RATE,
                                SAMPLES, SCALE, SEED, SEQS, TOKENS, Number, fail, input_file, progress_bar)
from pagesim.cli.config_file import config_option, given_options_line, print_reproduce, resolved_options
from pagesim.cli.executor_model import check_cache_fits, dtype_name, load_executor_model
from pagesim.cli.replay import DEFAULTS, WORKLOAD, Policy, Preemption
from pagesim.sim.cost import DEFAULT_COST_MODEL


RESULT_PATHS = ("out", "figure", "config")  # where results go: not part of what a re-run repeats


@app.command()
def compare(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    config: Optional[Path] = config_option(),
    profile: Optional[Path] = typer.Option(None, help="profile file from `pagesim profile` (same model, device and "
                                           "clock); required without --endpoint"),
    endpoint: Optional[str] = typer.Option(None, help="measure a running OpenAI-compatible server at this URL instead "
                                           "of the executor in-process (`pagesim bench`)"),
    served_model: Optional[str] = typer.Option(None, help="with --endpoint: the model name to request (default: the "
                                               "server's first)"),
    cost_model: Optional[str] = typer.Option(None, help="the simulator's cost model (default: profiled with --profile, "
                                             f"else {DEFAULT_COST_MODEL} for --sim-model on --gpu)"),
    gpu: str = typer.Option("a100-40gb", help="catalog GPU for cost models other than profiled"),
    model: str = typer.Option("smollm2", help="executor model: checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG"),
    sim_model: str = typer.Option("smollm2-135m", help="catalog model for the simulator (sizes its host pool only)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, parser=dtype_name, help="float32, float16 or bfloat16 (default: the loader's)"),
    policy: Policy = typer.Option(DEFAULTS.policy, help="KV cache system (when --system is not given)"),
    preemption: Preemption = typer.Option(DEFAULTS.preemption, help="preemption mode (when --system is not given)"),
    system: Optional[List[str]] = typer.Option(None, help="repeatable: paged-recompute, paged-recompute-chunked "
                                               "(chunked prefill), paged-swap, paged-auto, orca-oracle, orca-pow2, "
                                               "orca-max, static (one model load for all)"),
    n: Optional[int] = typer.Option(None, parser=SAMPLES, help="parallel samples of every request (default: "
                                    "the trace's own)"),
    repeat: int = typer.Option(1, parser=POSITIVE_INT, help="executor runs per system, in rounds (round r runs every "
                               "system once); with 2 or more, the report gives the executor's mean and 95 % band"),
    reprofile: bool = typer.Option(False, help="profile the executor again before each round; the simulator then uses "
                                   "the rounds' pooled profile (written to OUT/profiles/)"),
    profile_grid: str = typer.Option("default", help="with --reprofile: the profile grid, default or tiny (tests)"),
    rate: float = typer.Option(WORKLOAD.rate, parser=RATE, help="Poisson arrival rate in req/s"),
    length_scale: float = typer.Option(1.0, parser=SCALE, help="divide every prompt and output length by this "
                                       "(CPU-sized runs)"),
    num_requests: int = typer.Option(WORKLOAD.num_requests, parser=NUM_REQUESTS, help="requests to serve"),
    block_size: int = typer.Option(16, parser=BLOCK_SIZE, help="tokens per KV block"),
    num_gpu_blocks: int = typer.Option(128, parser=BLOCKS, help="KV blocks in the device pool (both runs)"),
    num_cpu_blocks: int = typer.Option(256, parser=BLOCKS, help="KV blocks in the host (swap) pool (both runs)"),
    max_num_seqs: int = typer.Option(64, parser=SEQS, help="sequences running at once, at most"),
    max_num_batched_tokens: int = typer.Option(1024, parser=TOKENS, help="tokens per step, at most"),
    max_model_len: int = typer.Option(1024, parser=TOKENS, help="longest sequence"),
    prefix_caching: bool = typer.Option(False, "--prefix-caching/--no-prefix-caching",
                                        help="the server caches prefixes (as `pagesim serve --prefix-caching`): the "
                                        "simulator too"),
    concurrency: Optional[int] = typer.Option(None, min=1, help="with --endpoint: closed loop, N clients on both sides "
                                              "(each sending when its last request ended)"),
    clock: Optional[str] = typer.Option(None, help="executor clock: cpu or wall (default cpu on CPU, wall on GPU)"),
    seed: int = typer.Option(WORKLOAD.seed, parser=SEED, help="seed of arrivals and synthetic prompts"),
    out: Optional[Path] = typer.Option(None, parser=OUT_DIR, help="write compare.json, compare.md, compare.png and both "
                                       "runs' metrics here"),
    figure: Optional[Path] = typer.Option(None, parser=OUT_FILE, help="figure path (default OUT/compare.png)"),
    tolerance: float = typer.Option(0.05, parser=NON_NEGATIVE, help="target relative error on the headline metrics (reported, not enforced)"),
    max_failed_share: float = typer.Option(0.0, parser=Number(lo=0, hi=1), help="with --endpoint: exit 3 when more "
                                           "than this share of a system's requests failed on the server (results are "
                                           "written either way)"),
) -> None:
    """Serve TRACE on the executor and in the simulator with the same arrivals; print the errors."""
    from rich.console import Console

    from pagesim.compare import CompareSettings, parse_system, plot, print_table, scaled_trace, write_results
    from pagesim.results import results_folder
    from pagesim.sim.cost.profiled import ProfileError, load_profile
    from pagesim.workload.trace import TraceError, find_trace, load_trace

    if system:
        systems = list(system)
    else:
        from pagesim.compare import CHUNKED_SYSTEMS

        named = [name for name, pp in _systems().items()
                 if pp == (policy.value, preemption.value) and name not in CHUNKED_SYSTEMS]
        if not named:
            fail(f"--policy {policy.value} has no preemption mode {preemption.value!r} here (the Orca baselines and "
                 "static recompute); use --system")
        systems = named
    clock = clock or ("wall" if device.startswith("cuda") else "cpu")
    if profile is None and endpoint is None and not reprofile:
        fail("--profile is required (or --reprofile, or --endpoint to compare with a running server)")
    if endpoint is not None and (repeat > 1 or reprofile):
        fail("--repeat and --reprofile measure the in-process executor; they do not apply with --endpoint")
    if (repeat > 1 or reprofile) and out is None:
        fail("--repeat and --reprofile need --out (each run's metrics and step log are written there)")
    if profile_grid not in ("default", "tiny"):
        fail(f"--profile-grid must be default or tiny, got {profile_grid!r}")
    try:
        for name in systems:
            parse_system(name)
        if clock not in ("cpu", "wall"):
            raise ValueError(f"--clock must be cpu or wall, got {clock!r}")
        loaded_trace = scaled_trace(load_trace(input_file(find_trace(trace), "trace file")), length_scale)
        prof = load_profile(profile) if profile is not None else None
    except (OSError, TraceError, ProfileError, ValueError) as e:
        fail(str(e))
    if prof is not None and endpoint is None and prof.meta.get("clock") != clock:
        Console(stderr=True).print(f"warning: the profile was measured with the {prof.meta.get('clock')} clock, "
                                   f"this run uses {clock}")
    settings = CompareSettings(rate=rate, num_requests=num_requests, seed=seed, block_size=block_size,
                               num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, clock=clock,
                               sim_model=sim_model, gpu=gpu, n=n, prefix_caching=prefix_caching,
                               concurrency=concurrency,
                               cost_model=cost_model or ("profiled" if profile is not None or reprofile else DEFAULT_COST_MODEL))
    console = Console(stderr=True)
    if concurrency is not None and endpoint is None:
        fail("--concurrency needs --endpoint: the in-process executor replays open loop")
    # compare.json's config (a --config file for the same comparison) and its reproduce line
    rerun = {"config": resolved_options(ctx, skip=RESULT_PATHS), "reproduce": given_options_line(ctx, trace, skip=RESULT_PATHS)}
    if repeat > 1 or reprofile:
        _repeated(model, device, dtype, loaded_trace, settings, systems, profile, repeat, reprofile, profile_grid,
                  length_scale, out, console, tolerance, rerun)
        return
    if endpoint is not None:  # the measured side is a running server, reached over HTTP
        from pagesim.bench.client import BenchError
        from pagesim.compare import compare_served

        def measure(name, progress, out_dir):
            return compare_served(loaded_trace, name, settings, endpoint, str(profile) if profile else None,
                                  served_model, progress=progress, out_dir=out_dir)

        expected = (ValueError, KeyError, ProfileError, BenchError, OSError)
        simulated = f"{settings.cost_model} {profile.name}" if profile else f"{settings.cost_model}, {sim_model} on {gpu}"
        title = (f"simulated ({simulated}) vs served ({endpoint}) · {num_requests} requests at {rate} req/s · "
                 f"lengths / {length_scale:g}")
        meta = {"endpoint": endpoint}
    else:
        measure, expected, title, meta = _in_process(model, device, dtype, loaded_trace, settings, profile, prof,
                                                     block_size, num_gpu_blocks, num_cpu_blocks, console)
        title += f" · {num_requests} requests at {rate} req/s · lengths / {length_scale:g} · {num_gpu_blocks} KV blocks"
    results = []
    # Everything --out gets is written into a staging folder and moved into place at the end.
    with results_folder(out) if out is not None else nullcontext() as staging:
        for name in systems:
            with progress_bar(name, "requests", num_requests, console) as advance:
                try:
                    results.append(measure(name, advance, staging))
                except expected as e:
                    fail(f"{name}: {e}")
        if figure is not None:
            plot(results, figure, title)
        if staging is not None:
            if figure is None:
                plot(results, staging / "compare.png", title)
            meta = {"command": "pagesim " + shlex.join(sys.argv[1:]), **rerun, "trace": str(trace),
                    "profile": str(profile), "model": model, "device": device, "settings": vars(settings), **meta}
            write_results(results, staging, meta)
    print_table(results, Console(), title)
    with_steps = [(r.system, r.step_fidelity) for r in results if r.step_fidelity]
    if with_steps:
        from pagesim.compare import step_fidelity_table

        print_markdown(step_fidelity_table(with_steps))
    for r in results:
        ok = r.headline_within(tolerance)
        Console().print(f"{r.system}: headline metrics {'within' if ok else 'NOT within'} {tolerance * 100:.0f} %", markup=False)
    fig_path = figure or (out / "compare.png" if out is not None else None)
    if out is not None:
        Console().print(f"wrote {out}/compare.json, compare.md" + (f", {fig_path}" if fig_path else ""), markup=False)
        print_reproduce(rerun["reproduce"])
    elif fig_path is not None:
        Console().print(f"wrote {fig_path}", markup=False)
    if endpoint is not None:
        _check_served(results, max_failed_share)


def print_markdown(text: str) -> None:
    """compare.md's tables as the terminal shows them (rich renders the markdown: tables with
    aligned columns, bold as bold), not as raw pipes."""
    from rich.console import Console
    from rich.markdown import Markdown

    Console().print(Markdown(text))


def _check_served(results, max_failed_share: float) -> None:
    """The served runs' failures, counted by reason; exit 3 past the allowed share."""
    from rich.console import Console

    from pagesim.bench.client import failed_share
    from pagesim.cli.bench import check_failures, print_failures

    for r in results:
        if r.executor["num_failed"] + r.executor["num_skipped"]:
            Console().print(f"{r.system}, served:", markup=False, highlight=False)
            print_failures(r.executor, Console())
    worst = max(results, key=lambda r: failed_share(r.executor))
    check_failures(worst.executor, max_failed_share, f"{worst.system}, served: ")


def _in_process(model, device, dtype, loaded_trace, settings, profile, prof, block_size, num_gpu_blocks,
                num_cpu_blocks, console):
    """Load the executor's model; returns (measure(system, progress, out_dir), the errors it may
    raise, the table's title, extra metadata)."""
    from pagesim.compare import compare as run_compare
    from pagesim.sim.cost.profiled import ProfileError

    lm = load_executor_model(model, device, dtype, console, one_thread=True)  # one thread, as the profile was measured
    check_cache_fits(lm, block_size, num_gpu_blocks, num_cpu_blocks)

    def measure(name, progress, out_dir):
        return run_compare(lm, loaded_trace, name, settings, str(profile), progress=progress, out_dir=out_dir)

    title = f"simulated ({prof.meta.get('clock')}-clock profile {profile.name}) vs executor ({model} on {device})"
    meta = {"profile_hardware": prof.meta.get("hardware"), "profile_clock": prof.meta.get("clock")}
    return measure, (ValueError, ProfileError), title, meta


def _systems() -> dict:
    from pagesim.compare import SYSTEMS

    return SYSTEMS


def _repeated(model, device, dtype, loaded_trace, settings, systems, profile, repeat, reprofile, profile_grid,
              length_scale, out, console, tolerance, rerun: dict) -> None:
    """--repeat K / --reprofile: K interleaved rounds of executor runs, one model load."""
    from rich.console import Console

    from pagesim.compare import RunSpec, compare_repeated, repeated_markdown, write_repeated_results
    from pagesim.results import results_folder
    from pagesim.sim.cost.profiled import ProfileError

    lm = load_executor_model(model, device, dtype, console, one_thread=True)  # one thread, as the profile was measured
    check_cache_fits(lm, settings.block_size, settings.num_gpu_blocks, settings.num_cpu_blocks)
    specs = [RunSpec(name, name, settings) for name in systems]
    grid = None
    if profile_grid == "tiny":
        from executor.profiler import ProfileGrid

        grid = ProfileGrid.tiny()

    def run_progress(label, rnd):
        return progress_bar(f"{label} {rnd}/{repeat}", "requests", settings.num_requests, console)

    with results_folder(out, keep_on_error=True) as staging:  # K executor runs: kept if a later step fails
        try:
            results, used = compare_repeated(lm, loaded_trace, specs, str(profile) if profile else None, repeat, staging,
                                             reprofile=reprofile, profile_grid=grid, run_progress=run_progress,
                                             log=lambda msg: console.print(msg))
        except (ValueError, ProfileError) as e:
            fail(str(e))
        meta = {"command": "pagesim " + shlex.join(sys.argv[1:]), **rerun, "profile": str(profile) if profile else None,
                "simulator_profile": str(Path(out) / Path(used).relative_to(staging)) if reprofile else used,
                "model": model, "device": device, "repeat": repeat, "reprofile": reprofile,
                "length_scale": length_scale, "settings": vars(settings)}
        write_repeated_results(results, staging, meta)
    print_markdown(repeated_markdown(results))
    for r in results:
        Console().print(f"{r.label}: headline metrics {'meet' if r.headline_met() else 'do NOT meet'} the target "
                        f"(inside the executor's 95 % band or within {tolerance * 100:.0f} % of its mean)", markup=False)
    Console().print(f"wrote {out}/compare.json, compare.md", markup=False)
    print_reproduce(rerun["reproduce"])

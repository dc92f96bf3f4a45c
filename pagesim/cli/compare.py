"""`pagesim compare TRACE --profile PROFILE`: the same requests on the executor and in the
simulator (cost model `profiled`), and the relative error of the summary metrics."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from pagesim.cli import app
from pagesim.cli.replay import Policy, Preemption, fail


@app.command()
def compare(
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    profile: Path = typer.Option(..., help="profile file from `pagesim profile` (same model, device and clock)"),
    model: str = typer.Option("smollm2", help="executor model: checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG"),
    sim_model: str = typer.Option("smollm2-135m", help="catalog model for the simulator (sizes its host pool only)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, help="float32, float16 or bfloat16 (default: the loader's)"),
    policy: Policy = typer.Option(Policy.paged, help="KV cache system (when --system is not given)"),
    preemption: Preemption = typer.Option(Preemption.recompute, help="preemption mode (when --system is not given)"),
    system: Optional[List[str]] = typer.Option(None, help="repeatable: paged-recompute, paged-swap, paged-auto, "
                                               "orca-oracle, orca-pow2, orca-max, static (one model load for all)"),
    rate: float = typer.Option(1.0, help="Poisson arrival rate in req/s"),
    length_scale: float = typer.Option(1.0, help="divide every prompt and output length by this (CPU-sized runs)"),
    num_requests: int = typer.Option(200, help="requests to serve"),
    block_size: int = typer.Option(16, help="tokens per KV block"),
    num_gpu_blocks: int = typer.Option(128, help="KV blocks in the device pool (both runs)"),
    num_cpu_blocks: int = typer.Option(256, help="KV blocks in the host (swap) pool (both runs)"),
    max_num_seqs: int = typer.Option(64, help="sequences running at once, at most"),
    max_num_batched_tokens: int = typer.Option(1024, help="tokens per step, at most"),
    max_model_len: int = typer.Option(1024, help="longest sequence"),
    clock: Optional[str] = typer.Option(None, help="executor clock: cpu or wall (default cpu on CPU, wall on GPU)"),
    seed: int = typer.Option(0, help="seed of arrivals and synthetic prompts"),
    out: Optional[Path] = typer.Option(None, help="write compare.json, compare.md, compare.png and both runs' metrics here"),
    figure: Optional[Path] = typer.Option(None, help="figure path (default OUT/compare.png)"),
    tolerance: float = typer.Option(0.05, help="target relative error on the headline metrics (reported, not enforced)"),
) -> None:
    """Serve TRACE on the executor and in the simulator with the same arrivals; print the errors."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pagesim.compare import (CompareSettings, compare as run_compare, parse_system, plot, print_table, scaled_trace,
                                 write_results)
    from pagesim.sim.cost.profiled import ProfileError, load_profile
    from pagesim.workload.trace import TraceError, load_trace

    if system:
        systems = list(system)
    else:
        named = [n for n, pp in _systems().items() if pp == (policy.value, preemption.value)]
        if not named:
            fail(f"--policy {policy.value} has no preemption mode {preemption.value!r} here (the Orca baselines and "
                 "static recompute); use --system")
        systems = named
    clock = clock or ("wall" if device.startswith("cuda") else "cpu")
    try:
        for name in systems:
            parse_system(name)
        if clock not in ("cpu", "wall"):
            raise ValueError(f"--clock must be cpu or wall, got {clock!r}")
        loaded_trace = scaled_trace(load_trace(trace), length_scale)
        prof = load_profile(profile)
    except (OSError, TraceError, ProfileError, ValueError) as e:
        fail(str(e))
    if prof.meta.get("clock") != clock:
        Console(stderr=True).print(f"warning: the profile was measured with the {prof.meta.get('clock')} clock, "
                                   f"this run uses {clock}")
    settings = CompareSettings(rate=rate, num_requests=num_requests, seed=seed, block_size=block_size,
                               num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, clock=clock,
                               sim_model=sim_model)
    console = Console(stderr=True)
    with console.status(f"loading {model}", spinner="dots"):
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        from executor.models.loader import load_model

        if device == "cpu":
            torch.set_num_threads(1)  # as the profile was measured
        try:
            lm = load_model(model, dtype=getattr(torch, dtype) if dtype else None, device=device, tokenizer=False)
        except (ImportError, RuntimeError, FileNotFoundError, ValueError) as e:
            fail(str(e))
    results = []
    for name in systems:
        with Progress(TextColumn(f"[bold]{name}[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                      TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task(name, total=num_requests)
            try:
                results.append(run_compare(lm, loaded_trace, name, settings, str(profile),
                                           progress=lambda done: bar.update(task, completed=done), out_dir=out))
            except (ValueError, ProfileError) as e:
                fail(f"{name}: {e}")
    title = (f"simulated ({prof.meta.get('clock')}-clock profile {profile.name}) vs executor ({model} on {device}) · "
             f"{num_requests} requests at {rate} req/s · lengths / {length_scale:g} · {num_gpu_blocks} KV blocks")
    print_table(results, Console(), title)
    for r in results:
        ok = r.headline_within(tolerance)
        Console().print(f"{r.system}: headline metrics {'within' if ok else 'NOT within'} {tolerance * 100:.0f} %")
    fig_path = figure or (out / "compare.png" if out is not None else None)
    if fig_path is not None:
        plot(results, fig_path, title)
    if out is not None:
        meta = {"command": "pagesim " + shlex.join(sys.argv[1:]), "trace": str(trace), "profile": str(profile),
                "model": model, "device": device, "settings": vars(settings), "profile_hardware": prof.meta.get("hardware"),
                "profile_clock": prof.meta.get("clock")}
        write_results(results, out, meta)
        Console().print(f"wrote {out}/compare.json, compare.md" + (f", {fig_path}" if fig_path else ""))
    elif fig_path is not None:
        Console().print(f"wrote {fig_path}")


def _systems() -> dict:
    from pagesim.compare import SYSTEMS

    return SYSTEMS

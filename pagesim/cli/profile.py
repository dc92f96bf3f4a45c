"""`pagesim profile`: measure the executor's step times for the `profiled` cost model."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.replay import fail


@app.command()
def profile(
    model: str = typer.Option(..., help="checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    out: Path = typer.Option(..., help="profile file to write (JSON)"),
    dtype: Optional[str] = typer.Option(None, help="float32, float16 or bfloat16 (default: the loader's)"),
    block_size: int = typer.Option(16, help="tokens per KV block"),
    grid: str = typer.Option("default", help="default (CPU, a few minutes on SmolLM2), tiny (tests) or gpu"),
    reps: Optional[int] = typer.Option(None, help="repetitions per shape (median kept)"),
    clock: Optional[str] = typer.Option(None, help="cpu (thread CPU time) or wall; default cpu on CPU, wall on GPU"),
    seed: int = typer.Option(0, help="seed of the synthetic prompts"),
) -> None:
    """Run the executor over a grid of iteration shapes and write a profile file."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if grid not in ("default", "tiny", "gpu"):
        fail(f"--grid must be default, tiny or gpu, got {grid!r}")
    clock = clock or ("wall" if device.startswith("cuda") else "cpu")
    if clock not in ("cpu", "wall"):
        fail(f"--clock must be cpu or wall, got {clock!r}")
    console = Console(stderr=True)
    with console.status(f"loading {model}", spinner="dots"):
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        from executor.models.loader import load_model
        from executor.profiler import ProfileGrid, profile_engine
        from pagesim.sim.cost.profiled import ProfiledCostModel, load_profile

        if device == "cpu":
            torch.set_num_threads(1)  # one thread: the CPU clock then measures this run's work alone
        try:
            lm = load_model(model, dtype=getattr(torch, dtype) if dtype else None, device=device, tokenizer=False)
        except (ImportError, RuntimeError, FileNotFoundError, ValueError) as e:
            fail(str(e))
    g = {"default": ProfileGrid, "tiny": ProfileGrid.tiny, "gpu": ProfileGrid.gpu}[grid]()
    if reps is not None:
        g.reps = reps
    command = "pagesim profile " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "profile" else [
        "--model", model, "--device", device, "--out", str(out), "--grid", grid])
    with Progress(TextColumn("[bold]profile[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("shapes"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("profile", total=None)
        data = profile_engine(lm, g, block_size=block_size, clock=clock, model_spec=model, command=command, seed=seed,
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    fit = ProfiledCostModel.from_profile(load_profile(out)).describe()
    print_fit(fit, Console())
    Console().print(f"wrote {out} ({len(data['steps'])} step shapes, {data['profile_wall_s']} s)")


def print_fit(fit: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"profiled cost model · {fit['model'].get('spec', '')} on {fit['hardware'].get('device_name', '')}"
                        f" · clock {fit['clock']}", title_justify="left")
    table.add_column("coefficient")
    table.add_column("value", justify="right")
    for name, value in fit["coefficients"].items():
        table.add_row(name, f"{value:.4g}")
    console.print(table)
    for key in ("train_error", "held_out_error", "swap_error", "copy_error"):
        e = fit[key]
        if e["count"]:
            console.print(f"{key.replace('_', ' ')}: mean |rel| {e['mean_abs'] * 100:.1f} %, "
                          f"max |rel| {e['max_abs'] * 100:.1f} % over {e['count']} shapes")

"""`pagesim profile`: measure the executor's step times for the `profiled` cost model."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import BLOCK_SIZE, OUT_FILE, POSITIVE_INT, POSITIVE_SECONDS, SEED, fail, progress_bar
from pagesim.cli.executor_model import (GC_DURING_STEPS_OPTION, PIN_CPU_OPTION, WARMUP_STEPS_OPTION, dtype_name,
                                        load_executor_model, noise_settings)


@app.command()
def profile(
    model: str = typer.Option(..., help="checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    out: Path = typer.Option(..., parser=OUT_FILE, help="profile file to write (JSON)"),
    dtype: Optional[str] = typer.Option(None, parser=dtype_name, help="float32, float16 or bfloat16 (default: the loader's)"),
    block_size: int = typer.Option(16, parser=BLOCK_SIZE, help="tokens per KV block"),
    grid: str = typer.Option("default", help="default (CPU, a few minutes on SmolLM2), tiny (tests) or gpu"),
    reps: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="repetitions per shape at least (median kept)"),
    max_reps: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="repetitions per shape at most: between "
                                           "--reps and this, a shape repeats until its median is known to +-2 %"),
    shapes_from: Optional[List[Path]] = typer.Option(None, help="repeatable: an executor step log (step_shapes.csv); the "
                                                     "shapes it visits are added to the grid"),
    shapes_budget: float = typer.Option(120.0, parser=POSITIVE_SECONDS, help="seconds of measuring the --shapes-from cells may "
                                        "take, estimated from the logged step times"),
    clock: Optional[str] = typer.Option(None, help="cpu (thread CPU time) or wall; default cpu on CPU, wall on GPU"),
    seed: int = typer.Option(0, parser=SEED, help="seed of the synthetic prompts"),
    pin_cpu: Optional[int] = PIN_CPU_OPTION,
    warmup_steps: int = WARMUP_STEPS_OPTION,
    gc_during_steps: bool = GC_DURING_STEPS_OPTION,
) -> None:
    """Run the executor over a grid of iteration shapes and write a profile file."""
    from rich.console import Console

    from pagesim.results import results_file

    if grid not in ("default", "tiny", "gpu"):
        fail(f"--grid must be default, tiny or gpu, got {grid!r}")
    clock = clock or ("wall" if device.startswith("cuda") else "cpu")
    if clock not in ("cpu", "wall"):
        fail(f"--clock must be cpu or wall, got {clock!r}")
    noise = noise_settings(pin_cpu, warmup_steps, gc_during_steps)
    visited = []
    if shapes_from:
        from pagesim.sim.cost.step_shapes import StepShapesError, read_step_shapes

        try:
            visited = [step for path in shapes_from for step in read_step_shapes(str(path))]
        except StepShapesError as e:
            fail(str(e))
    console = Console(stderr=True)
    # one thread on a CPU: the CPU clock then measures this run's work alone
    lm = load_executor_model(model, device, dtype, console, one_thread=True)
    from executor.noise import NoiseControl
    from executor.profiler import ProfileGrid, profile_engine
    from pagesim.sim.cost.profiled import ProfiledCostModel, load_profile
    from pagesim.sim.cost.step_shapes import visited_grid

    g = {"default": ProfileGrid, "tiny": ProfileGrid.tiny, "gpu": ProfileGrid.gpu}[grid]()
    if reps is not None:
        g.reps = reps
    if max_reps is not None:
        g.max_reps = max_reps
    g.max_reps = max(g.max_reps, g.reps)
    if visited:
        prefill_cells, decode_cells = visited_grid(visited, shapes_budget, g.reps, max_prompt_tokens=lm.max_model_len)
        g = g.merged(prefill_cells, decode_cells)
        console.print(f"--shapes-from: {len(visited)} logged steps -> {len(prefill_cells)} prefill and "
                      f"{len(decode_cells)} decode cells added to the grid")
    command = "pagesim profile " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "profile" else [
        "--model", model, "--device", device, "--out", str(out), "--grid", grid])
    with progress_bar("profile", "shapes", None, console) as advance:
        data = profile_engine(lm, g, block_size=block_size, clock=clock, model_spec=model, command=command, seed=seed,
                              progress=lambda done, total: advance(done, total), noise=NoiseControl(**noise),
                              shapes_from=[str(p) for p in shapes_from or []])
    with results_file(out) as tmp:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
    fit = ProfiledCostModel.from_profile(load_profile(out)).describe()
    print_fit(fit, Console())
    Console().print(f"wrote {out} ({len(data['steps'])} step shapes, {data['profile_wall_s']} s)", markup=False)


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
    by_kind = fit.get("error_by_kind")
    if by_kind:
        kinds = Table(title="fit error by step kind, |relative|: median / p90 (shapes)", title_justify="left")
        for column in ("kind", "training", "held out (model in use)", "cross-validated (every shape)"):
            kinds.add_column(column, justify="left" if column == "kind" else "right")

        def cell(e: dict) -> str:
            return f"{e['median_abs'] * 100:.1f} / {e['p90_abs'] * 100:.1f} % ({e['count']})" if e["count"] else "-"

        for kind, e in by_kind.items():
            kinds.add_row(kind + (" (block moves)" if "note" in e else ""), cell(e["train"]), cell(e["held_out"]),
                          cell(e["cross_validated"]))
        console.print(kinds)

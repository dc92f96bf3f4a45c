"""`pagesim replay TRACE`: simulate serving a trace and print a summary."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app


class Policy(str, enum.Enum):
    paged = "paged"
    orca_max = "orca-max"
    orca_pow2 = "orca-pow2"
    orca_oracle = "orca-oracle"
    static = "static"


class Preemption(str, enum.Enum):
    recompute = "recompute"
    swap = "swap"
    auto = "auto"


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def replay(
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    model: str = typer.Option("opt-13b", help="model from the catalog (pagesim.sim.specs) or a Hugging Face config.json"),
    gpu: str = typer.Option("a100-40gb", help="GPU from the catalog"),
    tp: int = typer.Option(1, help="tensor-parallel degree"),
    policy: Policy = typer.Option(Policy.paged, help="KV cache system"),
    block_size: int = typer.Option(16, help="tokens per KV block"),
    preemption: Preemption = typer.Option(Preemption.auto, help="auto: recompute single sequences, swap groups"),
    rate: Optional[float] = typer.Option(1.0, help="arrival rate in req/s (0: use the trace's own arrival times)"),
    burstiness: float = typer.Option(1.0, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: Optional[int] = typer.Option(1000, help="requests to replay (the trace is cycled if it holds fewer)"),
    duration: Optional[float] = typer.Option(None, help="seconds of arrivals instead of a request count"),
    max_num_seqs: int = typer.Option(256, help="sequences running at once, at most"),
    max_num_batched_tokens: int = typer.Option(2560, help="tokens computed in one step, at most"),
    swap_space: float = typer.Option(4.0, help="GiB of host memory per GPU for swapped blocks"),
    num_gpu_blocks: Optional[int] = typer.Option(None, help="KV pool size in blocks (default: sized from model and GPU)"),
    prefix_caching: bool = typer.Option(False, help="automatic prefix caching"),
    chunked_prefill: bool = typer.Option(False, help="split prompts to fill the token budget"),
    n: Optional[int] = typer.Option(None, help="parallel samples for every request"),
    beam_width: Optional[int] = typer.Option(None, help="beam search of this width for every request (simulated "
                                             "beam ancestry: pagesim/sim/beam_model.py)"),
    beam_ancestry: Optional[Path] = typer.Option(None, help="beam-ancestry measurements to fit the simulated beam search "
                                                 "from (default: pagesim/sim/data/beam_ancestry_smollm2.json)"),
    warmup: float = typer.Option(0.0, help="leave requests arriving in the first S seconds out of latency statistics"),
    cost_model: str = typer.Option("calibrated", help="calibrated (fitted to measured GPU timings), roofline, constant or profiled"),
    profile: Optional[Path] = typer.Option(None, help="profile file for --cost-model profiled"),
    seed: int = typer.Option(0, help="seed of the arrival process"),
    out: Optional[Path] = typer.Option(None, help="write requests.csv, steps.csv and summary.json here"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Replay TRACE through the engine core in simulated time."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pagesim.sim.engine import Replay, ReplayConfig
    from pagesim.workload.trace import TraceError, load_trace

    try:
        loaded = load_trace(trace)
    except (OSError, TraceError) as e:
        fail(str(e))
    cfg = ReplayConfig(
        model=model, gpu=gpu, tp=tp, policy=policy.value, block_size=block_size, preemption=preemption.value,
        rate=rate or None, burstiness=burstiness, num_requests=num_requests, duration=duration,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, swap_space_gib=swap_space,
        num_gpu_blocks=num_gpu_blocks, prefix_caching=prefix_caching, chunked_prefill=chunked_prefill, n=n,
        beam_width=beam_width, beam_ancestry=str(beam_ancestry) if beam_ancestry else None,
        cost_model=cost_model, profile=str(profile) if profile else None, seed=seed, warmup_s=warmup,
    )
    try:
        sim = Replay(cfg, loaded)
    except (KeyError, ValueError, OSError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]replay[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                  TimeElapsedColumn(), console=console, transient=True, disable=as_json or not console.is_terminal) as bar:
        task = bar.add_task("replay", total=len(sim.requests))
        sim.on_progress = lambda done: bar.update(task, completed=done) if done % 50 == 0 or done == len(sim.requests) else None
        result = sim.run()
    summary = dict(result.summary, trace=str(trace))
    if out is not None:
        result.metrics.write(out, summary)
    if as_json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        title = f"{cfg.policy} · {cfg.model} on {cfg.tp} x {cfg.gpu} · block {cfg.block_size}"
        print_summary(summary, Console(), title)
        if out is not None:
            Console().print(f"wrote {out}/requests.csv, steps.csv, summary.json")


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def print_summary(s: dict, console, title: str) -> None:
    """The end-of-run table both `pagesim replay` and `pagesim run` print."""
    from rich.table import Table

    title += f" · {s['num_kv_blocks']:,} KV blocks ({s['kv_token_slots']:,} token slots)"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("requests finished", f"{s['num_finished']:,} / {s['num_requests']:,}", "rejected", _fmt(s["num_rejected"])),
        ("duration", _fmt(s["duration_s"], " s", 1), "steps", _fmt(s["num_steps"])),
        ("request throughput", _fmt(s["request_throughput"], " req/s"), "output tokens/s", _fmt(s["output_token_throughput"], "", 1)),
        ("mean normalized latency", _fmt(s["mean_normalized_latency"], " s/token", 4), "mean batched requests", _fmt(s["mean_batched_requests"], "", 2)),
        ("TTFT mean / p50", f"{_fmt(s['ttft_mean'], ' s')} / {_fmt(s['ttft_p50'], ' s')}", "TTFT p99", _fmt(s["ttft_p99"], " s")),
        ("TPOT mean / p50", f"{_fmt(s['tpot_mean'], ' s', 4)} / {_fmt(s['tpot_p50'], ' s', 4)}", "TPOT p99", _fmt(s["tpot_p99"], " s", 4)),
        ("end-to-end mean / p50", f"{_fmt(s['e2e_mean'], ' s', 2)} / {_fmt(s['e2e_p50'], ' s', 2)}", "end-to-end p99", _fmt(s["e2e_p99"], " s", 2)),
        ("KV utilization mean", _fmt(s["mean_kv_utilization"] * 100, " %", 1), "peak", _fmt(s["peak_kv_utilization"] * 100, " %", 1)),
        ("preemptions", _fmt(s["num_preemptions"]), "swapped blocks", _fmt(s["num_swapped_blocks"])),
    ]
    if "memory_saving" in s:
        rows.append(("memory saving (sharing)", _fmt(s["memory_saving"] * 100, " %", 2),
                     "copied blocks", _fmt(s["num_copied_blocks"])))
    if s.get("prefix_hit_rate") is not None:
        rows.append(("prefix hit rate", _fmt(s["prefix_hit_rate"] * 100, " %", 1),
                     "prefill tokens saved", _fmt(s["prefill_tokens_saved"])))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for note in s.get("notes", []):
        console.print(f"note: {note}")
    for reason, count in s.get("reject_reasons", {}).items():
        console.print(f"rejected {count}: {reason}")

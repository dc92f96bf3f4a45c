"""`pagesim replay TRACE`: simulate serving a trace and print a summary."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import (COUNT, NON_NEGATIVE, OUT_DIR, POSITIVE, POSITIVE_INT, check_arrival_flags, check_run_size,
                                check_workload, fail, given, load_trace_file, progress_bar, warn)
from pagesim.core.config import CHOICES
from pagesim.core.config import SERVING_DEFAULTS as DEFAULTS
from pagesim.metrics.files import STEPS_CHOICES

# The options' choices and defaults come from the one serving configuration (pagesim.core.config).
Policy = enum.Enum("Policy", {name: name for name in CHOICES["policy"]}, type=str)
Preemption = enum.Enum("Preemption", {name: name for name in CHOICES["preemption"]}, type=str)
Steps = enum.Enum("Steps", {name: name for name in STEPS_CHOICES}, type=str)
BATCHED_TOKENS_HELP = "tokens computed in one step, at most (default: max(2560, the model's max length))"


@app.command()
def replay(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    model: str = typer.Option("opt-13b", help="model from the catalog (pagesim.sim.specs) or a Hugging Face config.json"),
    gpu: str = typer.Option("a100-40gb", help="GPU from the catalog"),
    tp: int = typer.Option(1, parser=POSITIVE_INT, help="tensor-parallel degree"),
    policy: Policy = typer.Option(DEFAULTS.policy, help="KV cache system"),
    block_size: int = typer.Option(DEFAULTS.block_size, parser=POSITIVE_INT, help="tokens per KV block"),
    preemption: Preemption = typer.Option(DEFAULTS.preemption, help="auto: recompute single sequences, swap groups"),
    rate: float = typer.Option(1.0, parser=NON_NEGATIVE, help="arrival rate in req/s (0: use the trace's own arrival times)"),
    burstiness: float = typer.Option(1.0, parser=POSITIVE, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: int = typer.Option(1000, parser=POSITIVE_INT, help="requests to replay (the trace is cycled if it holds "
                                     "fewer)"),
    duration: Optional[float] = typer.Option(None, parser=POSITIVE, help="seconds of arrivals instead of a request count"),
    max_num_seqs: int = typer.Option(DEFAULTS.max_num_seqs, parser=COUNT, help="sequences running at once, at most"),
    max_num_batched_tokens: Optional[int] = typer.Option(DEFAULTS.max_num_batched_tokens, parser=POSITIVE_INT,
                                                         help=BATCHED_TOKENS_HELP),
    swap_space: float = typer.Option(4.0, parser=NON_NEGATIVE, help="GiB of host memory per GPU for swapped blocks"),
    num_gpu_blocks: Optional[int] = typer.Option(None, parser=COUNT, help="KV pool size in blocks (default: sized from "
                                                 "model and GPU)"),
    prefix_caching: bool = typer.Option(DEFAULTS.prefix_caching, help="automatic prefix caching"),
    chunked_prefill: bool = typer.Option(DEFAULTS.chunked_prefill, help="split prompts to fill the token budget"),
    n: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="parallel samples for every request"),
    beam_width: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="beam search of this width for every request "
                                             "(simulated beam ancestry: pagesim/sim/beam_model.py)"),
    beam_ancestry: Optional[Path] = typer.Option(None, help="beam-ancestry measurements to fit the simulated beam search "
                                                 "from (default: pagesim/sim/data/beam_ancestry_smollm2.json)"),
    warmup: float = typer.Option(0.0, parser=NON_NEGATIVE, help="leave requests arriving in the first S seconds out of "
                                 "latency statistics"),
    cost_model: str = typer.Option("calibrated", help="calibrated (fitted to measured GPU timings), roofline, constant or "
                                   "profiled"),
    profile: Optional[Path] = typer.Option(None, help="profile file for --cost-model profiled"),
    seed: int = typer.Option(0, parser=COUNT, help="seed of the arrival process"),
    out: Optional[Path] = typer.Option(None, parser=OUT_DIR, help="write requests.csv, steps.csv and summary.json here"),
    steps: Steps = typer.Option(Steps.all, help="steps.csv rows --out writes: every step, the first of each simulated "
                                "second, or none"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Replay TRACE through the engine core in simulated time."""
    from pagesim.api import finish_replay, prepare_replay

    check_arrival_flags(ctx, duration=duration)
    if profile is not None and cost_model.lower() != "profiled":
        fail(f"--profile is read only by --cost-model profiled (this run uses {cost_model})")
    if out is None and given(ctx, "steps"):
        warn(f"--steps {steps.value} chooses the steps.csv rows --out writes; without --out nothing is written")
    loaded = load_trace_file(trace)
    if prefix_caching and not any(r.prompt_token_ids for r in loaded.requests):
        warn(f"--prefix-caching: {trace} has no prompt_token_ids, so no prefix can be recognised and nothing is cached")
    check_run_size(rate or None, num_requests, duration)
    options = dict(model=model, gpu=gpu, tp=tp, policy=policy, block_size=block_size, preemption=preemption, rate=rate,
                   burstiness=burstiness, num_requests=None if duration is not None else num_requests,
                   duration=duration, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                   swap_space=swap_space, num_gpu_blocks=num_gpu_blocks, prefix_caching=prefix_caching,
                   chunked_prefill=chunked_prefill, n=n, beam_width=beam_width, beam_ancestry=beam_ancestry,
                   cost_model=cost_model, profile=profile, seed=seed, warmup=warmup)
    try:
        # per-step records only for a steps.csv
        sim = prepare_replay(loaded, keep_steps=out is not None and steps.value != "none", **options)
    except (KeyError, ValueError, OSError) as e:
        fail(str(e.args[0] if isinstance(e, KeyError) else e))
    check_workload(sim.requests, warmup, duration)

    with progress_bar("replay", "requests", len(sim.requests), quiet=as_json) as advance:
        sim.on_progress = advance
        result = finish_replay(sim, trace)
    cfg = sim.cfg
    emit_results(result.summary, result.metrics, out, as_json,
                 f"{cfg.policy} · {cfg.model} on {cfg.tp} x {cfg.gpu} · block {cfg.block_size}", steps.value)


def emit_results(summary: dict, metrics, out: Path | None, as_json: bool, title: str, steps: str = "all") -> None:
    """What `replay` and `run` do with a finished run: write the results folder (atomically),
    then print the summary as JSON or as a table. steps: which steps.csv rows (STEPS_CHOICES)."""
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
            written = ("requests.csv", "steps.csv", "summary.json") if steps != "none" else ("requests.csv", "summary.json")
            Console().print(f"wrote {out}/" + ", ".join(written))


def _fmt(value, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100


def print_summary(s: dict, console, title: str) -> None:
    """The end-of-run table both `pagesim replay` and `pagesim run` print."""
    from rich.table import Table

    if s.get("num_kv_blocks") is not None:  # None: measured over HTTP, the pool is the server's
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
        ("ITL mean / p99", f"{_fmt(s.get('mean_itl_ms'), ' ms', 2)} / {_fmt(s.get('p99_itl_ms'), ' ms', 2)}",
         "tokens in / out", f"{_fmt(s.get('total_input_tokens'))} / {_fmt(s.get('total_output_tokens'))}"),
        ("end-to-end mean / p50", f"{_fmt(s['e2e_mean'], ' s', 2)} / {_fmt(s['e2e_p50'], ' s', 2)}", "end-to-end p99", _fmt(s["e2e_p99"], " s", 2)),
        ("KV utilization mean", _fmt(_pct(s["mean_kv_utilization"]), " %", 1), "peak", _fmt(_pct(s["peak_kv_utilization"]), " %", 1)),
        ("preemptions", _fmt(s["num_preemptions"]), "swapped blocks", _fmt(s["num_swapped_blocks"])),
    ]
    if s.get("memory_saving") is not None:
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

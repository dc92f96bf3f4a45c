"""`pagesim run TRACE`: serve a trace on the real engine (torch; Triton kernels on a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.replay import BATCHED_TOKENS_HELP, DEFAULTS, Policy, Preemption, fail, print_summary


@app.command()
def run(
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    model: str = typer.Option(..., help="checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG (opt-tiny, llama-tiny, config.json)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, help="float32, float16 or bfloat16 (default: fp32 on CPU, the checkpoint's on GPU)"),
    policy: Policy = typer.Option(DEFAULTS.policy, help="KV cache system"),
    block_size: int = typer.Option(DEFAULTS.block_size, help="tokens per KV block"),
    preemption: Preemption = typer.Option(DEFAULTS.preemption, help="auto: recompute single sequences, swap groups"),
    rate: Optional[float] = typer.Option(1.0, help="arrival rate in req/s (0: the trace's own arrival times)"),
    burstiness: float = typer.Option(1.0, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: Optional[int] = typer.Option(16, help="requests to serve"),
    duration: Optional[float] = typer.Option(None, help="seconds of arrivals instead of a request count"),
    max_num_seqs: int = typer.Option(DEFAULTS.max_num_seqs, help="sequences running at once, at most"),
    max_num_batched_tokens: Optional[int] = typer.Option(DEFAULTS.max_num_batched_tokens, help=BATCHED_TOKENS_HELP),
    max_model_len: Optional[int] = typer.Option(DEFAULTS.max_model_len, help="longest sequence (default: the model's)"),
    num_gpu_blocks: int = typer.Option(1024, help="KV blocks in the device pool"),
    num_cpu_blocks: int = typer.Option(1024, help="KV blocks in the host (swap) pool"),
    prefix_caching: bool = typer.Option(DEFAULTS.prefix_caching, help="automatic prefix caching"),
    chunked_prefill: bool = typer.Option(DEFAULTS.chunked_prefill, help="split prompts to fill the token budget"),
    n: Optional[int] = typer.Option(None, help="parallel samples for every request"),
    beam_width: Optional[int] = typer.Option(None, help="beam search of this width for every request"),
    warmup: float = typer.Option(0.0, help="leave requests arriving in the first S seconds out of latency statistics"),
    seed: int = typer.Option(0, help="seed of arrivals and synthetic prompts"),
    out: Optional[Path] = typer.Option(None, help="write requests.csv, steps.csv and summary.json here"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Serve TRACE on the executor in wall-clock time, writing the simulator's metrics."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pagesim.workload.trace import TraceError, load_trace

    from executor.run import RunConfig, trace_requests

    run_cfg = RunConfig(rate=rate or None, burstiness=burstiness, num_requests=num_requests, duration=duration,
                        seed=seed, n=n, beam_width=beam_width, warmup_s=warmup)
    try:
        loaded_trace = load_trace(trace)
        trace_requests(loaded_trace, run_cfg)  # bad arrival settings fail here, before the model loads
    except (OSError, TraceError, ValueError) as e:
        fail(str(e))
    console = Console(stderr=True)
    with console.status(f"loading {model}", spinner="dots"):
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()  # our spinner says what is happening

        from executor.engine import EngineConfig
        from executor.models.loader import load_model
        from executor.run import run_trace

        try:
            lm = load_model(model, dtype=getattr(torch, dtype) if dtype else None, device=device, tokenizer=False)
        except (ImportError, RuntimeError, FileNotFoundError, ValueError) as e:
            fail(str(e))
    engine_cfg = EngineConfig(policy=policy.value, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                              num_cpu_blocks=num_cpu_blocks, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                              preemption=preemption.value, chunked_prefill=chunked_prefill, prefix_caching=prefix_caching)
    with Progress(TextColumn("[bold]run[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"), TimeElapsedColumn(),
                  console=console, transient=True, disable=as_json or not console.is_terminal) as bar:
        task = bar.add_task("run", total=num_requests)
        summary, metrics = run_trace(lm, loaded_trace, engine_cfg, run_cfg, progress=lambda done: bar.update(task, completed=done))
    summary["trace"] = str(trace)
    summary["model_spec"] = model
    if out is not None:
        metrics.write(out, summary)
    if as_json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print_summary(summary, Console(), f"{policy.value} · {model} on {device} · block {block_size}")
        if out is not None:
            Console().print(f"wrote {out}/requests.csv, steps.csv, summary.json")

"""`pagesim bench TRACE --endpoint URL`: replay a trace against any OpenAI-compatible server."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.replay import fail, print_summary


@app.command()
def bench(
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    endpoint: str = typer.Option(..., help="the server's base URL, e.g. http://127.0.0.1:8000 (or .../v1)"),
    model: Optional[str] = typer.Option(None, help="model name to request (default: the server's first)"),
    rate: Optional[float] = typer.Option(1.0, help="arrival rate in req/s (0: the trace's own arrival times)"),
    burstiness: float = typer.Option(1.0, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: Optional[int] = typer.Option(100, help="requests to send (the trace is cycled if it holds fewer)"),
    duration: Optional[float] = typer.Option(None, help="seconds of arrivals instead of a request count"),
    max_concurrency: Optional[int] = typer.Option(None, help="requests in flight at once, at most"),
    vocab_size: Optional[int] = typer.Option(None, help="vocabulary for synthetic prompt ids (default: the server's, "
                                             "which `pagesim serve` reports)"),
    tokenizer: Optional[str] = typer.Option(None, help="send text made with this HF tokenizer instead of token ids"),
    timeout: float = typer.Option(600.0, help="seconds one request may take"),
    scrape_interval: float = typer.Option(0.5, help="poll the server's /metrics every S seconds (0: never)"),
    warmup: float = typer.Option(0.0, help="leave requests arriving in the first S seconds out of latency statistics"),
    seed: int = typer.Option(0, help="seed of arrivals and synthetic prompts"),
    out: Optional[Path] = typer.Option(None, help="write requests.csv and summary.json here"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Send TRACE's requests to ENDPOINT at the trace's arrival times and measure them."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    try:
        from pagesim.bench.client import BenchConfig, BenchError, bench_requests, run_bench
    except ImportError as e:
        fail(f"{e.name} is missing: pip install 'pagesim[serve]'")
    from pagesim.workload.trace import TraceError, load_trace

    if max_concurrency is not None and max_concurrency < 1:
        fail(f"--max-concurrency must be at least 1, got {max_concurrency}")
    cfg = BenchConfig(endpoint=endpoint, model=model, rate=rate or None, burstiness=burstiness, num_requests=num_requests,
                      duration=duration, seed=seed, max_concurrency=max_concurrency, vocab_size=vocab_size,
                      tokenizer=tokenizer, timeout_s=timeout, scrape_interval_s=scrape_interval, warmup_s=warmup)
    try:
        loaded = load_trace(trace)
        total = len(bench_requests(loaded, cfg)[0])
    except (OSError, TraceError, ValueError) as e:
        fail(str(e))
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                  disable=as_json or not console.is_terminal) as bar:
        task = bar.add_task("bench", total=total)
        try:
            summary, metrics = run_bench(loaded, cfg, progress=lambda done: bar.update(task, completed=done))
        except BenchError as e:
            fail(str(e))
    summary["trace"] = str(trace)
    summary["command"] = "pagesim " + shlex.join(sys.argv[1:])
    if out is not None:
        metrics.write(out, summary, steps=False)
    if as_json:
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print_summary(summary, Console(), f"{summary['model']} at {cfg.base} over HTTP")
        if summary["num_failed"]:
            Console().print(f"failed: {summary['num_failed']} of {summary['num_requests']} requests")
        if out is not None:
            Console().print(f"wrote {out}/requests.csv, summary.json")

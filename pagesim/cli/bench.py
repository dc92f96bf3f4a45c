"""`pagesim bench TRACE --endpoint URL`: replay a trace against any OpenAI-compatible server."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import (COUNT, NON_NEGATIVE, OUT_DIR, POSITIVE, POSITIVE_INT, check_arrival_flags, check_run_size,
                                check_workload, fail, load_trace_file, progress_bar)
from pagesim.cli.replay import print_summary


def endpoint_url(value: str) -> str:
    """An http(s) base URL: a typo here would otherwise surface as a connection error per request."""
    from urllib.parse import urlparse

    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise typer.BadParameter(f"must be an http:// or https:// URL such as http://127.0.0.1:8000, got {value!r}")
    return value


@app.command()
def bench(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    endpoint: str = typer.Option(..., parser=endpoint_url, help="the server's base URL, e.g. http://127.0.0.1:8000 (or .../v1)"),
    model: Optional[str] = typer.Option(None, help="model name to request (default: the server's first)"),
    rate: float = typer.Option(1.0, parser=NON_NEGATIVE, help="arrival rate in req/s (0: the trace's own arrival times)"),
    burstiness: float = typer.Option(1.0, parser=POSITIVE, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: int = typer.Option(100, parser=POSITIVE_INT, help="requests to send (the trace is cycled if it holds fewer)"),
    duration: Optional[float] = typer.Option(None, parser=POSITIVE, help="seconds of arrivals instead of a request count"),
    max_concurrency: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="requests in flight at once, at most"),
    vocab_size: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="vocabulary for synthetic prompt ids (default: the server's, "
                                             "which `pagesim serve` reports)"),
    tokenizer: Optional[str] = typer.Option(None, help="send text made with this HF tokenizer instead of token ids"),
    timeout: float = typer.Option(600.0, parser=POSITIVE, help="seconds one request may take"),
    scrape_interval: float = typer.Option(0.5, parser=NON_NEGATIVE, help="poll the server's /metrics every S seconds (0: never)"),
    warmup: float = typer.Option(0.0, parser=NON_NEGATIVE, help="leave requests arriving in the first S seconds out of latency statistics"),
    seed: int = typer.Option(0, parser=COUNT, help="seed of arrivals and synthetic prompts"),
    out: Optional[Path] = typer.Option(None, parser=OUT_DIR, help="write requests.csv and summary.json here"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Send TRACE's requests to ENDPOINT at the trace's arrival times and measure them."""
    from rich.console import Console

    from pagesim.results import results_folder

    try:
        from pagesim.bench.client import BenchConfig, BenchError, bench_requests, run_bench
    except ImportError as e:
        fail(f"{e.name} is missing: pip install 'pagesim[serve]'")

    check_arrival_flags(ctx, duration=duration)
    loaded = load_trace_file(trace)
    check_run_size(rate or None, num_requests, duration)
    if duration is not None:
        num_requests = None
    cfg = BenchConfig(endpoint=endpoint, model=model, rate=rate or None, burstiness=burstiness, num_requests=num_requests,
                      duration=duration, seed=seed, max_concurrency=max_concurrency, vocab_size=vocab_size,
                      tokenizer=tokenizer, timeout_s=timeout, scrape_interval_s=scrape_interval, warmup_s=warmup)
    try:
        requests = bench_requests(loaded, cfg)[0]
    except ValueError as e:
        fail(str(e))
    check_workload(requests, warmup, duration)
    console = Console(stderr=True)
    with progress_bar("bench", "requests", len(requests), console, quiet=as_json) as advance:
        try:
            summary, metrics = run_bench(loaded, cfg, progress=advance)
        except BenchError as e:
            fail(str(e))
    summary["trace"] = str(trace)
    summary["command"] = "pagesim " + shlex.join(sys.argv[1:])
    if out is not None:
        with results_folder(out) as folder:
            metrics.write(folder, summary, steps=False)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n")
    else:
        print_summary(summary, Console(), f"{summary['model']} at {cfg.base} over HTTP")
        if summary["num_failed"]:
            Console().print(f"failed: {summary['num_failed']} of {summary['num_requests']} requests")
        if out is not None:
            Console().print(f"wrote {out}/requests.csv, summary.json")

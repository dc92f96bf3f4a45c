"""`pagesim bench DATASET --endpoint URL`: replay a trace (or a ShareGPT JSON) against any
OpenAI-compatible server, as `vllm bench serve` does, in the schema of `pagesim replay`."""

from __future__ import annotations

import enum
import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import (COUNT, NON_NEGATIVE, OUT_DIR, POSITIVE, POSITIVE_INT, Number, check_arrival_flags,
                                check_run_size, check_workload, fail, input_file, load_trace_file, progress_bar, warn)
from pagesim.cli.config_file import config_option, given_options_line, print_reproduce, run_options
from pagesim.cli.replay import WORKLOAD, concurrency_levels, print_summary, write_sweep

EXIT_REQUESTS_FAILED = 3  # the run was measured and written, but more requests failed than allowed
SHARE = Number(lo=0, hi=1)  # [0, 1]
EndpointType = enum.Enum("EndpointType", {"completions": "completions", "chat": "chat"}, type=str)
Dataset = enum.Enum("Dataset", {"auto": "auto", "trace": "trace", "sharegpt": "sharegpt"}, type=str)


def endpoint_url(value: str) -> str:
    """An http(s) base URL: a typo here would otherwise surface as a connection error per request."""
    from urllib.parse import urlparse

    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise typer.BadParameter(f"must be an http:// or https:// URL such as http://127.0.0.1:8000, got {value!r}")
    return value


def print_failures(summary: dict, console) -> None:
    """How many requests were not measured and why: one line per kind of reason, counted."""
    lost = summary["num_failed"] + summary["num_skipped"]
    if not lost:
        return
    console.print(f"not measured: {lost} of {summary['num_requests']} requests ({summary['num_failed']} failed, "
                  f"{summary['num_skipped']} skipped)", markup=False, highlight=False)
    for reason, count in summary["failure_reasons"].items():
        console.print(f"  {count} x {reason}", markup=False, highlight=False)


def check_failures(summary: dict, allowed: float, what: str = "") -> None:
    """Exit EXIT_REQUESTS_FAILED when more than `allowed` of the requests were not measured."""
    from pagesim.bench.client import failed_share

    share = failed_share(summary)
    if share > allowed:
        typer.echo(f"error: {what}{summary['num_failed'] + summary['num_skipped']} of {summary['num_requests']} "
                   f"requests failed or were skipped ({share:.1%}, more than --max-failed-share {allowed:g}); "
                   "the results were written", err=True)
        raise typer.Exit(EXIT_REQUESTS_FAILED)


def load_tokenizer(name: Optional[str]):
    """The HF tokenizer --tokenizer names (a directory or a hub name already cached), or None."""
    if not name:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:
        fail(f"--tokenizer {name}: cannot load it ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


def load_dataset(path: Path, kind: str, tokenizer, num_requests: Optional[int], seed: int, length_scale: float):
    """The workload as a Trace: a pagesim trace, or a ShareGPT JSON tokenized with `tokenizer`."""
    from pagesim.bench.datasets import DatasetError, detect, load_sharegpt
    from pagesim.compare import scaled_trace

    from pagesim.workload.trace import find_trace

    path = input_file(find_trace(path), "dataset file")
    try:
        kind = detect(path) if kind == "auto" else kind
        loaded = load_trace_file(path) if kind == "trace" else load_sharegpt(path, tokenizer, num_requests, seed)
    except (DatasetError, OSError) as e:
        fail(str(e))
    return scaled_trace(loaded, length_scale)


@app.command()
def bench(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="dataset: a trace file (docs/traces.md) or a ShareGPT JSON"),
    config: Optional[Path] = config_option(),
    endpoint: str = typer.Option(..., parser=endpoint_url, help="the server's base URL, e.g. http://127.0.0.1:8000 (or .../v1)"),
    endpoint_type: EndpointType = typer.Option(EndpointType.completions, help="/v1/completions or /v1/chat/completions "
                                               "(chat sends text: needs --tokenizer)"),
    dataset_name: Dataset = typer.Option(Dataset.auto, help="what TRACE is (auto: a JSON array is ShareGPT, an object "
                                         "a trace)"),
    model: Optional[str] = typer.Option(None, help="model name to request (default: the server's first)"),
    rate: float = typer.Option(WORKLOAD.rate, parser=NON_NEGATIVE, help="arrival rate in req/s (0: the trace's own arrival times)"),
    burstiness: float = typer.Option(WORKLOAD.burstiness, parser=POSITIVE, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: int = typer.Option(WORKLOAD.num_requests, parser=POSITIVE_INT, help="requests to send (the trace is cycled if it holds fewer)"),
    duration: Optional[float] = typer.Option(None, parser=POSITIVE, help="seconds of arrivals instead of a request count"),
    length_scale: float = typer.Option(1.0, parser=POSITIVE, help="divide every prompt and output length by this "
                                       "(as `pagesim compare`)"),
    clamp_to_max_model_len: bool = typer.Option(False, help="shorten requests longer than the server's max_model_len "
                                                "to fit (default: skip them, each recorded with its reason)"),
    max_concurrency: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="requests in flight at once, at most"),
    concurrency: Optional[str] = typer.Option(None, help="closed loop: N clients, each sending its next request (or "
                                              "session) when its last one ended; a list (1,2,4,8) sweeps them"),
    vocab_size: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="vocabulary for synthetic prompt ids (default: the server's, "
                                             "which `pagesim serve` reports)"),
    tokenizer: Optional[str] = typer.Option(None, help="send text made with this HF tokenizer instead of token ids "
                                            "(needed for ShareGPT and chat)"),
    timeout: float = typer.Option(600.0, parser=POSITIVE, help="seconds one request may take"),
    ready_timeout: float = typer.Option(60.0, parser=NON_NEGATIVE, help="wait up to S seconds for a server that does "
                                        "not accept connections yet (one just started)"),
    scrape_interval: float = typer.Option(0.5, parser=NON_NEGATIVE, help="poll the server's /metrics every S seconds (0: never)"),
    warmup: float = typer.Option(0.0, parser=NON_NEGATIVE, help="leave requests arriving in the first S seconds out of "
                                 "latency statistics (from the first arrival of a trace's own times)"),
    max_failed_share: float = typer.Option(0.0, parser=SHARE, help="exit 3 when more than this share of the requests "
                                           "failed or was skipped (results are written either way)"),
    seed: int = typer.Option(WORKLOAD.seed, parser=COUNT, help="seed of arrivals, synthetic prompts and the ShareGPT sample"),
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

    duration = check_arrival_flags(ctx, duration=duration)  # a typed --num-requests over the file's duration
    options = run_options(ctx, duration)
    if endpoint_type.value == "chat" and not tokenizer:
        fail("--endpoint-type chat sends text: pass --tokenizer (the model's, to get the lengths right)")
    check_run_size(rate or None, num_requests, duration)
    if duration is not None:
        num_requests = None
    levels = concurrency_levels(concurrency)
    tok = load_tokenizer(tokenizer)
    loaded = load_dataset(trace, dataset_name.value, tok, num_requests, seed, length_scale)
    runs = []
    for level in levels:
        cfg = BenchConfig(endpoint=endpoint, model=model, rate=rate or None, burstiness=burstiness,
                          num_requests=num_requests, duration=duration, seed=seed, max_concurrency=max_concurrency,
                          concurrency=level, vocab_size=vocab_size, tokenizer=tokenizer, timeout_s=timeout,
                          scrape_interval_s=scrape_interval, warmup_s=warmup, endpoint_type=endpoint_type.value,
                          clamp_to_max_model_len=clamp_to_max_model_len, ready_timeout_s=ready_timeout)
        try:
            requests = bench_requests(loaded, cfg)[0]
        except ValueError as e:
            fail(str(e))
        check_workload(requests, warmup, duration)
        console = Console(stderr=True)
        label = "bench" if level is None or len(levels) == 1 else f"concurrency {level}"
        with progress_bar(label, "requests", len(requests), console, quiet=as_json) as advance:
            try:
                summary, metrics = run_bench(loaded, cfg, progress=advance, warn=warn, tokenizer=tok)
            except BenchError as e:
                fail(str(e))
        summary["trace"] = str(trace)
        if loaded.metadata.get("source") == "ShareGPT JSON":
            summary["dataset"] = loaded.metadata
            summary["notes"] = loaded.metadata["notes"] + summary["notes"]
        summary["length_scale"] = length_scale
        summary["command"] = "pagesim " + shlex.join(sys.argv[1:])
        summary["config"] = options  # `pagesim bench TRACE --config OUT/summary.json` sends the same requests again
        runs.append((level, summary, metrics))
    if len(levels) > 1:
        write_sweep(runs, trace, out, as_json)
        for _, summary, _ in runs:
            check_failures(summary, max_failed_share, f"concurrency {summary['run']['concurrency']}: ")
        return
    if out is not None:
        summary["reproduce"] = given_options_line(ctx, trace)
        with results_folder(out) as folder:
            metrics.write(folder, summary, steps=False)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n")
    else:
        from rich.markup import escape

        # the server's words (model id, notes) are printed as text, never as markup; the counted
        # failure lines stand for the per-request reasons (which carry numbers)
        print_summary({**summary, "reject_reasons": {}, "notes": []}, Console(),
                      f"{escape(summary['model'])} at {escape(cfg.base)} over HTTP ({cfg.endpoint_type})")
        for note in summary["notes"]:
            Console().print(f"note: {note}", markup=False, highlight=False)
        print_failures(summary, Console())
        if out is not None:
            Console().print(f"wrote {out}/requests.csv, summary.json", markup=False, highlight=False)
            print_reproduce(summary["reproduce"])
    check_failures(summary, max_failed_share)

"""`pagesim run TRACE`: serve a trace on the real engine (torch; Triton kernels on a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import (BLOCKS, BLOCK_SIZE, BURSTINESS, NUM_REQUESTS, POSITIVE_SECONDS, RATE_OR_TRACE,
                                RUN_OUT_DIR, SAMPLES, SECONDS, SEED, SEQS, TOKENS, check_arrival_flags, check_run_size,
                                check_workload, fail, load_trace_file, progress_bar, warn)
from pagesim.cli.config_file import config_option, given_options_line, run_options
from pagesim.cli.executor_model import (GC_DURING_STEPS_OPTION, PIN_CPU_OPTION, WARMUP_STEPS_OPTION, check_cache_fits,
                                        check_length, dtype_name, load_executor_model, noise_settings)
from pagesim.cli.replay import BATCHED_TOKENS_HELP, DEFAULTS, WORKLOAD, Policy, Preemption, emit_results
from pagesim.core.policies import uses_paged_blocks


@app.command()
def run(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="trace file (see docs/traces.md)"),
    config: Optional[Path] = config_option(),
    model: str = typer.Option(..., help="checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG (opt-tiny, llama-tiny, "
                                            "mistral-tiny, mixtral-tiny, qwen2-tiny, qwen3-tiny, qwen3-moe-tiny, "
                                            "gemma2-tiny, deepseek-v2-tiny, config.json)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, parser=dtype_name, help="float32, float16 or bfloat16 (default: fp32 on CPU, "
                                        "the checkpoint's on GPU)"),
    policy: Policy = typer.Option(DEFAULTS.policy, help="KV cache system"),
    block_size: int = typer.Option(DEFAULTS.block_size, parser=BLOCK_SIZE, help="tokens per KV block"),
    preemption: Preemption = typer.Option(DEFAULTS.preemption, help="auto: recompute single sequences, swap groups"),
    rate: float = typer.Option(WORKLOAD.rate, parser=RATE_OR_TRACE, help="arrival rate in req/s (0: the trace's own arrival times)"),
    burstiness: float = typer.Option(WORKLOAD.burstiness, parser=BURSTINESS, help="gamma arrivals: shape; 1.0 is Poisson"),
    num_requests: int = typer.Option(WORKLOAD.num_requests, parser=NUM_REQUESTS, help="requests to serve (the trace is cycled if it holds fewer; on a CPU each takes seconds to minutes: docs/cli.md, Defaults)"),
    duration: Optional[float] = typer.Option(None, parser=POSITIVE_SECONDS, help="seconds of arrivals instead of a request count"),
    max_num_seqs: int = typer.Option(DEFAULTS.max_num_seqs, parser=SEQS, help="sequences running at once, at most"),
    max_num_batched_tokens: Optional[int] = typer.Option(DEFAULTS.max_num_batched_tokens, parser=TOKENS,
                                                         help=BATCHED_TOKENS_HELP),
    max_model_len: Optional[int] = typer.Option(DEFAULTS.max_model_len, parser=TOKENS,
                                                help="longest sequence (default: the model's)"),
    num_gpu_blocks: int = typer.Option(1024, parser=BLOCKS, help="KV blocks in the device pool"),
    num_cpu_blocks: int = typer.Option(1024, parser=BLOCKS, help="KV blocks in the host (swap) pool"),
    prefix_caching: bool = typer.Option(DEFAULTS.prefix_caching, help="automatic prefix caching"),
    chunked_prefill: bool = typer.Option(DEFAULTS.chunked_prefill, help="split prompts to fill the token budget"),
    n: Optional[int] = typer.Option(None, parser=SAMPLES, help="parallel samples for every request"),
    beam_width: Optional[int] = typer.Option(None, parser=SAMPLES, help="beam search of this width for every request"),
    warmup: float = typer.Option(0.0, parser=SECONDS, help="leave requests arriving in the first S seconds out of "
                                 "latency statistics"),
    seed: int = typer.Option(WORKLOAD.seed, parser=SEED, help="seed of arrivals and synthetic prompts"),
    out: Optional[Path] = typer.Option(None, parser=RUN_OUT_DIR, help="write requests.csv, steps.csv and summary.json here"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    pin_cpu: Optional[int] = PIN_CPU_OPTION,
    warmup_steps: int = WARMUP_STEPS_OPTION,
    gc_during_steps: bool = GC_DURING_STEPS_OPTION,
) -> None:
    """Serve TRACE on the executor in wall-clock time, writing the simulator's metrics."""
    from rich.console import Console

    from dataclasses import asdict

    from pagesim.workload.requests import WorkloadConfig

    duration = check_arrival_flags(ctx, duration=duration)  # a typed --num-requests over the file's duration
    options = run_options(ctx, duration)
    noise = noise_settings(pin_cpu, warmup_steps, gc_during_steps)
    loaded_trace = load_trace_file(trace)
    check_run_size(rate or None, num_requests, duration)
    if duration is not None:
        num_requests = None
    workload = WorkloadConfig(rate=rate or None, burstiness=burstiness, num_requests=num_requests, duration=duration,
                              seed=seed, n=n, beam_width=beam_width, warmup_s=warmup)
    try:  # bad arrival settings fail here, before the model loads
        requests, _ = workload.requests(loaded_trace)
    except ValueError as e:
        fail(str(e))
    check_workload(requests, warmup, duration)
    if prefix_caching and not any(r.prompt_token_ids or r.hash_ids for r in loaded_trace.requests):
        warn(f"--prefix-caching: {trace} has no prompt_token_ids or hash_ids; synthetic prompts share no prefix, nothing is cached")

    console = Console(stderr=True)
    lm = load_executor_model(model, device, dtype, console)
    check_model_fits_trace(lm, loaded_trace, trace, model, max_model_len)
    check_cache_fits(lm, block_size, num_gpu_blocks, num_cpu_blocks, uses_paged_blocks(policy.value))

    from executor.engine import EngineConfig
    from executor.run import RunConfig, run_trace

    run_cfg = RunConfig(**asdict(workload), **noise)  # the workload checked above, on the executor's clock default
    engine_cfg = EngineConfig(policy=policy.value, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                              num_cpu_blocks=num_cpu_blocks, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                              preemption=preemption.value, chunked_prefill=chunked_prefill, prefix_caching=prefix_caching)
    with progress_bar("run", "requests", len(requests), console, quiet=as_json) as advance:
        try:
            summary, metrics = run_trace(lm, loaded_trace, engine_cfg, run_cfg, progress=advance)
        except ValueError as e:  # the engine's configuration checks (token budget against model length, ...)
            fail(str(e))
    summary["trace"] = str(trace)
    summary["model_spec"] = model
    summary["config"] = options  # `pagesim run TRACE --config OUT/summary.json` serves these requests again
    if out is not None:  # the same requests and settings again (wall-clock timings differ run to run)
        summary["reproduce"] = given_options_line(ctx, trace)
    emit_results(summary, metrics, out, as_json, f"{policy.value} · {model} on {device} · block {block_size}",
                 reproduce=summary.get("reproduce"))


def check_model_fits_trace(lm, trace, path: Path, model: str, max_model_len: int | None) -> None:
    """Token ids the model has embeddings for, and a length the model serves (check_length)."""
    check_length(lm, max_model_len, model)
    for index, record in enumerate(trace.requests):
        ids = record.prompt_token_ids
        if ids and not 0 <= min(ids) <= max(ids) < lm.vocab_size:
            bad = next(i for i in ids if not 0 <= i < lm.vocab_size)
            fail(f"{path}: request {index}: field 'prompt_token_ids' holds {bad}, outside {model}'s vocabulary of "
                 f"{lm.vocab_size} tokens (was the trace tokenized for another model?)")

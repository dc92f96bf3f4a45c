"""`pagesim serve --model MODEL`: the executor behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import logging
import sys
from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import COUNT, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Number, fail
from pagesim.cli.executor_model import check_cache_fits, check_length, dtype_name, load_executor_model
from pagesim.cli.replay import BATCHED_TOKENS_HELP, DEFAULTS, Policy, Preemption
from pagesim.core.policies import uses_paged_blocks
from pagesim.serve.limits import HttpLimits


@app.command()
def serve(
    model: str = typer.Option(..., help="checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG (opt-tiny, llama-tiny, "
                                            "mistral-tiny, mixtral-tiny, qwen2-tiny, qwen3-tiny, qwen3-moe-tiny, "
                                            "gemma2-tiny, deepseek-v2-tiny, config.json)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, parser=Number(lo=0, hi=65535, integer=True),
                             help="port to listen on (0: any free port)"),
    served_model_name: Optional[str] = typer.Option(None, help="the name clients use in `model` (default: --model)"),
    device: str = typer.Option("cpu", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, parser=dtype_name, help="float32, float16 or bfloat16 (default: fp32 on CPU, "
                                        "the checkpoint's on GPU)"),
    policy: Policy = typer.Option(DEFAULTS.policy, help="KV cache system"),
    block_size: int = typer.Option(DEFAULTS.block_size, parser=POSITIVE_INT, help="tokens per KV block"),
    preemption: Preemption = typer.Option(DEFAULTS.preemption, help="auto: recompute single sequences, swap groups"),
    max_num_seqs: int = typer.Option(DEFAULTS.max_num_seqs, parser=COUNT, help="sequences running at once, at most"),
    max_num_batched_tokens: Optional[int] = typer.Option(DEFAULTS.max_num_batched_tokens, parser=POSITIVE_INT,
                                                         help=BATCHED_TOKENS_HELP),
    max_model_len: Optional[int] = typer.Option(DEFAULTS.max_model_len, parser=POSITIVE_INT,
                                                help="longest sequence (default: the model's)"),
    num_gpu_blocks: int = typer.Option(1024, parser=COUNT, help="KV blocks in the device pool"),
    num_cpu_blocks: int = typer.Option(1024, parser=COUNT, help="KV blocks in the host (swap) pool"),
    prefix_caching: bool = typer.Option(False, help="automatic prefix caching (blocks keyed by SHA-256)"),
    chunked_prefill: bool = typer.Option(False, help="split prompts to fill the token budget"),
    threads: Optional[int] = typer.Option(None, parser=POSITIVE_INT, help="torch CPU threads (default: torch's)"),
    api_key: Optional[str] = typer.Option(None, envvar="PAGESIM_API_KEY", show_envvar=True,
                                          help="require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)"),
    log_level: str = typer.Option("info", help="critical, error, warning, info (an access line per request and "
                                  "an engine stats line), debug or trace"),
    stats_interval: float = typer.Option(5.0, parser=NON_NEGATIVE, help="seconds between engine stats lines "
                                         "while there is work (0: none)"),
    header_timeout: float = typer.Option(HttpLimits.header_timeout_s, parser=POSITIVE,
                                         help="seconds a client has to send a request's line and headers"),
    body_timeout: float = typer.Option(HttpLimits.body_timeout_s, parser=POSITIVE,
                                       help="seconds a client has to send a request's body"),
    max_body_mib: int = typer.Option(HttpLimits.max_body_bytes // 2**20, parser=POSITIVE_INT,
                                     help="largest request body in MiB (413 above)"),
    max_connections: int = typer.Option(HttpLimits.max_connections, parser=POSITIVE_INT,
                                        help="open connections at once, at most (503 above)"),
    drain_timeout: float = typer.Option(HttpLimits.drain_s, parser=POSITIVE,
                                        help="on SIGTERM / Ctrl-C: seconds open requests may still run"),
) -> None:
    """Serve MODEL over HTTP: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    try:
        from pagesim.serve.app import create_app
        from pagesim.serve.runner import AddressError, listen_socket, serve as run_server
    except ImportError as e:
        fail(f"{e.name} is missing: pip install 'pagesim[serve]'")
    from rich.console import Console

    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(f"--log-level must be critical, error, warning, info, debug or trace, got {log_level!r}")
    if api_key is not None and not api_key.strip():
        fail("--api-key: empty (leave it out to serve without a key)")
    limits = HttpLimits(header_timeout_s=header_timeout, body_timeout_s=body_timeout,
                        max_body_bytes=max_body_mib * 2**20, max_connections=max_connections,
                        drain_s=drain_timeout)
    try:  # before the model loads: a port in use is one line at once
        sock = listen_socket(host, port)
    except AddressError as e:
        fail(str(e))
    console = Console(stderr=True)
    lm = load_executor_model(model, device, dtype, console, tokenizer=True)
    check_length(lm, max_model_len, model)
    check_cache_fits(lm, block_size, num_gpu_blocks, num_cpu_blocks, uses_paged_blocks(policy.value))
    import torch

    from executor.engine import EngineConfig

    if threads:
        torch.set_num_threads(threads)
    try:  # the configuration's own checks name the flag to change
        engine_cfg = EngineConfig(policy=policy.value, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                  num_cpu_blocks=num_cpu_blocks, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                                  preemption=preemption.value, chunked_prefill=chunked_prefill,
                                  prefix_caching=prefix_caching, prefix_key="sha256")
        application = create_app(lm, engine_cfg, served_model_name or model, limits=limits, api_key=api_key,
                                 stats_interval_s=stats_interval)
    except ValueError as e:
        fail(str(e))
    _log_to_stderr(log_level)
    bound = sock.getsockname()[1]
    typer.echo(f"pagesim serve: {served_model_name or model} on http://{host}:{bound}/v1", err=True)
    status, reason = run_server(application, sock, limits, log_level)
    if reason:
        typer.echo(f"pagesim serve: {reason}; exiting", err=True)
    raise typer.Exit(status)


def _log_to_stderr(level: str) -> None:
    """pagesim.serve's loggers (access, stats, engine) to stderr, at uvicorn's --log-level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("pagesim.serve")
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG if level == "trace" else level.upper())
    logger.propagate = False

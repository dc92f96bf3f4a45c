"""`pagesim serve --model MODEL`: the executor behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from typing import Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import COUNT, POSITIVE_INT, fail
from pagesim.cli.executor_model import check_cache_fits, dtype_name, load_executor_model
from pagesim.cli.replay import BATCHED_TOKENS_HELP, DEFAULTS, Policy, Preemption


@app.command()
def serve(
    model: str = typer.Option(..., help="checkpoint DIR, gguf:PATH, smollm2, or random:CONFIG (opt-tiny, llama-tiny, "
                                            "mistral-tiny, mixtral-tiny, qwen2-tiny, qwen3-tiny, qwen3-moe-tiny, "
                                            "gemma2-tiny, deepseek-v2-tiny, config.json)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, parser=COUNT, help="port to listen on (0: any free port)"),
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
    log_level: str = typer.Option("warning", help="uvicorn log level: critical, error, warning, info, debug or trace"),
) -> None:
    """Serve MODEL over HTTP: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    try:
        import uvicorn

        from pagesim.serve.app import create_app
    except ImportError as e:
        fail(f"{e.name} is missing: pip install 'pagesim[serve]'")
    from rich.console import Console

    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(f"--log-level must be critical, error, warning, info, debug or trace, got {log_level!r}")
    console = Console(stderr=True)
    lm = load_executor_model(model, device, dtype, console, tokenizer=True)
    check_cache_fits(lm, block_size, num_gpu_blocks, num_cpu_blocks)
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
        application = create_app(lm, engine_cfg, served_model_name or model)
    except ValueError as e:
        fail(str(e))
    typer.echo(f"pagesim serve: {served_model_name or model} on http://{host}:{port}/v1", err=True)
    uvicorn.run(application, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)

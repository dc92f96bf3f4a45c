"""`pagesim route --backend URL [--backend URL ...] [--router R]`: an OpenAI-compatible HTTP router
in front of real servers, deciding with the simulator's router objects (pagesim.route)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import List, Optional

import typer

from pagesim.cli import app
from pagesim.cli.checks import OUT_FILE, POSITIVE, POSITIVE_INT, Number, fail
from pagesim.serve.limits import HttpLimits


def router_params(pairs: list[str]) -> dict:
    """--router-param KEY=VALUE ...: a value reads as JSON (3, 0.5, true) or else as text."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"--router-param {pair!r}: expected KEY=VALUE (e.g. load_weight=1.5)")
        try:
            params[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip().replace("-", "_")] = value
    return params


@app.command()
def route(
    backend: List[str] = typer.Option(..., help="a server to route to, http://HOST:PORT (repeat the flag for each)"),
    router: str = typer.Option("round-robin", help="round-robin, random, least-outstanding, least-kv, power-of-two, "
                               "prefix-affinity, cache-aware or session-affinity (docs/routers.md)"),
    router_param: List[str] = typer.Option([], help="a router parameter KEY=VALUE (repeat; docs/routers.md)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8080, parser=Number(lo=0, hi=65535, integer=True), help="port to listen on (0: any free)"),
    staleness: float = typer.Option(1.0, parser=POSITIVE, help="seconds between reads of the backends' /metrics "
                                    "(the load-aware routers' waiting / running / KV usage)"),
    block_size: int = typer.Option(16, parser=POSITIVE_INT, help="tokens (or characters) per prefix key"),
    tokenizer: Optional[Path] = typer.Option(None, help="a local Hugging Face tokenizer directory: text prompts are "
                                             "matched by its tokens (default: by characters)"),
    session_header: str = typer.Option("x-session-id", help="the request header naming a session (session-affinity)"),
    timeout: float = typer.Option(600.0, parser=POSITIVE, help="seconds one backend request may take"),
    decisions: Optional[Path] = typer.Option(None, parser=OUT_FILE, help="write every routing decision here "
                                             "(JSON lines: what the router saw and chose)"),
    log_level: str = typer.Option("info", help="critical, error, warning, info (an access line per request) or debug"),
    max_connections: int = typer.Option(HttpLimits.max_connections, parser=POSITIVE_INT,
                                        help="open client connections at once, at most (503 above)"),
) -> None:
    """Route OpenAI requests over BACKENDs: /v1/completions, /v1/chat/completions (streams pass through),
    /v1/models, /health, /metrics."""
    try:
        from pagesim.route.app import RouteConfig, create_app
        from pagesim.serve.runner import AddressError, guarded_server, listen_socket
    except ImportError as e:
        fail(f"{e.name} is missing: pip install 'pagesim[serve]'")

    if log_level not in ("critical", "error", "warning", "info", "debug"):
        fail(f"--log-level must be critical, error, warning, info or debug, got {log_level!r}")
    try:
        cfg = RouteConfig(backends=backend, router=router, router_params=router_params(router_param),
                          staleness_s=staleness, block_size=block_size, session_header=session_header,
                          timeout_s=timeout, decisions=str(decisions) if decisions else None)
    except ValueError as e:
        fail(str(e))
    except TypeError as e:  # a parameter of the wrong type reaching a router's checks
        fail(f"--router-param: {e}")
    text_tokenizer = _load_tokenizer(tokenizer) if tokenizer else None
    limits = HttpLimits(max_connections=max_connections)
    try:
        sock = listen_socket(host, port)
    except AddressError as e:
        fail(str(e))
    _log_to_stderr(log_level)
    application = create_app(cfg, limits=limits, tokenizer=text_tokenizer)
    bound = sock.getsockname()[1]
    typer.echo(f"pagesim route: {router} over {len(cfg.backends)} backends on http://{host}:{bound}/v1", err=True)
    server = guarded_server(application, limits, log_level)
    server.run(sockets=[sock])
    raise typer.Exit(0 if server.started else 1)


def _load_tokenizer(path: Path):
    if not path.is_dir():
        fail(f"--tokenizer {path}: not a directory (a local Hugging Face tokenizer is needed; nothing is downloaded)")
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load is the user's input
        fail(f"--tokenizer {path}: cannot load a tokenizer there ({type(e).__name__}: {e})")

    class Text:
        def encode(self, text: str) -> list[int]:
            return list(hf.encode(text, add_special_tokens=False))

    return Text()


def _log_to_stderr(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    for name in ("pagesim.route", "pagesim.serve.access"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False

"""The router's FastAPI application: /v1/completions and /v1/chat/completions forwarded (the
body unchanged) to the backend the router picks, /v1/models (the backends' models, merged),
/health (200 while a backend is up) and /metrics (the router's own counters, and the backends'
last gauges summed under vLLM's names, so `pagesim bench` through the router still sees the
fleet's running batch). Errors have OpenAI's body, as `pagesim serve`'s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from pagesim.cluster.routers import LoadBoard, make_router
from pagesim.route.backends import Backend, backend_url, exception_reason, scrape, scrape_every
from pagesim.route.decisions import DecisionLog
from pagesim.route.proxy import Proxy
from pagesim.serve.bodies import ApiError
from pagesim.serve.http_guard import ServeGuard, http_error
from pagesim.serve.limits import HttpLimits
from pagesim.serve.protocol import error_body

log = logging.getLogger("pagesim.route")


@dataclass
class RouteConfig:
    backends: list[str]
    router: str = "round-robin"
    router_params: dict = field(default_factory=dict)
    staleness_s: float = 1.0  # seconds between scrapes of the backends' /metrics
    block_size: int = 16  # tokens (or characters) per prefix key
    session_header: str = "x-session-id"
    timeout_s: float = 600.0  # one backend request, at most
    decisions: str | None = None  # the decision log (JSON lines), if wanted

    def __post_init__(self):
        if not self.backends:
            raise ValueError("--backend: at least one is needed")
        self.backends = [backend_url(b) for b in self.backends]
        if len(set(self.backends)) != len(self.backends):
            raise ValueError("--backend: the same backend is given twice")
        if not 0 < self.staleness_s < float("inf"):
            raise ValueError(f"--staleness must be a finite number > 0, got {self.staleness_s}")
        if self.block_size < 1:
            raise ValueError(f"--block-size must be >= 1, got {self.block_size}")
        make_router(self.router, **self.router_params)  # its own checks, before anything starts


def create_app(cfg: RouteConfig, *, limits: HttpLimits | None = None, tokenizer=None) -> FastAPI:
    import aiohttp

    backends = [Backend(i, url) for i, url in enumerate(cfg.backends)]
    board = LoadBoard(len(backends), cfg.staleness_s)
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        proxy = Proxy(backends, make_router(cfg.router, **cfg.router_params), board, session, cfg.block_size,
                      tokenizer, cfg.session_header.lower(), cfg.timeout_s, DecisionLog(cfg.decisions))
        state["proxy"] = proxy
        await asyncio.gather(*(scrape(session, b, board) for b in backends))  # who is up, before the first request
        for b in backends:
            log.info("backend %s: %s", b.url, "up" if b.up else f"down, {b.reason}")
        scraper = asyncio.ensure_future(scrape_every(session, backends, board, cfg.staleness_s))
        try:
            yield
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
            await session.close()
            proxy.log.close()

    app = FastAPI(title="pagesim route", lifespan=lifespan)
    app.state.backends, app.state.board = backends, board
    app.add_middleware(ServeGuard, limits=limits or HttpLimits())

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse(error_body(str(exc), exc.kind, exc.param, exc.code), status_code=exc.status)

    app.add_exception_handler(HTTPException, http_error)  # an unknown route or method, as `pagesim serve` answers it

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception):
        log.exception("internal error answering %s %s", request.method, request.url.path)
        # uvicorn closes the connection after it (the handler re-raises): say so, or a client's next request
        # on it (a router's pooled connection) fails as if this server were down
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500,
                            headers={"connection": "close"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await state["proxy"].forward(request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await state["proxy"].forward(request, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models():
        session = state["proxy"].session
        merged: dict[str, dict] = {}
        reasons = []
        for b in backends:
            if not b.up:
                reasons.append(f"{b.url}: {b.reason}")
                continue
            try:
                async with session.get(f"{b.url}/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    data = await resp.json(content_type=None)
                for model in data.get("data", []):
                    merged.setdefault(model.get("id"), model)
            except Exception as e:  # noqa: BLE001 - one backend's odd answer leaves the others'
                reasons.append(f"{b.url}: {exception_reason(e)}")
        if not merged:
            return JSONResponse(error_body(f"no backend listed its models ({'; '.join(reasons)})", "server_error"),
                                status_code=503)
        return {"object": "list", "data": list(merged.values())}

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what load balancers and `curl -I` probe with
    async def health():
        if any(b.up for b in backends):
            return Response(status_code=200)
        reasons = "; ".join(f"{b.url}: {b.reason}" for b in backends)
        return JSONResponse(error_body(f"no backend is up ({reasons})", "server_error"), status_code=503)

    @app.get("/metrics")
    async def metrics():
        proxy = state["proxy"]
        return PlainTextResponse(render_metrics(backends, board, proxy.outcomes),
                                 media_type="text/plain; version=0.0.4")

    return app


def render_metrics(backends: list[Backend], board: LoadBoard, outcomes: dict[str, int]) -> str:
    lines = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    per = lambda attr: [(f'{{backend="{b.url}"}}', getattr(b, attr)) for b in backends]  # noqa: E731
    metric("pagesim:router_requests_routed_total", "counter", "Requests sent to each backend (retries included).",
           per("routed"))
    metric("pagesim:router_request_failures_total", "counter", "Requests that failed at each backend.",
           per("failures"))
    metric("pagesim:router_retries_total", "counter", "Requests moved from each backend to another.", per("retries"))
    metric("pagesim:router_outstanding", "gauge", "Requests sent to each backend and not ended.",
           [(f'{{backend="{b.url}"}}', board.loads[b.index].outstanding) for b in backends])
    metric("pagesim:router_backend_up", "gauge", "1 while a backend takes requests.",
           [(f'{{backend="{b.url}"}}', int(b.up)) for b in backends])
    metric("pagesim:router_requests_total", "counter", "Requests by how they ended.",
           [(f'{{outcome="{k}"}}', v) for k, v in outcomes.items()])
    read = [b.gauges for b in backends if b.up and b.gauges is not None]
    metric("vllm:num_requests_running", "gauge", "Running requests, summed over the backends' last readings.",
           [("", sum(g.running for g in read))])
    metric("vllm:num_requests_waiting", "gauge", "Waiting requests, summed over the backends' last readings.",
           [("", sum(g.waiting for g in read))])
    if read:
        metric("vllm:kv_cache_usage_perc", "gauge", "KV cache usage, the mean of the backends' last readings.",
               [("", sum(g.kv_usage for g in read) / len(read))])
    return "\n".join(lines) + "\n"

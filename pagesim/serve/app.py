"""The FastAPI application: OpenAI's /v1/completions and /v1/chat/completions (streamed as
server-sent events in OpenAI's chunk format), /v1/models, /health and /metrics, over one
EngineLoop (pagesim/serve/generation.py turns bodies into engine requests and back).

Every answer that is not a success has OpenAI's error body, {"error": {"message", "type",
"param", "code"}}: bad JSON (the body is parsed here, so a 100k-deep nesting or a 5000-digit
number is a 400 that says so), invalid fields, an unknown model (404), an unknown route (404)
or method (405), a failed engine step (500), and any bug (500)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from executor.engine import EngineConfig
from pagesim.serve.bodies import GONE, ApiError, BadRequest, parse_json, until_disconnect
from pagesim.serve.generation import SampleState, Server
from pagesim.serve.http_guard import ServeGuard, http_error
from pagesim.serve.limits import HttpLimits
from pagesim.serve.protocol import ChatRequest, CompletionRequest, Ids, error_body
from pagesim.serve.responses import build_response, record_usage, stream_events
from pagesim.serve.stats_log import log_stats_every

log = logging.getLogger("pagesim.serve")


_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|.*\[.*\])$")  # pydantic's name for one type of a union


def parse_body(raw: bytes, model: type[BaseModel]):
    """The request body as `model`, or BadRequest saying what is wrong with it."""
    data = parse_json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        # a field of several accepted types gets an error per type: the one past the type check
        # ("at most 32 items", "greater than 0") says more than "should be a valid string"
        errors = e.errors()
        first = next((x for x in errors if not x["type"].endswith("_type")), errors[0])
        where = ".".join(str(p) for p in first.get("loc", ()) if not _TYPE_TAG.match(str(p))) or "body"
        raise BadRequest(f"{where}: {first.get('msg')}", where) from None
    except RecursionError:  # nesting pydantic walks (inside a field it validates)
        raise BadRequest("body: the JSON is nested too deeply", "body") from None


def create_app(lm, engine_cfg: EngineConfig, model_name: str, *, limits: HttpLimits | None = None,
               api_key: str | None = None, stats_interval_s: float = 5.0) -> FastAPI:
    """stats_interval_s: seconds between engine stats lines in the log (0: none)."""
    server = Server(lm, engine_cfg, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.loop.start()
        stats_task = asyncio.ensure_future(log_stats_every(server.stats, stats_interval_s)) if stats_interval_s else None
        try:
            yield
        finally:
            if stats_task is not None:
                stats_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stats_task
            server.loop.stop()

    app = FastAPI(title="pagesim serve", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(ServeGuard, limits=limits or HttpLimits(), api_key=api_key)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return JSONResponse(error_body(str(exc), exc.kind, exc.param, exc.code), status_code=exc.status)

    app.add_exception_handler(HTTPException, http_error)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception):
        log.exception("internal error answering %s %s", request.method, request.url.path)
        # uvicorn closes the connection after it (the handler re-raises): say so, or a client's next request
        # on it (a router's pooled connection) fails as if this server were down
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500,
                            headers={"connection": "close"})

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what load balancers and `curl -I` probe with
    async def health():
        if not server.loop.alive:
            return JSONResponse(error_body(f"engine stopped: {server.loop.error!r}", "server_error"), status_code=500)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.stats.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "pagesim",
            "max_model_len": server.max_model_len, "vocab_size": lm.vocab_size,
            "tokenizer": server.tokenizer.kind}]}

    async def run(request: Request, kind: str):
        body = parse_body(await request.body(), CompletionRequest if kind == "completion" else ChatRequest)
        prompt_ids = server.prompt_ids(body)
        params = server.sampling(body, len(prompt_ids), 16 if kind == "completion" else None)
        stops = body.stop_strings()
        samples = [SampleState() for _ in range(body.n)]
        record = request.scope.get("state", {}).get("usage", {})
        want_logprobs = body.logprobs if kind == "completion" else (body.logprobs or None)
        ids = Ids("cmpl" if kind == "completion" else "chatcmpl")
        gen = server.generate(prompt_ids, params, stops, samples)
        # wait for the first step's tokens (or a refusal, answered 400) before the response starts,
        # watching for a client that leaves meanwhile
        first = await until_disconnect(request, anext(gen, None))
        if first is GONE:
            await gen.aclose()
            return Response(status_code=499)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream_events(server, gen, first, samples, stops, ids, kind, want_logprobs,
                                                   include_usage, len(prompt_ids), record, body.return_token_ids),
                                     media_type="text/event-stream")
        rest = await until_disconnect(request, _drain(gen, first))
        if rest is GONE:
            await gen.aclose()
            return Response(status_code=499)
        record_usage(record, samples, len(prompt_ids))
        return build_response(server, samples, ids, kind, want_logprobs, len(prompt_ids), body.return_token_ids)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await run(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await run(request, "chat")

    return app


async def _drain(gen, first):
    if first is None:
        return
    async for _ in gen:
        pass

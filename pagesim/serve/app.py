"""The FastAPI application: OpenAI's /v1/completions and /v1/chat/completions (streamed as
server-sent events in OpenAI's chunk format), /v1/models, /health and /metrics, over one
EngineLoop.

A request becomes one engine request of n samples. Text is decoded here, not in the engine
thread; a stop string ends a sample here (its later tokens are dropped) and, once every sample
has ended, aborts the engine request so its blocks are freed at once. A client that goes away
aborts its request the same way."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from executor.engine import EngineConfig, LLMEngine
from pagesim.core import SamplingParams
from pagesim.serve.engine_loop import EngineLoop, RequestUpdate
from pagesim.serve.metrics import ServerStats
from pagesim.serve.protocol import ChatRequest, CompletionRequest, Ids, SamplingFields, error_body, usage
from pagesim.serve.tokenizer import PromptError, server_tokenizer


class EngineUnavailable(Exception):
    """The engine thread died: the server answers 503 (and /health 500) from then on."""


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass
class SampleState:
    """One sample's output as the client sees it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""  # decoded, cut at a stop string
    sent: int = 0  # characters of text already streamed
    finish_reason: str | None = None


@dataclass
class Server:
    lm: object
    engine_cfg: EngineConfig
    model_name: str

    def __post_init__(self):
        self.tokenizer = server_tokenizer(self.lm)
        self.engine = LLMEngine(self.lm, self.engine_cfg)
        self.max_model_len = self.engine.scheduler.config.max_model_len
        self.stats = ServerStats(self.model_name, self.engine_cfg.num_gpu_blocks)
        self.loop = EngineLoop(self.engine, self.stats)

    # -- requests -> engine requests ---------------------------------------------------------
    def prompt_ids(self, body: CompletionRequest | ChatRequest) -> list[int]:
        if body.model != self.model_name:
            raise BadRequest(f"The model `{body.model}` does not exist; this server serves `{self.model_name}`.",
                             "model", "model_not_found")
        try:
            if isinstance(body, ChatRequest):
                return self.tokenizer.chat_prompt([m.model_dump() for m in body.messages])
            prompt = body.prompt
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
                if len(prompt) != 1:
                    raise BadRequest(f"a list of {len(prompt)} prompts: this server takes one prompt per request", "prompt")
                prompt = prompt[0]
            if isinstance(prompt, str):
                return self.tokenizer.encode(prompt)
            bad = [t for t in prompt if not 0 <= t < self.lm.vocab_size]
            if bad:
                raise BadRequest(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.lm.vocab_size - 1})", "prompt")
            return list(prompt)
        except PromptError as e:
            raise BadRequest(str(e), "prompt") from None

    def sampling(self, body: SamplingFields, prompt_len: int, default_max: int | None) -> SamplingParams:
        if prompt_len == 0:
            raise BadRequest("the prompt is empty", "prompt")
        max_tokens = body.max_tokens or getattr(body, "max_completion_tokens", None) or default_max
        if max_tokens is None:
            max_tokens = self.max_model_len - prompt_len
        if prompt_len + max_tokens > self.max_model_len:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                             f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} in the completion).",
                             "max_tokens", "context_length_exceeded")
        if body.n > self.engine_cfg.max_num_seqs:
            raise BadRequest(f"n={body.n} exceeds the server's max_num_seqs {self.engine_cfg.max_num_seqs}", "n")
        return SamplingParams(n=body.n, max_tokens=max_tokens, ignore_eos=body.ignore_eos, temperature=body.temperature,
                              top_p=body.top_p, top_k=body.top_k, seed=body.seed)

    # -- one generation ---------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, stops: list[str], samples: list[SampleState]):
        """Yields the indices of the samples that changed after each engine step, until every
        sample has ended. Aborts the engine request if it is left early (stop string, client
        gone). An engine refusal raises BadRequest before anything is yielded."""
        try:
            request_id, updates = self.loop.submit(prompt_ids, params)
        except RuntimeError as e:
            raise EngineUnavailable(str(e)) from None
        engine_done = False
        try:
            while True:
                update: RequestUpdate = await updates.get()
                if update.error is not None:
                    raise (EngineUnavailable if update.engine_failed else BadRequest)(update.error)
                engine_done = update.finished
                changed = [d.index for d in update.samples if self._apply(samples[d.index], d, stops)]
                if changed or engine_done:
                    yield changed
                if engine_done or all(s.finish_reason for s in samples):
                    return
        finally:
            if not engine_done:
                self.loop.abort(request_id)

    def _apply(self, state: SampleState, delta, stops: list[str]) -> bool:
        if state.finish_reason is not None:
            return False  # ended at a stop string: tokens still in flight are dropped
        state.token_ids += delta.token_ids
        state.logprobs += delta.logprobs
        text = self.tokenizer.decode(state.token_ids)
        for stop in stops:
            at = text.find(stop, max(0, len(state.text) - len(stop)))
            if at >= 0:
                text, state.finish_reason = text[:at], "stop"
        state.text = text
        if state.finish_reason is None:
            state.finish_reason = delta.finish_reason
        return True

    @staticmethod
    def streamable(state: SampleState, stops: list[str]) -> str:
        """Text not yet streamed that no later token can change: a trailing partial UTF-8
        character, or a tail that may begin a stop string, waits for the next token."""
        end = len(state.text)
        if state.finish_reason is None:
            while end > state.sent and state.text[end - 1] == "\ufffd":
                end -= 1
            for stop in stops:
                for k in range(min(len(stop) - 1, end - state.sent), 0, -1):
                    if state.text[end - k:end] == stop[:k]:
                        end -= k
                        break
        delta = state.text[state.sent:end]
        state.sent = max(state.sent, end)
        return delta


def _completion_logprobs(server: Server, ids: list[int], logprobs: list[float]) -> dict:
    tokens = [server.tokenizer.token_text(t) for t in ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": offsets}


def _chat_logprobs(server: Server, ids: list[int], logprobs: list[float]) -> dict:
    content = []
    for t, lp in zip(ids, logprobs):
        text = server.tokenizer.token_text(t)
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def create_app(lm, engine_cfg: EngineConfig, model_name: str) -> FastAPI:
    server = Server(lm, engine_cfg, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.loop.start()
        yield
        server.loop.stop()

    app = FastAPI(title="pagesim serve", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        where = "body" if first.get("type") == "json_invalid" else (".".join(loc) or "body")
        return JSONResponse(error_body(f"{where}: {first.get('msg')}", param=where), status_code=400)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest):
        return JSONResponse(error_body(str(exc), param=exc.param, code=exc.code), status_code=400)

    @app.exception_handler(EngineUnavailable)
    async def unavailable(request: Request, exc: EngineUnavailable):
        return JSONResponse(error_body(str(exc), "server_error"), status_code=503)

    @app.get("/health")
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

    async def run(request: Request, body, kind: str):
        prompt_ids = server.prompt_ids(body)
        params = server.sampling(body, len(prompt_ids), 16 if kind == "completion" else None)
        stops = body.stop_strings()
        samples = [SampleState() for _ in range(body.n)]
        want_logprobs = body.logprobs if kind == "completion" else (body.logprobs or None)
        ids = Ids("cmpl" if kind == "completion" else "chatcmpl")
        gen = server.generate(prompt_ids, params, stops, samples)
        # wait for the first step's tokens (or a refusal, answered 400) before the response starts,
        # watching for a client that leaves meanwhile
        first = await _until_disconnect(request, anext(gen, None))
        if first is _GONE:
            await gen.aclose()
            return Response(status_code=499)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(server, gen, first, samples, stops, ids, kind, want_logprobs, include_usage,
                                             len(prompt_ids)), media_type="text/event-stream")
        rest = await _until_disconnect(request, _drain(gen, first))
        if rest is _GONE:
            await gen.aclose()
            return Response(status_code=499)
        return _response(server, samples, ids, kind, want_logprobs, len(prompt_ids))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        return await run(request, body, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatRequest):
        return await run(request, body, "chat")

    return app


_GONE = object()


async def _until_disconnect(request: Request, awaitable):
    """awaitable's result, or _GONE if the client disconnects first."""
    work = asyncio.ensure_future(awaitable)

    async def gone():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(gone())
    await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if work.done():
        return work.result()
    work.cancel()
    # wait for the cancellation to land, so the caller may close the generator it was driving
    await asyncio.gather(work, return_exceptions=True)
    return _GONE


async def _drain(gen, first):
    if first is None:
        return
    async for _ in gen:
        pass


def _response(server: Server, samples: list[SampleState], ids: Ids, kind: str, want_logprobs, prompt_len: int) -> dict:
    choices = []
    for i, s in enumerate(samples):
        if kind == "completion":
            lp = _completion_logprobs(server, s.token_ids, s.logprobs) if want_logprobs is not None else None
            choices.append({"index": i, "text": s.text, "logprobs": lp, "finish_reason": s.finish_reason})
        else:
            lp = _chat_logprobs(server, s.token_ids, s.logprobs) if want_logprobs else None
            choices.append({"index": i, "message": {"role": "assistant", "content": s.text}, "logprobs": lp,
                            "finish_reason": s.finish_reason})
    return {"id": ids.id, "object": "text_completion" if kind == "completion" else "chat.completion",
            "created": ids.created, "model": server.model_name, "choices": choices,
            "usage": usage(prompt_len, sum(len(s.token_ids) for s in samples))}


async def _stream(server: Server, gen, first, samples, stops, ids: Ids, kind: str, want_logprobs, include_usage: bool,
                  prompt_len: int):
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"

    def chunk(choices: list[dict]) -> str:
        return _sse({"id": ids.id, "object": obj, "created": ids.created, "model": server.model_name,
                     "choices": choices, **({"usage": None} if include_usage else {})})

    streamed_tokens = [0] * len(samples)  # tokens whose log-probs went out

    def choice(i: int) -> dict | None:
        s = samples[i]
        text = server.streamable(s, stops)
        if not text and s.finish_reason is None:
            return None
        new_ids = s.token_ids[streamed_tokens[i]:]
        new_lps = s.logprobs[streamed_tokens[i]:len(s.token_ids)]
        streamed_tokens[i] = len(s.token_ids)
        if kind == "completion":
            lp = _completion_logprobs(server, new_ids, new_lps) if want_logprobs is not None else None
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": s.finish_reason}
        lp = _chat_logprobs(server, new_ids, new_lps) if want_logprobs else None
        delta = {"content": text} if text else {}
        return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": s.finish_reason}

    finished = set()
    try:
        if kind == "chat":
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for i in range(len(samples))])
        changed = first
        while changed is not None:
            for i in changed:
                if i in finished:
                    continue
                c = choice(i)
                if c is not None:
                    if c["finish_reason"] is not None:
                        finished.add(i)
                    yield chunk([c])
            changed = await anext(gen, None)
        for i in range(len(samples)):  # anything held back, and the finish of every sample
            if i not in finished:
                samples[i].finish_reason = samples[i].finish_reason or "abort"
                c = choice(i)
                yield chunk([c])
        if include_usage:
            yield _sse({"id": ids.id, "object": obj, "created": ids.created, "model": server.model_name, "choices": [],
                        "usage": usage(prompt_len, sum(len(s.token_ids) for s in samples))})
        yield _sse("[DONE]")
    finally:
        await gen.aclose()  # a client gone mid-stream lands here: the engine request is aborted

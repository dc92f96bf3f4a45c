"""The shapes of what the server sends: a whole response, or a stream of server-sent events in
OpenAI's chunk format (one chunk per sample per token, finish_reason on a sample's last chunk, an
optional usage chunk, then `data: [DONE]`). An error after the stream has started is sent as an
OpenAI error event, then [DONE]."""

from __future__ import annotations

import json

from pagesim.serve.generation import ApiError, SampleState, Server
from pagesim.serve.protocol import Ids, error_body, usage


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

def build_response(server: Server, samples: list[SampleState], ids: Ids, kind: str, want_logprobs, prompt_len: int,
                   return_token_ids: bool = False) -> dict:
    choices = []
    for i, s in enumerate(samples):
        if kind == "completion":
            lp = _completion_logprobs(server, s.token_ids, s.logprobs) if want_logprobs is not None else None
            choices.append({"index": i, "text": s.text, "logprobs": lp, "finish_reason": s.finish_reason})
        else:
            lp = _chat_logprobs(server, s.token_ids, s.logprobs) if want_logprobs else None
            choices.append({"index": i, "message": {"role": "assistant", "content": s.text}, "logprobs": lp,
                            "finish_reason": s.finish_reason})
        if return_token_ids:
            choices[-1]["token_ids"] = list(s.token_ids)
    return {"id": ids.id, "object": "text_completion" if kind == "completion" else "chat.completion",
            "created": ids.created, "model": server.model_name, "choices": choices,
            "usage": usage(prompt_len, sum(len(s.token_ids) for s in samples))}


def record_usage(record: dict, samples: list[SampleState], prompt_len: int) -> None:
    """What the access log line says of a request (the dict the HTTP guard put in its scope)."""
    record.update(usage(prompt_len, sum(len(s.token_ids) for s in samples)),
                  finish_reasons=sorted({s.finish_reason or "abort" for s in samples}))


async def stream_events(server: Server, gen, first, samples, stops, ids: Ids, kind: str, want_logprobs,
                        include_usage: bool, prompt_len: int, record: dict, return_token_ids: bool = False):
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
        token_ids = {"token_ids": new_ids} if return_token_ids else {}
        if kind == "completion":
            lp = _completion_logprobs(server, new_ids, new_lps) if want_logprobs is not None else None
            return {"index": i, "text": text, "logprobs": lp, "finish_reason": s.finish_reason, **token_ids}
        lp = _chat_logprobs(server, new_ids, new_lps) if want_logprobs else None
        delta = {"content": text} if text else {}
        return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": s.finish_reason, **token_ids}

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
            try:
                changed = await anext(gen, None)
            except ApiError as e:  # the response has started: the error goes out as an event
                yield _sse(error_body(str(e), e.kind, e.param, e.code))
                yield _sse("[DONE]")
                return
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
        record_usage(record, samples, prompt_len)
        await gen.aclose()  # a client gone mid-stream lands here: the engine request is aborted

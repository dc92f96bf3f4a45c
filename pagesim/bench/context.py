"""Requests longer than the server's context (`max_model_len` from /v1/models): a server refuses
them (HTTP 400), so bench does not send them blind. By default each is skipped, recorded as
rejected with its reason; with clamp, it is shortened to fit (the prompt to at most
max_model_len - 1 tokens, then the output to what is left), as a user would cut it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pagesim.core import Request


@dataclass
class ContextFit:
    requests: list[Request]  # to send, in order (clamped where needed)
    skipped: dict[int, str] = field(default_factory=dict)  # request_id -> reason, not sent
    num_clamped: int = 0

    def note(self, max_model_len: int) -> str | None:
        if self.skipped:
            return (f"{len(self.skipped)} requests need more than the server's max_model_len {max_model_len} tokens "
                    "(prompt + output) and were not sent; --clamp-to-max-model-len shortens them, --length-scale "
                    "divides every length")
        if self.num_clamped:
            return f"{self.num_clamped} requests shortened to the server's max_model_len {max_model_len} tokens"
        return None


def fit_to_context(requests: list[Request], max_model_len: int | None, clamp: bool) -> ContextFit:
    if max_model_len is None:
        return ContextFit(list(requests))
    fit = ContextFit([])
    for req in requests:
        need = req.prompt_len + req.sampling.max_tokens
        if need <= max_model_len:
            fit.requests.append(req)
        elif clamp and max_model_len >= 2:
            fit.requests.append(clamped(req, max_model_len))
            fit.num_clamped += 1
        else:
            fit.skipped[req.request_id] = (f"skipped: prompt {req.prompt_len} + output {req.sampling.max_tokens} "
                                           f"tokens exceed the server's max_model_len {max_model_len}")
    return fit


def clamped(req: Request, max_model_len: int) -> Request:
    prompt_len = min(req.prompt_len, max_model_len - 1)
    ids = req.prompt_token_ids[:prompt_len] if req.prompt_token_ids is not None else None
    hashed = req.hashed_prompt.truncated(prompt_len) if req.hashed_prompt is not None else None
    sampling = replace(req.sampling, max_tokens=min(req.sampling.max_tokens, max_model_len - prompt_len))
    return replace(req, prompt_len=prompt_len, sampling=sampling, prompt_token_ids=ids, hashed_prompt=hashed)

"""OpenAI's request bodies (the fields this server honours) and the shapes of its responses and
stream chunks. Unknown fields are accepted and ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

import time
import uuid
from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # vLLM's extension; 0 = off
    n: int = Field(1, ge=1)
    seed: Optional[int] = Field(None, ge=-2**63, le=2**63 - 1)  # what a torch generator takes, + n
    stop: Optional[Union[str, list[str]]] = None
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens (trace replay)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Ids:
    """The id and creation time shared by a response and all of its chunks."""

    def __init__(self, prefix: str):
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}

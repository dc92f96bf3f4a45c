"""OpenAI's request bodies (the fields this server honours) and the shapes of its responses and
stream chunks. Unknown fields are accepted and ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP_STRINGS = 32  # each is searched for after every token, in the event loop


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None  # None: the served model (as recent vLLM)
    max_tokens: Optional[int] = Field(None, ge=1)
    # a temperature below executor.sampler.SAMPLING_EPS samples greedily, as vLLM's
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)  # vLLM's extension; 0 or -1 = off
    n: int = Field(1, ge=1)
    seed: Optional[int] = Field(None, ge=-2**63, le=2**63 - 1)  # what a torch generator takes, + n
    stop: Optional[Union[str, Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)]]] = None
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens (trace replay)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    return_token_ids: bool = False  # vLLM's extension (0.10.2+): each choice carries its generated ids

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)


class ContentPart(BaseModel):
    """One part of a message's content (OpenAI's list form); only text parts are served."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Union[str, list[ContentPart], None] = None  # None: an assistant turn without text

    def text(self, index: int) -> str:
        """The content as text: a list of text parts is joined with newlines, as vLLM does.
        ValueError names the first part that is not text."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for k, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise ValueError(f"messages[{index}].content[{k}] is of type {part.type!r}: this server takes "
                                 "text parts only ({\"type\": \"text\", \"text\": ...})")
            texts.append(part.text)
        return "\n".join(texts)


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

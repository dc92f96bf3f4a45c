"""What the router knows of a request: its prompt as token ids (given as ids, or text tokenized
by a tokenizer when one is given, else by characters as SGLang's router matches text), their
chained block keys, and its session (a header)."""

from __future__ import annotations

from typing import Any

from pagesim.cluster.routers import RoutedRequest, prefix_keys
from pagesim.serve.bodies import BadRequest


def prompt_of(data: dict, chat: bool) -> list[int] | str:
    """The prompt a body asks about: token ids or text. A batch of prompts is routed by its first
    (the whole batch goes to one backend); a chat is its messages' roles and texts, joined."""
    if chat:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: a non-empty list is required", "messages")
        return "\n".join(f"{m.get('role', '')}: {_text(m.get('content'))}" if isinstance(m, dict) else ""
                         for m in messages)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise BadRequest("prompt: must be a string, a list of token ids, or a list of either", "prompt")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def routed_request(data: Any, chat: bool, request_id: int, block_size: int, tokenizer=None,
                   session_id: str | None = None) -> RoutedRequest:
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object", "body")
    prompt = prompt_of(data, chat)
    if isinstance(prompt, str) and tokenizer is not None:
        prompt = list(tokenizer.encode(prompt))
    return RoutedRequest(request_id=request_id, prompt_len=len(prompt), prefix_keys=prefix_keys(prompt, block_size),
                         session_id=session_id)

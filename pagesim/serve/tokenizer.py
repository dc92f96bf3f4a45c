"""Text <-> token ids for the server: the model's own tokenizer, or, for a `random:` model that
has none, a byte-level one (one token per UTF-8 byte), so that text prompts still work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PromptError(ValueError):
    """A prompt the model cannot take (the server answers 400)."""


@dataclass
class ByteTokenizer:
    """Token id = the byte's value. A vocabulary smaller than 256 covers bytes below its size
    only (ASCII for llama-tiny's 128): other text is refused, never silently mangled. Decoding
    maps every id to its byte, special ids included (they are control characters)."""

    vocab_size: int
    eos_token_id: int | None = None
    chat_template: str | None = None

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        if data and max(data) >= self.vocab_size:
            raise PromptError(f"the byte-level tokenizer of a {self.vocab_size}-token vocabulary encodes bytes "
                              f"0..{self.vocab_size - 1} only; the text has byte {max(data)}")
        return list(data)

    def decode(self, ids: list[int]) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


@dataclass
class ServerTokenizer:
    """What the server needs of a tokenizer, whichever kind it wraps."""

    inner: Any  # an HF tokenizer or a ByteTokenizer
    kind: str  # "hf" | "bytes"

    def encode(self, text: str) -> list[int]:
        if self.kind == "bytes":
            return self.inner.encode(text)
        return list(self.inner.encode(text, add_special_tokens=True))

    def decode(self, ids: list[int]) -> str:
        if self.kind == "bytes":
            return self.inner.decode(ids)
        return self.inner.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The prompt of a chat: the tokenizer's chat template where it has one, else a plain
        transcript ("role: content" lines, then "assistant:")."""
        template = getattr(self.inner, "chat_template", None)
        if self.kind == "hf" and template:
            from jinja2 import TemplateError, TemplateSyntaxError

            try:
                ids = self.inner.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            except TemplateSyntaxError:
                raise  # the template's fault, not the request's
            except TemplateError as e:  # raise_exception("Conversation roles must alternate ..."), a missing field
                raise PromptError(f"the model's chat template refuses these messages: {e}") from None
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return an encoding
                ids = ids["input_ids"]
            return list(ids)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return self.encode(text)


def server_tokenizer(lm) -> ServerTokenizer:
    if lm.tokenizer is not None:
        return ServerTokenizer(lm.tokenizer, "hf")
    return ServerTokenizer(ByteTokenizer(lm.vocab_size, lm.eos_token_id), "bytes")

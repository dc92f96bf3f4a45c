"""The paper's translation workload with a shared few-shot prefix (Fig. 16)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Sequence

from pagesim.workload.trace import Trace, TraceRequest
from pagesim.workload.builders.common import DEFAULT_SEED, OptTokenizer, _offline_tokenizer, _require, length_stats, seeded_sample, sha256_of, trace_stats


TRANSLATION_PREFIX_LEN = {1: 80, 5: 341}
# German output per English source token, in LLaMA tokens. An assumption, not a measurement:
# there is no parallel corpus here. German words are longer and split into more SentencePiece
# pieces than English ones; 1.3 is our guess, stated in every trace's metadata.
TRANSLATION_OUTPUT_RATIO = 1.3
SENTENCE_WORDS = (5, 60)  # English sentences kept (words), roughly WMT news sentences' range


def load_llama_tokenizer(data_dir: Path) -> OptTokenizer:
    """The LLaMA SentencePiece tokenizer (the paper's translation workload runs LLaMA-13B)."""
    return _offline_tokenizer(data_dir, "llama", "LLaMA", "LLaMA SentencePiece (32,000 tokens)",
                              "none added: add_special_tokens=False (no BOS)")


def english_sentences(texts: Sequence[str]) -> list[str]:
    """Plain prose sentences from free text: split after . ! ? and keep one-line sentences that
    start with a capital letter, end with . ! or ?, and have SENTENCE_WORDS words."""
    import re

    out = []
    for text in texts:
        for sent in re.split(r"(?<=[.!?])\s+", text.strip()):
            words = sent.split()
            if ("\n" not in sent and SENTENCE_WORDS[0] <= len(words) <= SENTENCE_WORDS[1]
                    and sent[0].isupper() and sent[-1] in ".!?"):
                out.append(sent)
    return out


def prefix_token_ids(shots: int, seed: int, vocab_size: int) -> list[int]:
    """The shared prefix's token ids: placeholders (keyed hashes, ids 3 and up) of the paper's
    length, since we have no WMT16 text to write the few-shot examples with. Prefix caching
    only needs the ids to be the same in every request."""
    ids = []
    for i in range(TRANSLATION_PREFIX_LEN[shots]):
        h = hashlib.blake2b(f"pagesim-translation-prefix:{seed}:{shots}:{i}".encode(), digest_size=8).digest()
        ids.append(3 + int.from_bytes(h, "big") % (vocab_size - 3))
    return ids


def build_translation(data_dir: Path, num: int | None = 2000, seed: int = DEFAULT_SEED, command: str = "",
                      shots: int = 1) -> Trace:
    """Shared-prefix translation: every prompt is one fixed few-shot prefix followed by an
    English sentence; the output is its (assumed) German translation length."""
    if shots not in TRANSLATION_PREFIX_LEN:
        raise ValueError(f"shots must be one of {sorted(TRANSLATION_PREFIX_LEN)}, got {shots}")
    src = _require(Path(data_dir) / "alpaca" / "alpaca_5000.json", "Alpaca sample")
    records = json.loads(src.read_text(encoding="utf-8"))
    sentences = english_sentences([r["output"] for r in records])
    tok = load_llama_tokenizer(data_dir)
    encoded = tok.encode_many(sentences)
    prefix = prefix_token_ids(shots, seed, tok.info["vocab_size"])
    requests = []
    for ids in seeded_sample(encoded, num, seed, "sentences found"):
        requests.append(TraceRequest(prompt_len=len(prefix) + len(ids),
                                     output_len=max(1, round(TRANSLATION_OUTPUT_RATIO * len(ids))),
                                     prefix_group=0, shared_prefix_len=len(prefix), prompt_token_ids=prefix + ids))
    source_lens = [r.prompt_len - len(prefix) for r in requests]
    metadata = {
        "name": f"translation-{shots}shot",
        "description": f"The paper's shared-prefix translation workload (Fig. 16, LLaMA-13B): every prompt is one fixed "
        f"{shots}-shot prefix of {len(prefix)} tokens followed by one English sentence to translate; the output is "
        "its German translation.",
        "source": {
            "dataset": "English sentences from the reference outputs of the Stanford Alpaca 5,000-record sample "
            "(the paper used WMT16 En-De, which is not available here)",
            "file": "alpaca/alpaca_5000.json",
            "file_sha256": sha256_of(src),
            "rows": len(records),
            "sentences": len(sentences),
            "sentence_rule": f"split after . ! ?; one line, capital first letter, ends in . ! or ?, "
            f"{SENTENCE_WORDS[0]}-{SENTENCE_WORDS[1]} words",
        },
        "tokenizer": tok.info,
        "prefix": {
            "shots": shots, "len": len(prefix),
            "token_ids": "placeholders: blake2b of (seed, shots, position) mod (vocab - 3) + 3, identical in every request",
            "why": "the paper gives the prefix lengths (80 / 341 tokens) but not their text; prefix caching needs only "
            "the same ids in every request",
        },
        "prompt": "prefix token ids + the sentence's token ids (no BOS, no framing text)",
        "output_len": f"round({TRANSLATION_OUTPUT_RATIO} x the English sentence's tokens), at least 1: an assumed "
        "German/English token ratio, not measured (no parallel corpus here)",
        "sampling": {"method": "seeded shuffle of the sentences (order by blake2b of seed and index), first `count`",
                     "seed": seed},
        "seed": seed,
        "count": len(requests),
        "source_sentence_len": length_stats(source_lens),
        "stats": trace_stats(requests),
        "paper": {"figure": "Fig. 16", "prefix_len": TRANSLATION_PREFIX_LEN,
                  "result": "vLLM 1.67x (1-shot) and 3.58x (5-shot) the throughput of Orca (Oracle)"},
        "command": command,
    }
    return Trace(metadata=metadata, requests=requests)


def _translation(shots: int) -> Callable[..., Trace]:
    def build(data_dir: Path, num: int | None = 2000, seed: int = DEFAULT_SEED, command: str = "") -> Trace:
        return build_translation(data_dir, num=num, seed=seed, command=command, shots=shots)
    return build

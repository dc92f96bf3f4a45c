"""What every trace builder shares: data paths, seeded sampling, length statistics, offline
tokenizers, and a reader for a JSON array that may be cut short."""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pagesim.workload.trace import TraceRequest


MAX_SEQ_LEN = 2048  # OPT's context length; the paper keeps ShareGPT pairs that fit in it
CHAT_MAX_PROMPT = 1024  # the paper's chatbot workload: the last 1024 tokens of the history
CHAT_MAX_OUTPUT = 1024
DEFAULT_SEED = 0
DEFAULT_NUM = {"sharegpt": 10_000, "alpaca": None, "sharegpt-chat": 850, "translation-1shot": 2000,
               "translation-5shot": 2000, "sharegpt-sessions": 200, "mooncake-sessions": 20, "agent-sessions": 100}
KINDS = tuple(DEFAULT_NUM)

PAPER_MEANS = {
    "sharegpt": {"prompt_len": 161.31, "output_len": 337.99},
    "alpaca": {"prompt_len": 19.31, "output_len": 58.45},
}

Progress = Callable[[int, int], None]  # (done, total), called as work advances


# ---------------------------------------------------------------------------------------------
# Small shared helpers


def repo_root() -> Path:
    """The checkout this package lives in (pagesim/workload/builders/common.py -> the repo)."""
    return Path(__file__).resolve().parents[3]


def default_data_dir() -> Path:
    """$PAGESIM_DATA_DIR if set, else ../shared/data beside the repo root."""
    env = os.environ.get("PAGESIM_DATA_DIR")
    if env:
        return Path(env)
    return (repo_root() / ".." / "shared" / "data").resolve()


def seeded_order(n: int, seed: int) -> list[int]:
    """A seeded shuffle of range(n): sort by a keyed hash of (seed, index).

    Unlike a library RNG this order is fixed forever (it depends only on blake2b), so a trace
    rebuilt years later with other numpy versions is still byte-identical.
    """
    key = f"pagesim-shuffle:{seed}:".encode()

    def rank(i: int) -> bytes:
        return hashlib.blake2b(key + str(i).encode(), digest_size=8).digest()

    return sorted(range(n), key=rank)


def seeded_sample(items: Sequence, num: int | None, seed: int, what: str) -> list:
    """num of items (all where num is None) in seeded_order; what names the items in the error
    when fewer than num are there."""
    order = seeded_order(len(items), seed)
    if num is not None:
        if num > len(items):
            raise ValueError(f"--num {num} is more than the {len(items)} {what}")
        order = order[:num]
    return [items[i] for i in order]


def percentile(sorted_values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile: an actual value of the data, no interpolation."""
    if not sorted_values:
        raise ValueError("percentile of nothing")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def length_stats(values: Sequence[int]) -> dict[str, Any]:
    """count, mean (4 decimals), min, p50, p90, p99, max of a list of lengths."""
    s = sorted(values)
    return {
        "count": len(s),
        "mean": round(sum(s) / len(s), 4),
        "min": s[0],
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
        "max": s[-1],
    }


def trace_stats(requests: Sequence[TraceRequest]) -> dict[str, Any]:
    return {
        "prompt_len": length_stats([r.prompt_len for r in requests]),
        "output_len": length_stats([r.output_len for r in requests]),
    }


def sha256_of(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def build_command(kind: str, num: int | None, seed: int, out: str) -> str:
    """The command recorded in metadata, in one canonical form.

    --data-dir is left out on purpose: it is a machine-specific path, and the data files are
    already identified in the metadata by name and sha256.
    """
    parts = ["pagesim", "trace", "build", kind]
    if num is not None:
        parts += ["--num", str(num)]
    parts += ["--seed", str(seed), "--out", out]
    return " ".join(parts)


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"{what} not found at {path} (pass --data-dir, or set PAGESIM_DATA_DIR, to the folder holding the public data)"
        )
    return path


# ---------------------------------------------------------------------------------------------
# Tokenizer


@dataclass
class OptTokenizer:
    """A trace builder's tokenizer, used without special tokens (no BOS), as every trace here counts."""

    encode_batch: Callable[[list[str]], list[list[int]]]  # texts -> their ids, no special tokens added
    info: dict[str, Any] = field(default_factory=dict)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.encode_batch(list(texts))]


def _tokenizer_info(tok_dir: Path, name: str, description: str, loaded_with: str, special_tokens: str,
                    vocab_size: int) -> dict[str, Any]:
    """What every trace records about its tokenizer: its files and their hash, the library."""
    files = sorted(p for p in tok_dir.iterdir() if p.is_file())
    return {
        "name": description,
        "files": f"tokenizers/{name} (" + ", ".join(p.name for p in files) + ")",
        "files_sha256": sha256_of(*files),
        "loaded_with": loaded_with,
        "special_tokens": special_tokens,
        "vocab_size": vocab_size,
    }


def _offline_tokenizer(data_dir: Path, name: str, what: str, description: str, special_tokens: str) -> OptTokenizer:
    """The transformers AutoTokenizer in data_dir/tokenizers/<name>, loaded offline."""
    import transformers

    tok_dir = _require(Path(data_dir) / "tokenizers" / name, f"{what} tokenizer")
    # Offline: these machines cannot reach a hub, and a trace must not depend on one.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    # Nothing is truncated here; lifting the model's length limit only silences a warning that
    # long messages would be too long *for the model*.
    tok.model_max_length = 1 << 30
    info = _tokenizer_info(tok_dir, name, description, f"transformers {transformers.__version__} AutoTokenizer, offline",
                           special_tokens, len(tok))
    return OptTokenizer(lambda texts: tok(texts, add_special_tokens=False)["input_ids"], info)


def opt_backend(tok_dir: Path):
    """The OPT tokenizer as a `tokenizers.Tokenizer`, built from vocab.json and merges.txt as
    transformers' GPT2Tokenizer builds it (byte-level BPE, no prefix space, the config's special
    tokens matched whole in the text). Built directly because importing transformers takes
    seconds (torch with it), most of a sessions build; tests/workload/test_opt_tokenizer.py
    checks it equals what AutoTokenizer loads, part by part and id by id."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    config = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    backend = Tokenizer(BPE.from_file(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), dropout=None,
                                      continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)))
    backend.decoder = decoders.ByteLevel()
    specials = sorted({config[k] for k in ("pad_token", "bos_token", "eos_token", "unk_token") if k in config})
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    return backend


def load_opt_tokenizer(data_dir: Path) -> OptTokenizer:
    import tokenizers

    tok_dir = _require(Path(data_dir) / "tokenizers" / "opt", "OPT tokenizer")
    backend = opt_backend(tok_dir)
    info = _tokenizer_info(tok_dir, "opt", "OPT (GPT-2 byte-level BPE with the RoBERTa/OPT vocabulary ids)",
                           f"tokenizers {tokenizers.__version__} byte-level BPE from vocab.json and merges.txt, built "
                           "as transformers' GPT2Tokenizer (AutoTokenizer's class for it) builds it, offline",
                           "none added: add_special_tokens=False, so no BOS </s> (id 2) is counted",
                           backend.get_vocab_size(with_added_tokens=True))
    return OptTokenizer(lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)], info)


# ---------------------------------------------------------------------------------------------
# ShareGPT, text completion (the paper's Fig. 11 / 12 workload)



@dataclass
class RecoveredArray:
    """What could be read from a possibly truncated top-level JSON array."""

    records: list[Any]
    total_bytes: int
    stopped_at_byte: int  # first byte not read into a complete element (== total_bytes when complete)
    complete: bool
    stop_reason: str


def read_json_array_prefix(raw: bytes) -> RecoveredArray:
    """Read a top-level JSON array element by element, keeping every complete element.

    `json.load` gives up on a truncated file; here each element is decoded on its own with
    JSONDecoder.raw_decode, so everything before the cut is recovered and the caller is told
    exactly where reading stopped.
    """
    # An incremental decoder leaves a multi-byte character cut by the truncation undecoded
    # instead of failing on it.
    text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=False)
    decoder = json.JSONDecoder()
    pos = 0
    n = len(text)

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\n\r":
            i += 1
        return i

    pos = skip_ws(pos)
    if pos >= n or text[pos] != "[":
        raise ValueError("not a JSON array")
    pos += 1
    records: list[Any] = []
    complete = False
    reason = "end of data inside the array (no closing ']')"
    while True:
        pos = skip_ws(pos)
        if pos < n and text[pos] == "]":
            complete, reason = True, "complete array"
            pos += 1
            break
        if records:
            if pos < n and text[pos] == ",":
                pos = skip_ws(pos + 1)
            elif pos < n:
                reason = f"expected ',' or ']' at character {pos}"
                break
        if pos >= n:
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            reason = f"element {len(records)} is incomplete ({exc.msg}, byte {len(text[: exc.pos].encode('utf-8'))})"
            break
        records.append(obj)
        pos = end
    stopped = len(text[:pos].encode("utf-8"))
    return RecoveredArray(records, len(raw), stopped, complete, reason)

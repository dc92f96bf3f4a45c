"""Mooncake's FAST'25 traces (Kimi's conversation service, one hour; a synthetic multi-turn
set): arrival times, lengths and the hash ids of each prompt's 512-token blocks, so which
requests share which prefix is known (docs/traces.md)."""

from __future__ import annotations

import json
from pathlib import Path

from pagesim.inputs import first_constant, json_path, loads_marking_long_ints
from pagesim.workload.builders.common import _require, sha256_of
from pagesim.workload.builders.timeline import (Shaping, SourceError, SourceRecord, check_order,
                                                shape, shaped_trace)
from pagesim.workload.trace import Trace

MOONCAKE_DIR = "traces_public/mooncake-fast25"
MOONCAKE_FILES = {"mooncake-conversation": "conversation_trace.jsonl", "mooncake-synthetic": "synthetic_trace.jsonl"}
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
HASH_BLOCK_TOKENS = 512  # Mooncake's hash ids each cover 512 prompt tokens (the last block may be partial)
DESCRIPTION = {
    "mooncake-conversation": "one hour of Kimi's online conversation service",
    "mooncake-synthetic": "a synthetic multi-turn set built from public datasets, Poisson arrivals, turns of a "
                          "conversation kept in order",
}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no length


def _record(path: Path, line: int, text: str) -> SourceRecord:
    try:
        obj, long_int = loads_marking_long_ints(text)
    except json.JSONDecodeError as exc:
        raise SourceError(path, line, None, f"invalid JSON ({exc.msg})") from None
    if long_int:  # an integer of more digits than Python converts
        keys, problem = first_constant(obj)
        raise SourceError(path, line, json_path(keys) or None, problem)
    if not isinstance(obj, dict):
        raise SourceError(path, line, None, f"must be a JSON object, got {type(obj).__name__}")
    for name in MOONCAKE_FIELDS:
        if name not in obj:
            raise SourceError(path, line, name, "missing")
    stamp = obj["timestamp"]
    if not (_is_int(stamp) or isinstance(stamp, float)) or stamp < 0:
        raise SourceError(path, line, "timestamp", f"must be milliseconds >= 0, got {json.dumps(stamp)}")
    lengths = []
    for name in ("input_length", "output_length"):
        value = obj[name]
        if not _is_int(value) or value < 0:
            raise SourceError(path, line, name, f"must be an integer >= 0, got {json.dumps(value)}")
        lengths.append(value)
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list) or not all(_is_int(h) and h >= 0 for h in hashes):
        raise SourceError(path, line, "hash_ids", "must be a list of integers >= 0")
    blocks = -(-lengths[0] // HASH_BLOCK_TOKENS)
    if len(hashes) != blocks:
        raise SourceError(path, line, "hash_ids", f"has {len(hashes)} ids but input_length {lengths[0]} spans {blocks} "
                          f"blocks of {HASH_BLOCK_TOKENS} tokens")
    return SourceRecord(line, stamp / 1000, lengths[0], lengths[1], tuple(hashes))


def read_mooncake_jsonl(path: Path) -> list[SourceRecord]:
    """Records of a Mooncake trace in file order (seconds = timestamp ms / 1000; its first is 0)."""
    records = [_record(path, line, text) for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if text.strip()]
    if not records:
        raise SourceError(path, 1, None, "no records")
    check_order(path, records, "timestamp")
    origin = records[0].arrival
    if origin:
        records = [SourceRecord(r.line, r.arrival - origin, r.prompt_len, r.output_len, r.hash_ids) for r in records]
    return records


def prefix_block_reuse(requests, block_tokens: int = HASH_BLOCK_TOKENS) -> dict:
    """What an unbounded cache of hashed blocks could serve, if it held every block the moment
    its request arrived: the blocks whose whole prefix chain (this block and every one before it
    in the prompt) appeared in an earlier request, counted as blocks (a partial block counts as
    one) and as prompt tokens (only a prompt's leading run of such blocks, as a prefix cache
    serves them)."""
    chains: dict[tuple[int, int], int] = {}  # (chain of the blocks before, hash id) -> this chain's number
    hits = total = tokens = reused_tokens = 0
    for r in requests:
        chain, leading = -1, 0
        for k, h in enumerate(r.hash_ids):
            total += 1
            known = chains.get((chain, h))
            if known is None:
                known = chains[(chain, h)] = len(chains)
            else:
                hits += 1
                if leading == k:
                    leading += 1
            chain = known
        tokens += r.prompt_len
        reused_tokens += min(r.prompt_len, leading * block_tokens)
    return {"blocks": total, "reused": hits, "ratio": round(hits / total, 6),
            "prompt_tokens": tokens, "prompt_tokens_reused": reused_tokens,
            "token_ratio": round(reused_tokens / tokens, 6)}


def build_mooncake(kind: str, data_dir: Path, shaping: Shaping | None = None, command: str = "") -> Trace:
    shaping = shaping or Shaping()
    rel = f"{MOONCAKE_DIR}/{MOONCAKE_FILES[kind]}"
    path = _require(Path(data_dir) / rel, f"Mooncake trace {MOONCAKE_FILES[kind]}")
    records = read_mooncake_jsonl(path)
    requests, filters, cap = shape(records, shaping, HASH_BLOCK_TOKENS)
    metadata = {
        "name": kind,
        "description": f"Mooncake FAST'25 trace: {DESCRIPTION[kind]}. hash_ids name each 512-token prompt block "
                       "(equal ids: the same prefix KV), so prefix caching sees the real reuse.",
        "source": {"file": rel, "file_sha256": sha256_of(path), "records": len(records),
                   "repository": "kvcache-ai/Mooncake @ 3b5a594133958449a1feaf1c9e0fc1b553e34a28, FAST25-release/traces/",
                   "license": "Apache-2.0",
                   "cite": "Qin et al., Mooncake: Trading More Storage for Less Computation, FAST 2025"},
        "arrival_time": "timestamp (ms from the start) / 1000, then shaped (see shaping)",
        "prompt_len": "input_length", "output_len": "output_length",
        "hash_block_tokens": HASH_BLOCK_TOKENS,
        "hash_ids": "the source's hash_ids: block k covers prompt tokens [512k, 512k + 512); the last may be partial. "
                    "Replays key the prefix cache from them (pagesim.core.hashed_prompt); bench and the executor "
                    "send seeded token ids per hash id (HashedPrompt.vocab_ids)",
        "prefix_block_reuse": prefix_block_reuse(requests),
    }
    return shaped_trace(metadata, shaping, filters, requests, cap, command)

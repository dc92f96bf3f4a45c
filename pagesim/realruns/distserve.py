"""DistServe's benchmark records (`.exp`, LLMServe/DistServe simdistserve/benchmarks/alignment):
line 1 a Python literal, a list of one dict per request (prompt_len, output_len, issue_time,
first_token_time, complete_time, ttft_ms, tpot_ms, latency_ms, times in seconds on one clock),
then a brace-delimited block of `key: value` aggregates. Line 1 is read with ast.literal_eval
(a literal, never code). The file records no server settings: they are DistServe's alignment
setup (below), said so in the run's assumptions; flags override them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

from pagesim.realruns.fields import RealRunError, Record, read_text
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

FORMAT = "distserve"
FIELDS = ("prompt_len", "output_len", "issue_time", "first_token_time", "complete_time")
NAME = re.compile(r"^vllm-(?P<count>\d+)-(?P<rate>\d+(?:\.\d+)?)\.exp$")
# DistServe's vLLM baseline for its alignment runs (OPT-13B ShareGPT; its repository and
# ../shared/data/real_vllm/README.md): vLLM of early 2024 on one A100-SXM4-80GB, engine on Ray.
ALIGNMENT_SETUP = ServerConfig(
    engine_version="DistServe's fork of vLLM (early 2024)", model="facebook/opt-13b", gpu="A100-SXM4-80GB",
    tensor_parallel_size=1, max_num_seqs=1024, max_num_batched_tokens=16384, block_size=16,
    enable_prefix_caching=False, enable_chunked_prefill=False, gpu_memory_utilization=0.95)


def looks_like(text: str) -> bool:
    return text.lstrip().startswith("[{") and "'issue_time'" in text[:2000]


def read(path: Path) -> RealRun:
    text = read_text(path)
    first_line, _, rest = text.partition("\n")
    try:
        records = ast.literal_eval(first_line)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise RealRunError(path, f"line 1 is not a Python literal ({type(exc).__name__}: "
                                 f"{getattr(exc, 'msg', exc)}; truncated file?)") from None
    if not isinstance(records, list) or not records:
        raise RealRunError(path, "line 1 must be a non-empty list of per-request dicts")
    rows = []
    for i, raw in enumerate(records):
        rec = Record(path, i, raw, what="a dict")
        prompt_len, output_len = rec.int("prompt_len", minimum=1), rec.int("output_len", minimum=1)
        issue, first_token, complete = (rec.num(name) for name in FIELDS[2:])
        if not issue <= first_token <= complete:
            raise rec.fail("first_token_time", "times out of order (issue <= first token <= complete)")
        rows.append((issue, i, prompt_len, output_len, first_token, complete))
    rows.sort()
    start = rows[0][0]
    requests = [RealRequest(index=i, arrival_s=issue - start, prompt_len=p, output_len=o, generated_len=o,
                            max_tokens=o, ttft_s=ft - issue, e2e_s=done - issue)
                for issue, i, p, o, ft, done in rows]
    match = NAME.match(path.name)
    span = requests[-1].arrival_s
    rate = float(match["rate"]) if match else (len(requests) / span if span > 0 else None)
    stages = [Stage(0, 0.0, span, len(requests), rate=rate)]
    aggregates = _aggregates(rest)
    assumptions = [
        "the .exp file records no server settings: DistServe's alignment setup assumed (OPT-13B, one A100-SXM4-80GB, "
        "TP 1, block 16, max_num_seqs 1024, max_num_batched_tokens 16384, gpu_memory_utilization 0.95, no chunked "
        "prefill, no prefix caching); pass flags to override",
        "every request generates its recorded output_len (DistServe's client sets max_tokens to it with ignore_eos)",
        "prompt contents not recorded: replayed without prefix sharing",
    ]
    if not match:
        assumptions.append(f"rate not in the file name (vllm-<count>-<rate>.exp): measured, {rate or 0:.3g} req/s")
    if aggregates.get("num_requests") not in (None, len(requests)):
        assumptions.append(f"the file's summary says num_requests {aggregates['num_requests']:g}, line 1 holds "
                           f"{len(requests)}: the {len(requests)} records are used")
    server = replace(ALIGNMENT_SETUP)
    return RealRun(path.stem, FORMAT, str(path), server, requests, stages, assumptions)


def _aggregates(text: str) -> dict[str, float]:
    """The `key: value` lines after line 1 (DistServe's own summary; informational only)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\w+)\s*:\s*([-+0-9.eE]+)\s*$", line)
        if m:
            try:
                out[m[1]] = float(m[2])
            except ValueError:
                continue
    return out

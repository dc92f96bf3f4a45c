"""`load_real_run(path)`: which format a recorded run is in, told by content (not by name), and
`describe(run)`: a short human summary of what was read and assumed."""

from __future__ import annotations

import os
from pathlib import Path

from pagesim.realruns import blis, distserve, guidellm, llmservingsim, pagesim_bench, vllm_bench
from pagesim.realruns.fields import RealRunError, parse_json, read_text
from pagesim.realruns.types import RealRun

FORMATS = ("inference-perf (BLIS replay_data)", "LLMServingSim (vllm/requests.jsonl + meta.json)",
           "DistServe (.exp)", "vllm bench serve (--save-result --save-detailed JSON)", "guidellm (benchmarks JSON)",
           "pagesim bench / replay (requests.csv + summary.json)")


def _unknown(path: Path) -> RealRunError:
    return RealRunError(path, "not a recorded run in a known format (" + "; ".join(FORMATS) + ")")


def load_real_run(path: str | os.PathLike) -> RealRun:
    """Read a recorded real run (a file or a folder). Raises RealRunError, one line naming the
    file, the record and the field, on anything malformed or unknown."""
    path = Path(path)
    if not path.exists():
        raise RealRunError(path, "no such file or folder")
    if path.is_dir():
        if llmservingsim.find(path):
            return llmservingsim.read(path)
        if pagesim_bench.find(path):
            return pagesim_bench.read(path)
        runs = sorted(p for p in path.glob("*.json*") if blis.GT_SUFFIX not in p.name)
        if (path / "exp-config.yaml").is_file():  # default_args/<run>/: the run is in replay_data/
            replay = blis.json_file(path.parent.parent / "replay_data", path.name)
            if replay is not None:
                return blis.read(replay)
        if len(runs) == 1:
            return load_real_run(runs[0])
        if len(runs) > 1:
            raise RealRunError(path, f"holds {len(runs)} runs ({runs[0].name}, ...): name one file")
        raise _unknown(path)
    if path.name in ("requests.csv", "summary.json") and pagesim_bench.find(path):
        return pagesim_bench.read(path)
    text = read_text(path)
    head = text.lstrip()[:1]
    if distserve.looks_like(text):
        return distserve.read(path)
    if path.name.endswith(".jsonl") or (head == "{" and "\n{" in text.strip() and _first_line_is_object(text)):
        first = parse_json(text.lstrip().split("\n", 1)[0], path, record=1)
        if llmservingsim.looks_like(first):
            return llmservingsim.read(path)
        raise _unknown(path)
    if head not in ("{", "["):
        raise _unknown(path)
    doc = parse_json(text, path)
    if blis.looks_like(doc):
        return blis.read(path, doc)
    if guidellm.looks_like(doc):
        return guidellm.read(path, doc)
    if vllm_bench.looks_like(doc):
        return vllm_bench.read(path, doc)
    raise _unknown(path)


def _first_line_is_object(text: str) -> bool:
    """JSON lines (one object a line) rather than one JSON document spread over lines."""
    line = text.lstrip().split("\n", 1)[0].strip()
    return line.startswith("{") and line.endswith("}")


def _fmt(value, unit: str = "s") -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if unit == "s" and value < 1 else f"{value:.3g} {unit}"


def describe(run: RealRun) -> str:
    """A few lines: what the run is, its server as recorded, its load, what was measured, and
    every assumption the reader made."""
    s = run.summary()
    server = run.server.recorded()
    lines = [f"{run.name} ({run.source_format}, {run.path})",
             "  server: " + (", ".join(f"{k}={v}" for k, v in server.items() if k != "model_config") or "nothing recorded")]
    for stage in run.stages:
        load = (f"{stage.rate:.3g} req/s" if stage.rate else "") + (
            f"{', ' if stage.rate else ''}{stage.concurrency} in flight" if stage.concurrency else "")
        lines.append(f"  stage {stage.index}: {stage.num_requests} requests, {stage.start_s:.1f}-{stage.end_s:.1f} s"
                     + (f", {load}" if load else ""))
    prompts = [r.prompt_len for r in run.requests]
    outputs = [r.generated_len for r in run.requests]
    lines.append(f"  requests: {len(run.requests)} ({s['num_failed']} failed), prompt {min(prompts)}-{max(prompts)} "
                 f"(mean {sum(prompts) / len(prompts):.0f}) tokens, output {min(outputs)}-{max(outputs)} "
                 f"(mean {sum(outputs) / len(outputs):.0f})")
    lines.append(f"  measured: TTFT mean {_fmt(s['ttft_mean'])} p90 {_fmt(s['ttft_p90'])}, "
                 f"TPOT mean {_fmt(s['tpot_mean'])}, E2E mean {_fmt(s['e2e_mean'])} p90 {_fmt(s['e2e_p90'])}, "
                 f"{_fmt(s['request_throughput'], 'req/s')}")
    lines += [f"  assumed: {a}" for a in run.assumptions]
    return "\n".join(lines)

"""LLMServingSim's recordings of real vLLM runs (casys-kaist/LLMServingSim, `bench/`):

    <run>/vllm/requests.jsonl   request_id, input_toks, output_toks, arrival_time (wall clock),
                                queued_ts, scheduled_ts, first_token_ts, last_token_ts (the engine's
                                monotonic clock: vLLM's RequestStateStats)
    <run>/vllm/meta.json        engine_kwargs, vllm_version, model (+ kv_cache, hardware when recorded)
    <run>/config.json           that simulator's cluster description (the GPU's name)

The two clocks: arrival_time is when the request reached vLLM's front end (epoch seconds), the
*_ts are the engine core's monotonic clock; their offset is not recorded. It is taken as the
smallest queued_ts - arrival_time over the run (the request whose front-end step was quickest is
taken to have had none), so TTFT and E2E count from the request's arrival, front-end time
included, as a client sees it (and as LLMServingSim's current validator defines them; its
earlier summary.txt measured from queued_ts, which leaves the front end out). queued_s keeps the
engine's own queue time.
"""

from __future__ import annotations

from pathlib import Path

from pagesim.realruns.fields import RealRunError, Record, find_model_config, parse_json, read_json, read_text
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

FORMAT = "llmservingsim"
TIMES = ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


def find(path: Path) -> Path | None:
    """The requests.jsonl of a run given as the file, its vllm/ folder or the run's folder."""
    for candidate in (path, path / "requests.jsonl", path / "vllm" / "requests.jsonl"):
        if candidate.is_file() and candidate.name == "requests.jsonl" and (candidate.parent / "meta.json").is_file():
            return candidate
    return None


def looks_like(first_record: dict) -> bool:
    return isinstance(first_record, dict) and "queued_ts" in first_record and "first_token_ts" in first_record


def _index(request_id, line: int) -> int:
    """bench-17 -> 17; otherwise the line's position."""
    tail = str(request_id).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else line


def read(path: Path) -> RealRun:
    requests_path = find(path)
    if requests_path is None:
        raise RealRunError(path, "no requests.jsonl with a meta.json beside it")
    run_dir = requests_path.parent.parent if requests_path.parent.name == "vllm" else requests_path.parent
    meta = Record(requests_path.parent / "meta.json", None, read_json(requests_path.parent / "meta.json"))
    kwargs = meta.obj("engine_kwargs", optional=True) or Record(meta.path, None, {})
    kv = meta.obj("kv_cache", optional=True) or Record(meta.path, None, {})
    rows = []
    for line, text in enumerate(read_text(requests_path).splitlines()):
        if not text.strip():
            continue
        rec = Record(requests_path, line + 1, parse_json(text, requests_path, record=line + 1))
        times = [rec.num(name) for name in TIMES]
        if not times[1] <= times[2] <= times[3] <= times[4]:
            raise rec.fail("first_token_ts", "times out of order (queued <= scheduled <= first token <= last token)")
        rows.append((_index(rec.data.get("request_id"), line), rec.int("input_toks", minimum=1),
                     rec.int("output_toks", minimum=1), *times))
    if not rows:
        raise RealRunError(requests_path, "has no requests")
    renumbered = len({r[0] for r in rows}) != len(rows)
    if renumbered:  # request ids that do not end in distinct numbers: number the lines instead
        rows = [(line, *row[1:]) for line, row in enumerate(rows)]
    offset = min(r[4] - r[3] for r in rows)  # queued_ts - arrival_time: the clocks' offset, at most
    rows.sort(key=lambda r: (r[3], r[0]))
    first = rows[0][3] + offset
    requests = []
    for index, prompt_len, output_len, arrival, queued, _, first_token, last_token in rows:
        arrival += offset
        requests.append(RealRequest(index=index, arrival_s=arrival - first, prompt_len=prompt_len,
                                    output_len=output_len, generated_len=output_len, max_tokens=output_len,
                                    ttft_s=first_token - arrival, e2e_s=last_token - arrival,
                                    queued_s=queued - first))
    front_end = sorted(r.queued_s - r.arrival_s for r in requests)
    span = requests[-1].arrival_s
    stages = [Stage(0, 0.0, span, len(requests), rate=len(requests) / span if span > 0 else None)]
    gpu, cluster_note = _gpu(run_dir)
    model = meta.str("model", optional=True) or kwargs.str("model", optional=True)
    eager = kwargs.bool("enforce_eager", optional=True)
    resolved = _resolved(meta.data.get("resolved_config"))
    server = ServerConfig(
        engine_version=meta.str("vllm_version", optional=True), model=model,
        model_config=find_model_config(run_dir, model), gpu=gpu,
        tensor_parallel_size=kwargs.int("tensor_parallel_size", optional=True, minimum=1),
        data_parallel_size=kwargs.int("data_parallel_size", optional=True, minimum=1),
        enable_expert_parallel=kwargs.bool("enable_expert_parallel", optional=True),
        max_num_seqs=kwargs.int("max_num_seqs", optional=True, minimum=1),
        max_num_batched_tokens=kwargs.int("max_num_batched_tokens", optional=True, minimum=1),
        num_gpu_blocks=kv.int("num_gpu_blocks", optional=True, minimum=1),
        block_size=kv.int("block_size", optional=True, minimum=1),
        enable_prefix_caching=kwargs.bool("enable_prefix_caching", optional=True),
        enable_chunked_prefill=kwargs.bool("enable_chunked_prefill", optional=True),
        gpu_memory_utilization=kv.num("gpu_memory_utilization", optional=True)
        or kwargs.num("gpu_memory_utilization", optional=True),
        kv_cache_dtype=kwargs.str("kv_cache_dtype", optional=True), dtype=kwargs.str("dtype", optional=True),
        max_model_len=kwargs.int("max_model_len", optional=True, minimum=1),
        cuda_graphs=None if eager is None else not eager)
    for name, value in resolved.items():  # what the engine resolved, where the arguments left it open
        if getattr(server, name) is None:
            setattr(server, name, value)
    assumptions = [
        "arrival_time (wall clock) and the engine's *_ts (monotonic) are two clocks: put on one by their smallest "
        f"offset; TTFT and E2E count from arrival, front-end time included (its median {1000 * front_end[len(front_end) // 2]:.0f} ms, "
        f"max {1000 * front_end[-1]:.0f} ms over the run)",
        "every request generates its recorded output_toks (LLMServingSim pins min_tokens = max_tokens with ignore_eos)",
        "prompt contents not recorded: replayed without prefix sharing",
    ]
    if cluster_note:
        assumptions.append(cluster_note)
    if renumbered:
        assumptions.append("request ids do not end in distinct numbers (bench-<n>): request index = line order")
    return RealRun(run_dir.name, FORMAT, str(requests_path), server, requests, stages, assumptions)


# ServerConfig field <- (sub-config, key, type) of vLLM's resolved VllmConfig, which later
# recordings keep in meta.json's resolved_config (values that are not JSON scalars are tags there)
RESOLVED = {"tensor_parallel_size": ("parallel_config", "tensor_parallel_size", int),
            "data_parallel_size": ("parallel_config", "data_parallel_size", int),
            "enable_expert_parallel": ("parallel_config", "enable_expert_parallel", bool),
            "max_num_seqs": ("scheduler_config", "max_num_seqs", int),
            "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens", int),
            "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill", bool),
            "async_scheduling": ("scheduler_config", "async_scheduling", bool),
            "block_size": ("cache_config", "block_size", int),
            "num_gpu_blocks": ("cache_config", "num_gpu_blocks", int),
            "enable_prefix_caching": ("cache_config", "enable_prefix_caching", bool),
            "gpu_memory_utilization": ("cache_config", "gpu_memory_utilization", float),
            "kv_cache_dtype": ("cache_config", "cache_dtype", str),
            "max_model_len": ("model_config", "max_model_len", int),
            "dtype": ("model_config", "dtype", str)}


def _resolved(config) -> dict:
    """The settings found in a resolved_config, those of the expected type (tags are left out)."""
    out = {}
    if not isinstance(config, dict):
        return out
    for name, (section, key, kind) in RESOLVED.items():
        value = (config.get(section) or {}).get(key) if isinstance(config.get(section), dict) else None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is str and isinstance(value, str) and value.startswith("<"):
            continue  # a type tag, not a value
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            out[name] = value
    eager = (config.get("model_config") or {}).get("enforce_eager") if isinstance(config.get("model_config"), dict) else None
    if isinstance(eager, bool):
        out["cuda_graphs"] = not eager
    return out


def _gpu(run_dir: Path) -> tuple[str | None, str | None]:
    """The GPU's name from LLMServingSim's cluster config.json beside vllm/, when there is one."""
    path = run_dir / "config.json"
    if not path.is_file():
        return None, None
    doc = read_json(path)
    try:
        instance = doc["nodes"][0]["instances"][0]
        name = instance["hardware"]
    except (KeyError, IndexError, TypeError):
        return None, None
    return str(name), f"GPU name from LLMServingSim's cluster description ({path.name}): {name}"

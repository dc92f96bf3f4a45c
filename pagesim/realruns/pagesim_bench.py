"""`pagesim bench --out DIR` (or `pagesim replay --out DIR`): requests.csv with
pagesim.metrics.REQUEST_FIELDS columns (times in seconds on the run's clock) and summary.json
(the run's settings: `run` for bench, `config` for a replay; `trace`, the trace file it sent).

A request's arrival is when the arrival process made it due (bench: waiting for a
--max-concurrency slot counts, as queueing does on a server); TTFT and E2E are from arrival, as
pagesim measures them. Where the trace file named in summary.json is still there, its token ids
and prefix groups are taken back, so the replay shares prefixes as the run did.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pagesim.metrics import REQUEST_FIELDS
from pagesim.realruns.fields import RealRunError, Record, read_json, read_text
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

FORMAT = "pagesim-bench"
NEEDED = ("request_id", "status", "reject_reason", "arrival_time", "first_token_time", "finish_time", "prompt_len",
          "output_len")
# ServerConfig field <- the names a replay's config / a bench run use
SETTINGS = {"model": "model", "gpu": "gpu", "tensor_parallel_size": "tp", "max_num_seqs": "max_num_seqs",
            "max_num_batched_tokens": "max_num_batched_tokens", "num_gpu_blocks": "num_gpu_blocks",
            "block_size": "block_size", "enable_prefix_caching": "prefix_caching",
            "enable_chunked_prefill": "chunked_prefill", "gpu_memory_utilization": "gpu_memory_utilization",
            "max_model_len": "max_model_len"}


def find(path: Path) -> Path | None:
    folder = path if path.is_dir() else path.parent
    if (folder / "requests.csv").is_file() and (folder / "summary.json").is_file():
        return folder
    return None


def read(path: Path) -> RealRun:
    folder = find(path)
    if folder is None:
        raise RealRunError(path, "no requests.csv with a summary.json beside it")
    csv_path = folder / "requests.csv"
    summary = read_json(folder / "summary.json")
    if not isinstance(summary, dict):
        raise RealRunError(folder / "summary.json", "must be a JSON object")
    reader = csv.DictReader(io.StringIO(read_text(csv_path)))
    missing = [name for name in NEEDED if name not in (reader.fieldnames or ())]
    if missing:
        raise RealRunError(csv_path, f"missing column(s) {', '.join(missing)} (pagesim writes {', '.join(REQUEST_FIELDS)})",
                           field=missing[0])
    trace = _trace(summary)
    rows = []
    for line, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):
            raise RealRunError(csv_path, "wrong number of cells (truncated file?)", record=f"line {line}")
        rec = Record(csv_path, f"line {line}", row, text=True)
        status = rec.str("status")
        if status not in ("finished", "rejected"):
            raise rec.fail("status", f"must be finished or rejected, got {status!r}")
        ok = status == "finished"
        request_id = rec.int("request_id", minimum=0)
        arrival = rec.num("arrival_time", minimum=0)
        first = rec.num("first_token_time", optional=not ok)
        finish = rec.num("finish_time", optional=not ok)
        if ok and not arrival <= first <= finish:
            raise rec.fail("first_token_time", "times out of order (arrival <= first token <= finish)")
        rows.append((arrival, request_id, rec.int("prompt_len", minimum=1), rec.int("output_len", minimum=0), ok,
                     row["reject_reason"], first, finish))
    if not rows:
        raise RealRunError(csv_path, "has no requests")
    rows.sort()
    start = rows[0][0]
    requests, rebuilt = [], 0
    for arrival, rid, prompt_len, output_len, ok, reason, first, finish in rows:
        source = trace.requests[rid % len(trace)] if trace is not None else None
        generated = output_len if ok else (source.output_len if source is not None else max(output_len, 1))
        ids = source.prompt_token_ids if source is not None and source.prompt_len == prompt_len else None
        rebuilt += ids is not None
        requests.append(RealRequest(
            index=rid, arrival_s=arrival - start, prompt_len=prompt_len, output_len=output_len,
            generated_len=max(generated, 1), ok=ok, error=reason if not ok else "",
            ttft_s=first - arrival if ok else None, e2e_s=finish - arrival if ok else None,
            max_tokens=source.output_len if source is not None else None, prompt_token_ids=ids,
            prefix_group=source.prefix_group if ids is not None else None,
            shared_prefix_len=source.shared_prefix_len if ids is not None else None))
    assumptions = []
    if trace is not None:
        assumptions.append(f"token ids and prefix groups of {rebuilt} requests from the trace the run sent "
                           f"({summary.get('trace')})")
    else:
        assumptions.append("the trace the run sent is not found (or no longer loads): prompt contents unknown, "
                           "replayed without prefix sharing")
    failed = sum(not r.ok for r in requests)
    if failed:
        assumptions.append(f"{failed} rejected or failed requests kept in the replay (their trace output length where "
                           "known), left out of the measured metrics")
    settings = summary.get("config") if isinstance(summary.get("config"), dict) else summary.get("run") or {}
    simulated = summary.get("driver") != "http"
    server = ServerConfig(engine="pagesim" if simulated else "vllm",
                          **{field: settings.get(name) for field, name in SETTINGS.items() if settings.get(name) is not None})
    if not simulated:
        assumptions.append("pagesim bench does not record which engine served the requests: vLLM assumed")
    if server.model is None and summary.get("model"):
        server.model = summary["model"]
    rate = settings.get("rate")
    span = requests[-1].arrival_s
    stages = [Stage(0, 0.0, span, len(requests), rate=rate if isinstance(rate, (int, float)) and rate else
                    (len(requests) / span if span > 0 else None),
                    concurrency=settings.get("concurrency") or settings.get("max_concurrency"),
                    closed_loop=bool(settings.get("concurrency")))]
    return RealRun(folder.name, FORMAT, str(folder), server, requests, stages, assumptions)


def _trace(summary: dict):
    """The trace file named in summary.json, when it still loads."""
    from pagesim.workload.trace import TraceError, load_trace

    name = summary.get("trace")
    if not isinstance(name, str) or not Path(name).is_file():
        return None
    try:
        return load_trace(name)
    except (TraceError, OSError):
        return None

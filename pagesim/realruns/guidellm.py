"""guidellm's benchmark report JSON (guidellm 0.8.1, `GenerativeBenchmarksReport`): `benchmarks`,
one per strategy run (each becomes a stage), each with `requests.successful / errored /
incomplete` lists of per-request stats: `info.timings` (request_start, first_token_iteration,
last_token_iteration, request_end: epoch seconds), `info.error`, prompt_tokens / output_tokens (or
input_metrics / output_metrics total_tokens), and `config.strategy` (type_ constant / poisson
with a rate, concurrent with streams, synchronous, throughput).

TTFT = first_token_iteration - request_start and E2E = request_end - request_start, as guidellm
computes them; arrivals are the request_start times (when each request was sent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagesim.realruns.fields import RealRunError, Record, find_model_config
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

FORMAT = "guidellm"
STATUSES = ("successful", "errored", "incomplete")


def looks_like(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list)
            and all(isinstance(b, dict) and "requests" in b for b in doc["benchmarks"]))


def _tokens(rec: Record, name: str, usage: str) -> int | None:
    value = rec.int(name, optional=True, minimum=0)
    if value is None and rec.has(usage):
        value = rec.obj(usage).int("total_tokens", optional=True, minimum=0)
    return value


CLOSED_LOOP_KINDS = ("concurrent", "synchronous")  # N (or 1) clients sending back to back


def _strategy(bench: Record) -> tuple[float | None, int | None, str]:
    config = bench.obj("config", optional=True)
    strategy = config.obj("strategy", optional=True) if config else None
    if strategy is None:
        return None, None, "unknown"
    kind = strategy.str("type_", optional=True) or strategy.str("type", optional=True) or "unknown"
    rate = strategy.num("rate", optional=True, minimum=0)
    concurrency = (strategy.int("streams", optional=True, minimum=1) or strategy.int("max_concurrency", optional=True)
                   or (1 if kind == "synchronous" else None))
    return rate, concurrency, kind


def read(path: Path, doc: dict) -> RealRun:
    top = Record(path, None, doc)
    benches = top.list("benchmarks")
    if not benches:
        raise top.fail("benchmarks", "is empty")
    rows, stage_info, assumptions = [], [], []
    no_prompt = 0
    model = None
    for k, raw_bench in enumerate(benches):
        bench = Record(path, f"benchmarks[{k}]", raw_bench)
        groups = bench.obj("requests")
        listed = 0
        for status in STATUSES:
            for i, raw in enumerate(groups.list(status, optional=True) or ()):
                where = f"benchmarks[{k}].requests.{status}[{i}]"
                rec = Record(path, where, raw)
                info = rec.obj("info")
                timings = info.obj("timings")
                ok = status == "successful"
                start = timings.num("request_start", optional=not ok) or rec.num("request_start_time", optional=not ok)
                prompt_len = _tokens(rec, "prompt_tokens", "input_metrics")
                if ok and not prompt_len:
                    raise rec.fail("prompt_tokens", "a successful request without a prompt length")
                if start is None or not prompt_len:
                    no_prompt += 1  # a failed request that never started or has no prompt length
                    continue
                listed += 1
                output_len = _tokens(rec, "output_tokens", "output_metrics") or 0
                first = timings.num("first_token_iteration", optional=not ok)
                end = timings.num("request_end", optional=True) or rec.num("request_end_time", optional=not ok)
                if ok and not start <= first <= end:
                    raise rec.fail("info.timings", "times out of order (request_start <= first token <= request_end)")
                if ok and output_len < 1:
                    raise rec.fail("output_tokens", "a successful request with no output tokens")
                error = "" if ok else (info.str("error", optional=True) or status)
                rows.append((start, k, rec.data.get("request_id", where), prompt_len, output_len, ok, error,
                             None if first is None else first - start, None if end is None else end - start))
        totals = (bench.obj("metrics", optional=True) or Record(path, None, {})).obj("request_totals", optional=True)
        recorded = sum(totals.int(s, optional=True) or 0 for s in STATUSES) if totals else None
        if recorded is not None and recorded > listed:
            assumptions.append(f"benchmark {k} lists {listed} of its {recorded} requests (guidellm sampled them): "
                               "the replay has less load than the run")
        stage_info.append(_strategy(bench))
        backend = (bench.obj("config", optional=True) or Record(path, None, {})).data.get("backend")
        if model is None and isinstance(backend, dict):
            model = backend.get("model")
    if not rows:
        raise RealRunError(path, "no request with a start time and a prompt length", field="benchmarks")
    rows.sort(key=lambda r: (r[0], r[1]))
    first_start = rows[0][0]
    requests = [RealRequest(index=i, arrival_s=start - first_start, prompt_len=p, output_len=o,
                            generated_len=max(o, 1), ok=ok, error=err, ttft_s=ttft if ok else None,
                            e2e_s=e2e if ok else None, stage=k, abandoned_after_s=None if ok else e2e)
                for i, (start, k, _, p, o, ok, err, ttft, e2e) in enumerate(rows)]
    stages = []
    for k, (rate, concurrency, kind) in enumerate(stage_info):
        times = [r.arrival_s for r in requests if r.stage == k]
        if times:
            stages.append(Stage(k, times[0], times[-1], len(times), rate=rate, concurrency=concurrency,
                                closed_loop=kind in CLOSED_LOOP_KINDS))
    if no_prompt:
        assumptions.append(f"{no_prompt} failed requests recorded no start time or prompt length: left out of the replay")
    failed = sum(not r.ok for r in requests)
    if failed:
        assumptions.append(f"{failed} errored or incomplete requests kept in the replay (their recorded output "
                           "count, at least one token), left out of the measured metrics")
    assumptions.append("request index = position in arrival order (guidellm's request ids are strings)")
    assumptions.append("each request generates its recorded output_tokens (max_tokens / ignore_eos not recorded)")
    assumptions.append("prompt contents not recorded: replayed without prefix sharing")
    if any(kind in ("concurrent", "synchronous", "throughput") for _, _, kind in stage_info):
        if len(stages) == 1 and stages[0].closed_loop:
            assumptions.append("one closed-loop stage: validate replays it closed loop, with as many clients")
        else:
            assumptions.append("several stages with closed-loop ones (a fixed number of requests in flight): validate "
                               "replays them one after another, each closed-loop stage with as many clients, the "
                               "others at their recorded gaps")
    version = (doc.get("metadata") or {}).get("guidellm_version") if isinstance(doc.get("metadata"), dict) else None
    if version and not str(version).startswith("0.8"):
        assumptions.append(f"written by guidellm {version}; this reader follows 0.8.1's schema")
    server = ServerConfig(model=model, model_config=find_model_config(path, model))
    return RealRun(path.stem, FORMAT, str(path), server, requests, stages, assumptions)

"""`vllm bench serve --save-result --save-detailed` result JSON (vllm/benchmarks/serve.py):
per-request lists input_lens, output_lens, ttfts, itls (each request's token gaps), errors ("" on
success), and in current versions latencies (E2E) and start_times (when each request was sent,
perf_counter seconds); plus model_id, request_rate ("inf" or req/s), burstiness,
max_concurrency, num_prompts and any `--metadata KEY=VALUE` pairs at the top level.

Server settings are not part of the result; the ones given as --metadata under vLLM's names
(tensor_parallel_size=2, max_num_seqs=128, enable_prefix_caching=true, gpu=h100-80gb, ...) are
read into the run's ServerConfig, so a user's own runs carry their settings.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from pagesim.inputs import MAX_SIM_SECONDS, MAX_TRACE_SECONDS
from pagesim.realruns.fields import Record, find_model_config
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig, Stage

FORMAT = "vllm-bench"
LISTS = ("input_lens", "output_lens", "ttfts")


def looks_like(doc: Any) -> bool:
    return isinstance(doc, dict) and all(name in doc for name in LISTS)


def _setting(value: Any, kind: type) -> Any:
    """A --metadata value (text) as the ServerConfig field's type; None when it is not one."""
    if isinstance(value, str):
        text = value.strip()
        if kind is bool:
            return {"true": True, "false": False, "1": True, "0": False}.get(text.lower())
        try:
            return kind(text) if kind in (int, float) else text
        except ValueError:
            return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value if isinstance(value, kind) else None


def _server(top: Record, path: Path, assumptions: list[str]) -> ServerConfig:
    kinds = {"int | None": int, "bool | None": bool, "float | None": float, "str | None": str}
    settings = {}
    for f in fields(ServerConfig):
        if f.name in top.data and f.name != "model":
            kind = kinds.get(str(f.type), str)
            value = _setting(top.data[f.name], kind)
            if value is None:
                raise top.fail(f.name, f"must be of type {kind.__name__} (a --metadata server setting), "
                                       f"got {top.data[f.name]!r}")
            settings[f.name] = value
    if settings:
        assumptions.append(f"server settings from the result's --metadata: {', '.join(sorted(settings))}")
    model = top.str("model_id", optional=True)
    return ServerConfig(**{"model": model, "model_config": find_model_config(path, model), **settings})


def read(path: Path, doc: dict) -> RealRun:
    top = Record(path, None, doc)
    columns = {name: top.list(name) for name in LISTS}
    for name in ("itls", "latencies", "start_times", "errors"):
        columns[name] = top.list(name, optional=True)
    n = len(columns["input_lens"])
    for name, column in columns.items():
        if column is not None and len(column) != n:
            raise top.fail(name, f"has {len(column)} entries, input_lens has {n}")
    if n == 0:
        raise top.fail("input_lens", "is empty")
    assumptions: list[str] = []
    arrivals = _arrivals(top, columns["start_times"], n, assumptions)
    requests = []
    inferred_ok = 0
    for i in range(n):
        rec = Record(path, i, {name: (col[i] if col is not None else None) for name, col in columns.items()})
        prompt_len = rec.int("input_lens", minimum=1)
        output_len = rec.int("output_lens", minimum=0)
        error = columns["errors"][i] if columns["errors"] is not None else None
        if error is not None and not isinstance(error, str):
            raise rec.fail("errors", f"must be a string, got {error!r}")
        ttft = rec.num("ttfts", minimum=0, maximum=MAX_SIM_SECONDS)
        # vLLM's client marks a failure with its error text, which may be empty (an HTTP status
        # without a reason); a success always has a first token, after a positive TTFT
        ok = (not error if error is not None else output_len > 0) and ttft > 0
        inferred_ok += error is None
        gaps = rec.list("itls", optional=True)
        if gaps is not None and not _plain_gaps(gaps):  # name the bad gap
            gaps = [Record(path, i, {f"itls[{k}]": g}).num(f"itls[{k}]", minimum=0) for k, g in enumerate(gaps)]
        e2e = rec.num("latencies", optional=True, minimum=0, maximum=MAX_SIM_SECONDS)
        if e2e is None:
            e2e = ttft + sum(gaps or ())
        elif ok and e2e < ttft:
            raise rec.fail("latencies", f"{e2e:g} s is shorter than its TTFT ({ttft:g} s): a request ends after its "
                           "first token")
        requests.append(RealRequest(
            index=i, arrival_s=arrivals[i], prompt_len=prompt_len, output_len=output_len,
            generated_len=max(output_len, 1), ok=ok, error="" if ok else (error or "no first token (no error text recorded)"),
            ttft_s=ttft if ok else None, e2e_s=e2e if ok else None, itl_gaps_s=gaps if ok else None))
    if inferred_ok:
        assumptions.append("no errors list: requests with output tokens are taken as successful")
    if columns["latencies"] is None:
        assumptions.append("no latencies list: E2E = TTFT + the sum of the request's token gaps")
    failed = [r for r in requests if not r.ok]
    if failed:
        assumptions.append(f"{len(failed)} failed requests kept in the replay (one output token each where none was "
                           "recorded), left out of the measured metrics")
    assumptions.append("each request generates its recorded output length (the result does not record max_tokens "
                       "or ignore_eos)")
    assumptions.append("prompt contents not recorded: replayed without prefix sharing")
    order = sorted(range(n), key=lambda i: (arrivals[i], i))
    requests = [requests[i] for i in order]
    span = requests[-1].arrival_s
    rate = doc.get("request_rate")
    rate = float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else None
    concurrency = top.int("max_concurrency", optional=True, minimum=1)
    stages = [Stage(0, 0.0, span, n, rate=rate or (n / span if span > 0 else None), concurrency=concurrency)]
    return RealRun(path.stem, FORMAT, str(path), _server(top, path, assumptions), requests, stages, assumptions)


def _plain_gaps(gaps: list) -> bool:
    return set(map(type, gaps)) <= {int, float} and (not gaps or (min(gaps) >= 0 and max(gaps) < math.inf))


def _arrivals(top: Record, start_times: list | None, n: int, assumptions: list[str]) -> list[float]:
    """Send times from start_times; else the client's arrival process rebuilt (not its draws)."""
    if start_times is not None:
        times = [Record(top.path, i, {"start_times": t}).num("start_times", maximum=MAX_TRACE_SECONDS)
                 for i, t in enumerate(start_times)]
        first = min(times)
        return [t - first for t in times]
    rate = top.data.get("request_rate", "inf")
    if rate == "inf" or rate is None:
        assumptions.append("no start_times: request_rate inf, so every request is taken to arrive at 0 s "
                           + ("(the client kept at most max_concurrency in flight: not replayed)"
                              if top.data.get("max_concurrency") else ""))
        return [0.0] * n
    rate = top.num("request_rate", minimum=1e-9)
    burstiness = top.num("burstiness", optional=True, minimum=1e-9) or 1.0
    seed = top.int("seed", optional=True, maximum=2**63 - 1) or 0
    from pagesim.workload.arrivals import ArrivalProcess

    kind = "poisson" if burstiness == 1.0 else "gamma"
    times = ArrivalProcess(kind, rate, burstiness, seed).times(count=n)
    assumptions.append(f"no start_times: arrivals drawn anew, {kind} at {rate:g} req/s (burstiness {burstiness:g}, "
                       f"seed {seed}), not the client's own draws: per-request comparisons are meaningless, "
                       "distributions are comparable")
    if top.data.get("max_concurrency"):
        assumptions.append("the client kept at most max_concurrency requests in flight: not replayed")
    return [float(t) for t in times]

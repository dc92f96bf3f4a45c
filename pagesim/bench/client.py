"""The load generator (asyncio + aiohttp): the trace's requests, at the trace's arrival times (the same requests and
times `pagesim replay` and `pagesim run` use for the same trace, rate and seed), streamed from an
OpenAI-compatible /v1/completions or /v1/chat/completions, timed per chunk on the client.

A request's arrival is the moment the arrival process says it is due (so time spent waiting for
a --max-concurrency slot counts, as queueing on the server does in the simulator); its first
token and finish are when the first text chunk and the end of the stream are received. Every
request is sent at most once; a failure (HTTP error, broken stream, a value that cannot be a
measurement: see pagesim.bench.stream) is recorded with its reason, never retried, and never
stops the run. Requests longer than the server's max_model_len are skipped or clamped before
sending (pagesim.bench.context).
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass

from pagesim.bench.context import fit_to_context
from pagesim.bench.prompts import PromptMaker
from pagesim.bench.scrape import MAX_METRICS_BYTES, ServerSamples, parse_prometheus
from pagesim.bench.server import BenchError, ServedModel, pick_model
from pagesim.bench.stream import Timing, exception_reason, failure_lines, short, stream_one
from pagesim.core import Request
from pagesim.metrics import MetricsRecorder, RequestRecord, _stats
from pagesim.workload.feeds import Outcome
from pagesim.workload.requests import build_requests, time_origin
from pagesim.workload.sessions import has_sessions, make_feed, session_labels
from pagesim.workload.trace import Trace

__all__ = ["BenchConfig", "BenchError", "bench_requests", "run_bench", "run_bench_async"]

ENDPOINT_TYPES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SIDE_TIMEOUT_S = 10.0  # for /v1/models and /metrics: a slow answer there must not hold the run


@dataclass
class BenchConfig:
    endpoint: str  # base URL, e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str | None = None  # default: the server's first model
    rate: float | None = 1.0  # None: the trace's own arrival times
    burstiness: float = 1.0
    num_requests: int | None = 100
    duration: float | None = None
    seed: int = 0
    max_concurrency: int | None = None  # requests in flight at once, at most
    concurrency: int | None = None  # closed loop: this many clients, each sending when its last request ended
    vocab_size: int | None = None  # for synthetic token ids; default: the server's (pagesim serve says it)
    tokenizer: str | None = None  # send text tokenized by this HF tokenizer instead of token ids
    timeout_s: float = 600.0  # per request
    scrape_interval_s: float = 0.5  # poll the server's /metrics this often (0: never)
    warmup_s: float = 0.0  # from the run's time zero (pagesim.workload.requests.time_origin)
    endpoint_type: str = "completions"  # or "chat" (text prompts: needs a tokenizer)
    clamp_to_max_model_len: bool = False  # shorten requests the server's context cannot hold (else skip them)
    ready_timeout_s: float = 60.0  # wait this long for a server that does not accept connections yet

    @property
    def base(self) -> str:
        url = self.endpoint.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url


def bench_requests(trace: Trace, cfg: BenchConfig) -> tuple[list[Request], list[str]]:
    return build_requests(trace, rate=cfg.rate, burstiness=cfg.burstiness, num_requests=cfg.num_requests,
                          duration=cfg.duration, seed=cfg.seed)


def record_of(req: Request, timing: Timing, skipped: str | None) -> RequestRecord:
    """The request's record in the replay schema; timing's times are already on the run's clock."""
    if skipped is not None or timing.error is not None or timing.finish is None:
        reason = skipped or f"failed: {timing.error or 'no response'}"
        return RequestRecord(req.request_id, "rejected", reason, req.arrival_time, timing.sent, None, None,
                             req.prompt_len, 0, req.sampling.n, 0, 0, 0)
    n = req.sampling.n
    out_len = timing.completion_tokens // n if timing.completion_tokens is not None else len(timing.chunk_times)
    first = timing.chunk_times[0] if timing.chunk_times else timing.finish
    prompt_len = timing.prompt_tokens if timing.prompt_tokens is not None else req.prompt_len
    # all samples' tokens: the server's count, else n samples of the length streamed (bench sends
    # ignore_eos, so each sample runs to the same max_tokens)
    total = timing.completion_tokens if timing.completion_tokens is not None else out_len * n
    return RequestRecord(req.request_id, "finished", "", req.arrival_time, timing.sent, first, timing.finish,
                         prompt_len, out_len, n, 0, 0, 0, total, **RequestRecord.spans_of(timing.chunk_times))


def payload_of(req: Request, prompt, model: str, cfg: BenchConfig) -> dict:
    payload = {"model": model, "ignore_eos": True, "temperature": 0.0, "n": req.sampling.n, "stream": True,
               "stream_options": {"include_usage": True}}
    if cfg.endpoint_type == "chat":
        payload.update(messages=[{"role": "user", "content": prompt}], max_completion_tokens=req.sampling.max_tokens)
    else:
        payload.update(prompt=prompt, max_tokens=req.sampling.max_tokens)
    if req.sampling.n > 1:
        payload["temperature"] = 1.0  # n identical greedy samples would be pointless
        payload["seed"] = cfg.seed + req.request_id
    return payload


def request_headers(req: Request, labels: dict[int, tuple[str, int]]) -> dict[str, str]:
    """x-request-id: the trace request's id (a router's decision log pairs its decisions with the
    trace's requests by it); x-session-id: its session's name, where it is a turn of one (the
    header `pagesim route --router session-affinity` keys on)."""
    headers = {"x-request-id": str(req.request_id)}
    label = labels.get(req.request_id)
    if label is not None:
        headers["x-session-id"] = label[0]
    return headers


def outcome_of(req: Request, timing: Timing, skipped: str | None) -> Outcome:
    """How a sent (or skipped) request ended, for a feed that releases on ends (sessions, closed loop)."""
    if skipped is not None or timing.error is not None or timing.finish is None:
        return Outcome(skipped or f"failed: {timing.error or 'no response'}")
    n = req.sampling.n
    out_len = timing.completion_tokens // n if timing.completion_tokens is not None else len(timing.chunk_times)
    ids = timing.output_token_ids
    return Outcome(None, out_len, ids if ids is not None and len(ids) == out_len else None)


async def _server_models(client, cfg: BenchConfig, warn=None):
    """The decoded JSON of /v1/models, or None if the server answered something else. A server
    that does not accept connections yet (just started) is waited for, up to ready_timeout_s,
    as `vllm bench serve` waits for its endpoint."""
    import aiohttp

    deadline = time.monotonic() + cfg.ready_timeout_s
    waited = False
    while True:
        try:
            async with client.get(f"{cfg.base}/v1/models", timeout=aiohttp.ClientTimeout(total=SIDE_TIMEOUT_S)) as resp:
                if resp.status != 200:
                    return None
                return await resp.json(content_type=None)
        except aiohttp.ClientConnectionError as e:  # nobody listening (yet)
            if time.monotonic() >= deadline:
                raise BenchError(f"{cfg.base}: no server answers ({short(str(e) or type(e).__name__)})"
                                 + (f" after {cfg.ready_timeout_s:g} s" if cfg.ready_timeout_s else "")) from None
            if not waited and warn is not None:
                warn(f"waiting up to {cfg.ready_timeout_s:g} s for a server at {cfg.base}")
            waited = True
            await asyncio.sleep(0.5)
        except Exception:  # noqa: BLE001 - not JSON, too slow: an answer bench cannot use
            return None


def _prompt_maker(cfg: BenchConfig, served: ServedModel, requests: list[Request], tokenizer=None) -> PromptMaker:
    if tokenizer is None and cfg.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
    if cfg.endpoint_type == "chat" and tokenizer is None:
        raise BenchError("--endpoint-type chat sends text: pass --tokenizer (the model's, to get the lengths right)")
    vocab = cfg.vocab_size or served.vocab_size or (len(tokenizer) if tokenizer is not None else None)
    if vocab is None and any(r.prompt_token_ids is None for r in requests):
        raise BenchError("the trace has no token ids and the server does not say its vocabulary size: "
                         "pass --vocab-size or --tokenizer")
    return PromptMaker(vocab or 0, cfg.seed, tokenizer)


async def run_bench_async(trace: Trace, cfg: BenchConfig, progress=None, warn=None,
                          tokenizer=None) -> tuple[dict, MetricsRecorder]:
    """Returns (summary, metrics); warn(message) gets what the server said that bench ignored;
    tokenizer: cfg.tokenizer already loaded (else it is loaded here)."""
    import aiohttp

    if cfg.endpoint_type not in ENDPOINT_TYPES:
        raise BenchError(f"unknown endpoint type {cfg.endpoint_type!r}: {', '.join(ENDPOINT_TYPES)}")
    requests, notes = bench_requests(trace, cfg)
    origin = time_origin(requests, cfg.rate)
    # sessions and closed loop release requests as earlier ones end (the simulator's feed)
    feed = make_feed(trace, requests, cfg.concurrency, origin, sessions_at_rate=cfg.rate is not None)
    want_ids = has_sessions(trace)  # a turn's history is what the server returned: ask for its ids
    # aiohttp rather than httpx: httpx's connection pool scans every connection per request,
    # which with thousands in flight made the client the bottleneck (measured: 150 req/s)
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0)  # 0: no cap on connections
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        served = pick_model(await _server_models(client, cfg, warn), cfg.model, cfg.base)
        for message in served.warnings:
            notes.append(message)
            if warn is not None:
                warn(message)
        # a dynamic feed's prompts are made as they are released: each is fitted then
        fit = fit_to_context(requests if feed.static else [], served.max_model_len, cfg.clamp_to_max_model_len)
        note = fit.note(served.max_model_len) if served.max_model_len else None
        if note:
            notes.append(note)
            if warn is not None:
                warn(note)
        prompts = _prompt_maker(cfg, served, fit.requests if feed.static else requests, tokenizer)
        url = f"{cfg.base}{ENDPOINT_TYPES[cfg.endpoint_type]}"
        limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        samples = ServerSamples()
        samples.before = await _scrape_one(client, cfg, samples, record=False)
        timings = {r.request_id: Timing() for r in requests}
        done = len(fit.skipped)
        if progress is not None and done:
            progress(done)
        clock = time.perf_counter
        start = clock()

        sent = {r.request_id: r for r in fit.requests}  # as sent: clamped, or built from a session's history
        wake = asyncio.Event()  # a dynamic feed's release may have come: an end was reported

        labels = session_labels(trace, requests)

        def ended(req: Request, outcome: Outcome) -> None:
            feed.on_finished(req, clock() - start + origin, outcome)
            wake.set()

        async def one(req: Request) -> None:
            nonlocal done
            timing = timings[req.request_id]
            try:
                if req.sampling.use_beam_search:
                    timing.error = "beam search is not part of the OpenAI API"
                    return
                payload = payload_of(req, prompts.prompt(req), served.id, cfg)
                if want_ids:
                    payload["return_token_ids"] = True
                async with limit if limit is not None else nullcontext():
                    timing.sent = clock()
                    await stream_one(client, url, payload, timing, cfg.endpoint_type, clock,
                                     request_headers(req, labels))
            except asyncio.TimeoutError:
                timing.error = f"no complete answer within --timeout {cfg.timeout_s:g} s"
            except Exception as e:  # noqa: BLE001 - a failed request is counted, never retried
                timing.error = exception_reason(e)
            finally:
                # onto the run's clock: seconds from the start, plus the trace's time zero
                def shift(t):
                    return None if t is None else t - start + origin

                timing.sent, timing.finish = shift(timing.sent), shift(timing.finish)
                timing.chunk_times = [shift(t) for t in timing.chunk_times]
                done += 1
                if progress is not None:
                    progress(done)
                if not feed.static:
                    ended(req, outcome_of(req, timing, None))

        async def released() -> None:
            """Send what a dynamic feed releases, when it releases it; one fitted to the context as it
            goes (skipped ones end at once, with their reason, as turned-away session turns do)."""
            nonlocal done
            while not feed.exhausted:
                wake.clear()
                due = feed.next_time()
                wait = None if due == math.inf else (due - origin) - (clock() - start)
                if wait is None or wait > 0:
                    try:
                        await asyncio.wait_for(wake.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
                    continue
                req = feed.pop()
                reason = feed.reject_reason(req)
                if reason is None:
                    fitted = fit_to_context([req], served.max_model_len, cfg.clamp_to_max_model_len)
                    fit.num_clamped += fitted.num_clamped
                    req = fitted.requests[0] if fitted.requests else req
                    reason = fitted.skipped.get(req.request_id)
                sent[req.request_id] = req
                if reason is not None:
                    fit.skipped[req.request_id] = reason
                    done += 1
                    if progress is not None:
                        progress(done)
                    ended(req, Outcome(reason))
                    continue
                tasks.append(asyncio.ensure_future(one(req)))
            await asyncio.gather(*tasks)  # (the last ends release nothing more)

        scraper = asyncio.ensure_future(_scrape_loop(client, cfg, samples)) if cfg.scrape_interval_s > 0 else None
        tasks = []
        if feed.static:
            for req in fit.requests:  # at most one send per request, at its arrival time
                delay = (req.arrival_time - origin) - (clock() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(one(req)))
        else:
            await released()
        await asyncio.gather(*tasks)
        if scraper is not None:
            scraper.cancel()
        samples.after = await _scrape_one(client, cfg, samples, record=False)

    metrics = MetricsRecorder(0, cfg.warmup_s, origin=origin)
    for req in requests:
        record = record_of(sent.get(req.request_id, req), timings[req.request_id], fit.skipped.get(req.request_id))
        record.session_id, record.turn = labels.get(req.request_id, (None, None))
        metrics.requests.append(record)
    failed = [t.error or "no response" for rid, t in timings.items() if rid not in fit.skipped and
              (t.error is not None or t.finish is None)]
    itl = [x for r in metrics.requests for x in r.inter_token_latencies]
    summary = metrics.summary(
        driver="http", endpoint=cfg.base, model=served.id, run=asdict(cfg), notes=notes,
        endpoint_type=cfg.endpoint_type, server_max_model_len=served.max_model_len,
        num_failed=len(failed), num_skipped=len(fit.skipped), num_clamped=fit.num_clamped,
        num_sent=sum(t.sent is not None for t in timings.values()),
        failure_reasons=failure_lines([f"failed: {reason}" for reason in failed] + list(fit.skipped.values())),
        num_kv_blocks=None, kv_token_slots=None, num_swapped_blocks=None, num_copied_blocks=None,
        memory_saving=None, memory_saving_per_step=None, prefix_hit_rate=None, prefix_blocks_queried=None,
        prefill_tokens_saved=None, **samples.summary(), **_stats("itl", itl),
    )
    return summary, metrics


async def _scrape_one(client, cfg: BenchConfig, samples: ServerSamples, record: bool = True) -> dict[str, float]:
    """One read of the server's /metrics ({} if it has none, or does not answer in time)."""
    import aiohttp

    try:
        async with client.get(f"{cfg.base}/metrics", timeout=aiohttp.ClientTimeout(total=SIDE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return {}
            values = parse_prometheus((await resp.content.read(MAX_METRICS_BYTES)).decode("utf-8", errors="replace"))
    except Exception:  # noqa: BLE001 - a server without /metrics is measured from the client alone
        return {}
    if record:
        samples.add(values)
    return values


async def _scrape_loop(client, cfg: BenchConfig, samples: ServerSamples) -> None:
    while True:
        await _scrape_one(client, cfg, samples)
        await asyncio.sleep(cfg.scrape_interval_s)


def failed_share(summary: dict) -> float:
    """The share of the requests that were not measured: failed, or skipped as too long."""
    total = summary["num_requests"]
    return (summary["num_failed"] + summary["num_skipped"]) / total if total else 0.0


def run_bench(trace: Trace, cfg: BenchConfig, progress=None, warn=None, tokenizer=None) -> tuple[dict, MetricsRecorder]:
    return asyncio.run(run_bench_async(trace, cfg, progress, warn, tokenizer))

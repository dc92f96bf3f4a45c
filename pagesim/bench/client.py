"""The load generator (asyncio + aiohttp): the trace's requests, at the trace's arrival times (the same requests and
times `pagesim replay` and `pagesim run` use for the same trace, rate and seed), streamed from an
OpenAI-compatible /v1/completions, timed per token on the client.

A request's arrival is the moment the arrival process says it is due (so time spent waiting for
a --max-concurrency slot counts, as queueing on the server does in the simulator); its first
token and finish are when the first text chunk and the end of the stream are received. Every
request is sent at most once; a failure (HTTP error, broken stream) is recorded, not retried.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

from pagesim.bench.prompts import PromptMaker
from pagesim.bench.scrape import ServerSamples, parse_prometheus
from pagesim.core import Request
from pagesim.metrics import MetricsRecorder, RequestRecord, _stats
from pagesim.workload.requests import build_requests
from pagesim.workload.trace import Trace


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
    vocab_size: int | None = None  # for synthetic token ids; default: the server's (pagesim serve says it)
    tokenizer: str | None = None  # send text tokenized by this HF tokenizer instead of token ids
    timeout_s: float = 600.0  # per request
    scrape_interval_s: float = 0.5  # poll the server's /metrics this often (0: never)
    warmup_s: float = 0.0

    @property
    def base(self) -> str:
        url = self.endpoint.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url


@dataclass
class Timing:
    """What the client saw of one request."""

    request: Request
    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying text
    finish: float | None = None
    prompt_tokens: int | None = None  # from the server's usage, when it sends one
    completion_tokens: int | None = None
    error: str | None = None

    def record(self) -> RequestRecord:
        req = self.request
        if self.error is not None or self.finish is None:
            return RequestRecord(req.request_id, "rejected", f"failed: {self.error or 'no response'}", req.arrival_time,
                                 self.sent, None, None, req.prompt_len, 0, req.sampling.n, 0, 0, 0)
        n = req.sampling.n
        out_len = self.completion_tokens // n if self.completion_tokens is not None else len(self.chunk_times)
        return RequestRecord(req.request_id, "finished", "", req.arrival_time, self.sent,
                             self.chunk_times[0] if self.chunk_times else self.finish, self.finish,
                             self.prompt_tokens if self.prompt_tokens is not None else req.prompt_len, out_len, n, 0, 0, 0)

    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


class BenchError(Exception):
    """The benchmark cannot start (server unreachable, no model, no vocabulary)."""


def bench_requests(trace: Trace, cfg: BenchConfig) -> tuple[list[Request], list[str]]:
    return build_requests(trace, rate=cfg.rate, burstiness=cfg.burstiness, num_requests=cfg.num_requests,
                          duration=cfg.duration, seed=cfg.seed)


async def _server_info(client, cfg: BenchConfig) -> dict:
    try:
        async with client.get(f"{cfg.base}/v1/models") as resp:
            resp.raise_for_status()
            models = (await resp.json(content_type=None))["data"]
    except Exception as e:  # noqa: BLE001 - any failure here means the endpoint is unusable
        raise BenchError(f"{cfg.base}/v1/models: {e}") from None
    if not models:
        raise BenchError(f"{cfg.base}/v1/models lists no model")
    if cfg.model is None:
        return models[0]
    for m in models:
        if m.get("id") == cfg.model:
            return m
    raise BenchError(f"the server has no model {cfg.model!r}; it has {', '.join(m.get('id', '?') for m in models)}")


async def _stream_one(client, url: str, payload: dict, timing: Timing) -> None:
    clock = time.perf_counter
    async with client.post(url, json=payload) as resp:
        if resp.status != 200:
            body = (await resp.read()).decode(errors="replace")
            try:
                body = json.loads(body)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            timing.error = f"HTTP {resp.status}: {body[:200]}"
            return
        async for raw in resp.content:  # one line at a time
            if not raw.startswith(b"data:"):
                continue
            data = raw[5:].strip()
            if data == b"[DONE]":
                timing.finish = clock()
                return
            chunk = json.loads(data)
            if chunk.get("usage"):
                timing.prompt_tokens = chunk["usage"].get("prompt_tokens")
                timing.completion_tokens = chunk["usage"].get("completion_tokens")
            if any(c.get("text") for c in chunk.get("choices") or ()):
                timing.chunk_times.append(clock())
    timing.error = "the stream ended without [DONE]"


async def run_bench_async(trace: Trace, cfg: BenchConfig, progress=None) -> tuple[dict, MetricsRecorder]:
    import aiohttp

    requests, notes = bench_requests(trace, cfg)
    # aiohttp rather than httpx: httpx's connection pool scans every connection per request,
    # which with thousands in flight made the client the bottleneck (measured: 150 req/s)
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0)  # 0: no cap on connections
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        info = await _server_info(client, cfg)
        model = info["id"]
        tokenizer = None
        if cfg.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
        vocab = cfg.vocab_size or info.get("vocab_size") or (len(tokenizer) if tokenizer is not None else None)
        if vocab is None and any(r.prompt_token_ids is None for r in requests):
            raise BenchError("the trace has no token ids and the server does not say its vocabulary size: "
                             "pass --vocab-size or --tokenizer")
        prompts = PromptMaker(vocab or 0, cfg.seed, tokenizer)
        url = f"{cfg.base}/v1/completions"
        limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        samples = ServerSamples()
        samples.before = await _scrape_one(client, cfg, samples, record=False)
        timings = [Timing(r) for r in requests]
        done = 0
        clock = time.perf_counter
        start = clock()

        async def one(timing: Timing) -> None:
            nonlocal done
            req = timing.request
            payload = {"model": model, "prompt": prompts.prompt(req), "max_tokens": req.sampling.max_tokens,
                       "ignore_eos": True, "temperature": 0.0, "n": req.sampling.n, "stream": True,
                       "stream_options": {"include_usage": True}}
            if req.sampling.n > 1:
                payload["temperature"] = 1.0  # n identical greedy samples would be pointless
                payload["seed"] = cfg.seed + req.request_id
            try:
                if req.sampling.use_beam_search:
                    timing.error = "beam search is not part of the OpenAI API"
                    return
                if limit is not None:
                    async with limit:
                        timing.sent = clock() - start
                        await _stream_one(client, url, payload, timing)
                else:
                    timing.sent = clock() - start
                    await _stream_one(client, url, payload, timing)
            except Exception as e:  # noqa: BLE001 - a failed request is counted, never retried
                timing.error = f"{type(e).__name__}: {e}"
            finally:
                # times relative to the start, like the simulator's clock
                timing.chunk_times = [t - start for t in timing.chunk_times]
                if timing.finish is not None:
                    timing.finish -= start
                done += 1
                if progress is not None:
                    progress(done)

        scraper = asyncio.ensure_future(_scrape_loop(client, cfg, samples)) if cfg.scrape_interval_s > 0 else None
        tasks = []
        for timing in timings:  # at most one send per request, at its arrival time
            delay = timing.request.arrival_time - (clock() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(timing)))
        await asyncio.gather(*tasks)
        if scraper is not None:
            scraper.cancel()
        samples.after = await _scrape_one(client, cfg, samples, record=False)

    metrics = MetricsRecorder(0, cfg.warmup_s)
    for timing in timings:
        metrics.requests.append(timing.record())
    failures = [t for t in timings if t.error is not None]
    itl = [x for t in timings if t.error is None for x in t.inter_token_latencies()]
    summary = metrics.summary(
        driver="http", endpoint=cfg.base, model=model, run=asdict(cfg), notes=notes,
        num_failed=len(failures), num_sent=sum(t.sent is not None for t in timings),
        num_kv_blocks=None, kv_token_slots=None, num_swapped_blocks=None, num_copied_blocks=None,
        memory_saving=None, memory_saving_per_step=None, prefix_hit_rate=None, prefix_blocks_queried=None,
        prefill_tokens_saved=None, **samples.summary(), **_stats("itl", itl),
    )
    return summary, metrics


async def _scrape_one(client, cfg: BenchConfig, samples: ServerSamples, record: bool = True) -> dict[str, float]:
    """One read of the server's /metrics ({} if it has none)."""
    try:
        async with client.get(f"{cfg.base}/metrics") as resp:
            if resp.status != 200:
                return {}
            values = parse_prometheus(await resp.text())
    except Exception:  # noqa: BLE001 - a server without /metrics is measured from the client alone
        return {}
    if record:
        samples.add(values)
    return values


async def _scrape_loop(client, cfg: BenchConfig, samples: ServerSamples) -> None:
    while True:
        await _scrape_one(client, cfg, samples)
        await asyncio.sleep(cfg.scrape_interval_s)


def run_bench(trace: Trace, cfg: BenchConfig, progress=None) -> tuple[dict, MetricsRecorder]:
    return asyncio.run(run_bench_async(trace, cfg, progress))

"""The backends a router forwards to: each one's address, whether it is taking requests (and why
not), its counters, and the scraper that reads its /metrics gauges (vLLM's names, which `pagesim
serve` also uses) into the LoadBoard every staleness interval."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from pagesim.bench.scrape import KV_USAGE, MAX_METRICS_BYTES, RUNNING, parse_prometheus
from pagesim.cluster.routers import Gauges, LoadBoard

WAITING = "vllm:num_requests_waiting"


def backend_url(text: str) -> str:
    """A backend's base URL (scheme://host:port, no trailing / or /v1); ValueError names it."""
    url = text.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    parts = urlsplit(url)
    try:
        parts.port  # raises on a port that is not a number in 0..65535
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.path
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"--backend {text!r}: not an http(s)://HOST:PORT address (optionally ending in /v1)")
    return url


@dataclass
class Backend:
    index: int
    url: str
    up: bool = True  # taking requests: the last scrape or request reached it
    reason: str | None = None  # why it is not
    routed: int = 0  # requests sent to it (a retry counts on the backend it went to)
    failures: int = 0  # requests that failed there (transport errors, a stream cut)
    retries: int = 0  # requests moved from it to another backend
    gauges: Gauges | None = None  # its last reading

    def down(self, board: LoadBoard, reason: str) -> None:
        self.up, self.reason = False, reason
        board.set_accepting(self.index, False)

    def alive(self, board: LoadBoard) -> None:
        self.up, self.reason = True, None
        board.set_accepting(self.index, True)


def gauges_of(values: dict[str, float]) -> Gauges:
    usage = next((values[k] for k in KV_USAGE if k in values), 0.0)
    return Gauges(waiting=int(values.get(WAITING, 0)), running=int(values.get(RUNNING, 0)),
                  kv_usage=min(max(usage, 0.0), 1.0))


SCRAPE_TIMEOUT_S = 5.0  # a busy server answers /metrics late: that is no reason to stop routing to it


async def scrape(session, backend: Backend, board: LoadBoard) -> None:
    """One read of a backend's /metrics: its gauges onto the board. A backend that refuses or
    drops the connection is marked down; one that answers (even without metrics) is up; one
    that answers late keeps its state and its last gauges."""
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        async with session.get(f"{backend.url}/metrics", timeout=timeout) as resp:
            text = (await resp.content.read(MAX_METRICS_BYTES)).decode("utf-8", errors="replace")
            ok = resp.status == 200
    except (aiohttp.ClientConnectionError, ConnectionError) as e:
        backend.down(board, f"its /metrics did not answer ({exception_reason(e)})")
        return
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return
    backend.alive(board)
    if ok:
        backend.gauges = gauges_of(parse_prometheus(text))
        board.report(backend.index, backend.gauges, time.monotonic())


async def scrape_every(session, backends: list[Backend], board: LoadBoard, interval_s: float) -> None:
    """Every interval_s (a round that takes longer delays the next: scrapes never pile up)."""
    while True:
        await asyncio.gather(*(scrape(session, b, board) for b in backends))
        await asyncio.sleep(interval_s)


def exception_reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

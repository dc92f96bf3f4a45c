"""The measured statistics of a real run, over its successful requests, with the keys of
pagesim's own summary.json (`ttft_mean`, `ttft_p50`, ... in seconds), so a replay and the run it
replays are compared key by key.

- TTFT and E2E as recorded, per request.
- TPOT: per request, (E2E - TTFT) / (generated - 1), requests with one token left out (vLLM's
  TPOT). This is the "ITL" the issue and the BLIS study quote for runs that record no token times.
- ITL: pooled over output-token gaps, as vLLM's bench pools them: the measured gaps where the run
  recorded them for every request, otherwise each request's mean gap counted once per gap (the
  same mean as pooling the real gaps; percentiles spread less than the real gaps would).
- Throughput: successful requests (tokens: their generated tokens) over the span from the first
  arrival to the last successful finish.
"""

from __future__ import annotations

import numpy as np

from pagesim.metrics import percentile, weighted_percentiles
from pagesim.realruns.types import RealRequest

QUANTILES = (50, 90, 99)


def _stats(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_mean": None, **{f"{name}_p{q}": None for q in QUANTILES}}
    return {f"{name}_mean": sum(values) / len(values), **{f"{name}_p{q}": percentile(values, q) for q in QUANTILES}}


def _itl_stats(ok: list[RealRequest]) -> dict:
    if ok and all(r.itl_gaps_s for r in ok if r.generated_len > 1):
        gaps = np.fromiter((g for r in ok for g in (r.itl_gaps_s or ())), dtype=float)
        if gaps.size:
            qs = np.percentile(gaps, QUANTILES)
            return {"itl_mean": float(gaps.mean()), **{f"itl_p{q}": float(v) for q, v in zip(QUANTILES, qs)},
                    "itl_source": "measured token gaps"}
    pairs = [(r.itl_s, r.generated_len - 1) for r in ok if r.itl_s is not None]
    if not pairs:
        return {**_stats("itl", []), "itl_source": None}
    values = np.array([v for v, _ in pairs], dtype=float)
    weights = np.array([w for _, w in pairs], dtype=np.int64)
    qs = weighted_percentiles(values, weights, list(QUANTILES))
    return {"itl_mean": float((values * weights).sum() / weights.sum()),
            **{f"itl_p{q}": v for q, v in zip(QUANTILES, qs)},
            "itl_source": "each request's mean gap, once per gap"}


def measured_summary(requests: list[RealRequest]) -> dict:
    ok = [r for r in requests if r.ok and r.e2e_s is not None]
    start = min((r.arrival_s for r in requests), default=0.0)
    end = max((r.finish_s for r in ok), default=start)
    duration = end - start

    def per_second(count: float) -> float | None:
        return count / duration if duration > 0 else None

    generated = sum(r.generated_len for r in ok)
    return {
        "num_requests": len(requests),
        "num_ok": len(ok),
        "num_failed": len(requests) - len(ok),
        "duration_s": duration,
        "request_throughput": per_second(len(ok)),
        "output_token_throughput": per_second(generated),
        "total_token_throughput": per_second(generated + sum(r.prompt_len for r in ok)),
        **_stats("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]),
        **_stats("tpot", [r.itl_s for r in ok if r.itl_s is not None]),
        **_itl_stats(ok),
        **_stats("e2e", [r.e2e_s for r in ok]),
    }

"""Latency SLOs: parsing `ttft_p99=2.0,tpot_p99=0.1,goodput=0.9` and checking them on a run.

A latency SLO names a per-request metric and a statistic over the measured requests:
``<metric>_<stat>=<seconds>`` with metric one of ttft, tpot, e2e, normalized_latency and stat
``mean`` or a percentile ``pNN`` (p50, p90, p95, p99, p99.9, ...). It holds when the statistic is
<= the threshold. ``goodput=F`` holds when at least a fraction F of the measured requests meet
every latency threshold individually (a rejected request meets none).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pagesim.metrics import percentile

# Per-request latencies a run records, by metric: the pagesim.metrics.RequestRecord property
# each is, in seconds (normalized_latency in seconds per output token).
_RECORD_ATTRIBUTE = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e_latency", "normalized_latency": "normalized_latency"}
LATENCY_METRICS = tuple(_RECORD_ATTRIBUTE)


def request_latencies(record) -> dict[str, float | None]:
    """One request's latencies by metric (LATENCY_METRICS), from its RequestRecord."""
    return {metric: getattr(record, attribute) for metric, attribute in _RECORD_ATTRIBUTE.items()}


def latency_lists(records) -> dict[str, list[float | None]]:
    """Each metric's latencies over the records, in their order: what slo_values takes."""
    return {metric: [getattr(r, attribute) for r in records] for metric, attribute in _RECORD_ATTRIBUTE.items()}


GOODPUT = "goodput"
_STAT = re.compile(r"^(mean|p(\d+(?:\.\d+)?))$")
# `mean_normalized_latency` is the summary's name for the paper's metric; accept it as an alias.
ALIASES = {"mean_normalized_latency": "normalized_latency_mean"}


class SLOError(ValueError):
    pass


def valid_names_help() -> str:
    metrics = ", ".join(f"{m}_<stat>" for m in LATENCY_METRICS)
    return (f"valid SLO names: {metrics} with <stat> = mean or a percentile pNN (p50, p90, p99, p99.9), "
            f"and {GOODPUT}=<fraction in (0, 1]>; e.g. ttft_p99=2.0,tpot_p99=0.1")


@dataclass(frozen=True)
class SLO:
    metric: str  # one of LATENCY_METRICS, or "goodput"
    stat: str  # "mean" or "pNN"; "" for goodput
    threshold: float

    @property
    def name(self) -> str:
        return self.metric if self.metric == GOODPUT else f"{self.metric}_{self.stat}"

    @property
    def is_latency(self) -> bool:
        return self.metric != GOODPUT

    def describe(self) -> str:
        if not self.is_latency:
            return f"goodput >= {self.threshold:g}"
        unit = " s/token" if self.metric == "normalized_latency" else " s"
        return f"{self.name} <= {self.threshold:g}{unit}"

    def holds(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.threshold if self.metric == GOODPUT else value <= self.threshold


def parse_slos(text: str) -> list[SLO]:
    """`ttft_p99=2.0,tpot_p99=0.1` -> [SLO, SLO]. Raises SLOError naming the bad item."""
    slos: list[SLO] = []
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise SLOError(f"no SLO given; {valid_names_help()}")
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip().rstrip("<").strip().lower()
        name = ALIASES.get(name, name)
        if not sep:
            raise SLOError(f"SLO {item!r}: expected NAME=VALUE; {valid_names_help()}")
        try:
            threshold = float(raw)
        except ValueError:
            raise SLOError(f"SLO {item!r}: value {raw.strip()!r} is not a number") from None
        if not threshold >= 0 or threshold == float("inf"):
            raise SLOError(f"SLO {item!r}: value must be a finite number >= 0")
        if name == GOODPUT:
            if not 0 < threshold <= 1:
                raise SLOError(f"SLO {item!r}: goodput is a fraction of requests in (0, 1]")
            slo = SLO(GOODPUT, "", threshold)
        else:
            slo = _latency_slo(name, threshold, item)
        if any(s.name == slo.name for s in slos):
            raise SLOError(f"SLO {slo.name} given twice")
        slos.append(slo)
    if any(s.metric == GOODPUT for s in slos) and not any(s.is_latency for s in slos):
        raise SLOError("goodput needs at least one latency SLO (the per-request thresholds it counts)")
    return slos


def _latency_slo(name: str, threshold: float, item: str) -> SLO:
    for metric in sorted(LATENCY_METRICS, key=len, reverse=True):  # normalized_latency before others
        if name.startswith(metric + "_"):
            stat = name[len(metric) + 1:]
            m = _STAT.match(stat)
            if m and (m.group(2) is None or 0 < float(m.group(2)) < 100):
                return SLO(metric, stat, threshold)
    raise SLOError(f"unknown SLO {item!r}; {valid_names_help()}")


def statistic(values: list[float], stat: str) -> float | None:
    """`mean` or `pNN` of the values (percentiles as pagesim.metrics computes them)."""
    if not values:
        return None
    if stat == "mean":
        return sum(values) / len(values)
    return percentile(values, float(stat[1:]))


def slo_values(latencies: dict[str, list[float | None]], slos: list[SLO]) -> dict[str, float | None]:
    """Each SLO's measured value. `latencies` maps metric -> one value per measured request
    (None where the request has none: rejected, or tpot of a one-token output)."""
    out: dict[str, float | None] = {}
    for slo in slos:
        if slo.is_latency:
            out[slo.name] = statistic([v for v in latencies[slo.metric] if v is not None], slo.stat)
        else:
            out[slo.name] = goodput(latencies, [s for s in slos if s.is_latency])
    return out


def goodput(latencies: dict[str, list[float | None]], latency_slos: list[SLO]) -> float | None:
    """Fraction of measured requests meeting every latency threshold individually. A request
    without a TPOT (one output token) meets a TPOT threshold; one that never finished (rejected,
    no e2e latency) meets nothing."""
    count = len(latencies["e2e"])
    if count == 0:
        return None
    good = 0
    for i in range(count):
        if latencies["e2e"][i] is None:
            continue
        ok = True
        for slo in latency_slos:
            v = latencies[slo.metric][i]
            if v is not None and v > slo.threshold:
                ok = False
                break
        good += ok
    return good / count


class FailureWatch:
    """Tells, as measured requests finish one by one, when an SLO is certain to fail over all
    `num_measured` of them, whatever the rest do (so the run can stop):
    - pNN: once at least N - floor((N - 1) q) values exceed the threshold, the value at the
      lower of the two ranks the percentile interpolates between does (N = num_measured bounds
      the number with a value, and that count never shrinks as N does);
    - mean: once the sum exceeds threshold x N (the remaining values are >= 0);
    - goodput F: once more than N (1 - F) requests miss a latency threshold."""

    def __init__(self, slos: list[SLO], num_measured: int):
        self.slos, self.n = slos, num_measured
        self.over = {s.name: 0 for s in slos}
        self.sums = {s.name: 0.0 for s in slos}
        self.bad = 0

    def add(self, latencies: dict[str, float | None]) -> SLO | None:
        """One finished measured request's latencies (metric -> value or None); returns the SLO
        now certain to fail, or None."""
        missed = False
        for s in self.slos:
            if not s.is_latency:
                continue
            v = latencies[s.metric]
            if v is None:
                continue
            missed |= v > s.threshold
            if s.stat == "mean":
                self.sums[s.name] += v
                if self.sums[s.name] > s.threshold * self.n:
                    return s
            elif v > s.threshold:
                self.over[s.name] += 1
                if self.over[s.name] >= self.n - math.floor((self.n - 1) * float(s.stat[1:]) / 100):
                    return s
        self.bad += missed
        for s in self.slos:
            if not s.is_latency and self.bad > self.n * (1 - s.threshold):
                return s
        return None


def clear_pass(latencies: dict[str, list[float | None]], slos: list[SLO]) -> bool:
    """Whether every SLO holds by more than its run's noise: the 95 % batch-means interval
    (pagesim.plan.steady) of what it bounds lies on the passing side. What it bounds, per
    measured request in arrival order: a mean SLO, the values; pNN <= T, the indicator value > T
    (whose mean must stay below 1 - NN/100); goodput >= F, the indicator "meets every threshold"
    (whose mean must stay above F)."""
    from pagesim.plan.steady import mean_interval_of_batches

    latency_slos = [s for s in slos if s.is_latency]
    for s in slos:
        if s.is_latency:
            values = [v for v in latencies[s.metric] if v is not None]
            if s.stat == "mean":
                series, bound = values, s.threshold
            else:
                series, bound = [1.0 if v > s.threshold else 0.0 for v in values], 1 - float(s.stat[1:]) / 100
            interval = mean_interval_of_batches(series)
            if interval is None or interval[1] > bound:
                return False
        else:
            good = [1.0 if latencies["e2e"][i] is not None and all(
                latencies[x.metric][i] is None or latencies[x.metric][i] <= x.threshold for x in latency_slos) else 0.0
                for i in range(len(latencies["e2e"]))]
            interval = mean_interval_of_batches(good)
            if interval is None or interval[0] < s.threshold:
                return False
    return True

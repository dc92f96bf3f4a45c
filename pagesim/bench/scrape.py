"""The server's side of a benchmark, from its Prometheus /metrics (vLLM's names, which `pagesim
serve` also uses): polled while the benchmark runs for the running-batch size and KV usage over
time, and read before and after for the preemptions the run caused. Absent metrics stay None."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RUNNING = "vllm:num_requests_running"
QUEUED = ("vllm:num_requests_waiting", "vllm:num_requests_swapped")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # newer vLLM, older vLLM
PREEMPTIONS = "vllm:num_preemptions_total"
STEPS = "pagesim:engine_steps_total"  # `pagesim serve` only
PREFIX_QUERIES, PREFIX_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"  # tokens (vLLM v1)


MAX_METRICS_BYTES = 4 * 2**20  # of one /metrics answer; the rest is not read
MAX_VALUE = 1e15  # no count or share read here is larger; a larger value is no reading (and sums stay finite)


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value, summed over label sets (a server serving one model has one of each).
    Every counter and gauge read here is a count or a share, so values that are not finite and in
    [0, MAX_VALUE] (legal in the text format: NaN, +Inf, -Inf, negatives) are left out, as are
    lines that do not parse; a server's odd line never reaches a summary."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        sample = _sample(line.strip())
        if sample is not None:
            name, value = sample
            values[name] = values.get(name, 0.0) + value
    return values


def _sample(line: str) -> tuple[str, float] | None:
    """(name, value) of one exposition line `name{labels} value [timestamp]`, or None."""
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    space = min((i for i in (line.find(" "), line.find("\t")) if i >= 0), default=-1)
    if brace >= 0 and (space < 0 or brace < space):
        name, rest = line[:brace], _after_labels(line, brace)
    elif space >= 0:
        name, rest = line[:space], line[space:]
    else:
        return None
    fields = (rest or "").split()
    if not name or not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return (name, value) if math.isfinite(value) and 0 <= value <= MAX_VALUE else None


def _after_labels(line: str, brace: int) -> str | None:
    """What follows the label set opened at `brace` (quoted values may hold braces and spaces)."""
    quoted = escaped = False
    for i in range(brace + 1, len(line)):
        ch = line[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return line[i + 1:]
    return None


@dataclass
class ServerSamples:
    running: list[float] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    before: dict[str, float] = field(default_factory=dict)  # the counters before the run
    after: dict[str, float] = field(default_factory=dict)  # and after it

    def add(self, values: dict[str, float]) -> None:
        # Only samples taken while the server had work: the simulator's means are over its
        # steps, and it takes no steps while idle.
        if values.get(RUNNING, 0) + sum(values.get(k, 0) for k in QUEUED) == 0:
            return
        if RUNNING in values:
            self.running.append(values[RUNNING])
        usage = next((values[k] for k in KV_USAGE if k in values), None)
        if usage is not None and usage <= 1:  # a share; more than the whole pool is no reading
            self.kv_usage.append(usage)

    def summary(self) -> dict:
        """The summary keys a client cannot measure, from the server's view (None when absent):
        sampled at even intervals while busy, so plain means are averages over busy time."""
        return {
            "mean_batched_requests": sum(self.running) / len(self.running) if self.running else None,
            "mean_kv_utilization": sum(self.kv_usage) / len(self.kv_usage) if self.kv_usage else None,
            "peak_kv_utilization": max(self.kv_usage) if self.kv_usage else None,
            "num_preemptions": self.change(PREEMPTIONS),
            "num_steps": self.change(STEPS),
            "server_prefix_cache_queries": self.change(PREFIX_QUERIES),
            "server_prefix_cache_hits": self.change(PREFIX_HITS),
            "num_metric_samples": len(self.running),
        }

    def change(self, counter: str) -> int | None:
        """How much a counter grew during the run (None if the server does not have it, or if it
        went down: a restarted server's counters start again from 0)."""
        if counter in self.before and counter in self.after and self.after[counter] >= self.before[counter]:
            return int(self.after[counter] - self.before[counter])
        return None

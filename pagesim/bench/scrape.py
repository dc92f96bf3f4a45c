"""The server's side of a benchmark, from its Prometheus /metrics (vLLM's names, which `pagesim
serve` also uses): polled while the benchmark runs for the running-batch size and KV usage over
time, and read before and after for the preemptions the run caused. Absent metrics stay None."""

from __future__ import annotations

from dataclasses import dataclass, field

RUNNING = "vllm:num_requests_running"
QUEUED = ("vllm:num_requests_waiting", "vllm:num_requests_swapped")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # newer vLLM, older vLLM
PREEMPTIONS = "vllm:num_preemptions_total"
STEPS = "pagesim:engine_steps_total"  # `pagesim serve` only


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value, summed over label sets (a server serving one model has one of each)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            values[name] = values.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return values


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
        if usage is not None:
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
            "num_metric_samples": len(self.running),
        }

    def change(self, counter: str) -> int | None:
        """How much a counter grew during the run (None if the server does not have it)."""
        if counter in self.before and counter in self.after:
            return int(self.after[counter] - self.before[counter])
        return None

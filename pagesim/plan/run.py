"""One simulated run at one rate: what a plan keeps of it, and whether it is sustainable.

A rate is *sustainable* for a configuration when
1. every SLO holds over the measured requests (those arriving after the warm-up), and
2. the replica keeps up: when the last request arrives, the backlog (requests waiting for
   admission, including preempted ones queued again, and swapped-out ones) is at most
   1 - KEEP_UP_RATIO of the requests that arrived in the measurement window (warm-up end to last
   arrival). A stable replica's backlog stays near zero; an overloaded one's grows by
   (rate - capacity) per second, so keep_up = 1 - backlog / window arrivals ~ capacity / rate.
   This catches a growing queue even when the SLOs alone would not (a TPOT-only SLO is blind to
   queueing). Running requests are not backlog: how many are in flight depends on latency, which
   the SLOs judge. No request may be rejected either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pagesim.core.errors import CannotServe
from pagesim.plan.cache import RunCache, run_key
from pagesim.plan.slo import SLO, slo_values
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace

KEEP_UP_RATIO = 0.9


def simulate(cfg: ReplayConfig, trace: Trace) -> dict:
    """Run the simulator and keep what planning needs (JSON-ready). A configuration that cannot
    serve at all (pagesim.core.errors.CannotServe: the model leaves no KV pool, its heads do not
    split over TP) gives a record with `error`; requests it can never fit are counted as
    rejections. Any other exception is a bug and propagates: it must not pass for "infeasible"."""
    try:
        result = Replay(cfg, trace).run()
    except CannotServe as e:
        return {"rate": cfg.rate, "error": str(e)}
    s = result.summary
    requests = result.metrics.requests
    start = cfg.warmup_s
    last_arrival = max(r.arrival_time for r in requests)
    measured = sorted((r for r in requests if r.arrival_time >= start), key=lambda r: r.request_id)
    backlog = 0
    log = result.metrics.step_log
    for time, waiting, swapped in zip(log.time, log.held_column("num_waiting"), log.held_column("num_swapped")):
        if time > last_arrival:  # in time order: the last step ending by the last arrival counts
            break
        backlog = waiting + swapped
    finished = s["num_finished"]
    return {
        "rate": cfg.rate,
        "error": None,
        "num_requests": s["num_requests"],
        "num_finished": finished,
        "num_rejected": s["num_rejected"],
        "reject_reasons": s["reject_reasons"],
        "num_measured": len(measured),
        "window_s": last_arrival - start,
        "window_arrivals": len(measured),
        "backlog_at_last_arrival": backlog,
        "request_throughput": s["request_throughput"],
        "output_token_throughput": s["output_token_throughput"],
        "mean_output_len": sum(r.output_len for r in requests if r.status == "finished") / finished if finished else None,
        "mean_kv_utilization": s["mean_kv_utilization"],
        "peak_kv_utilization": s["peak_kv_utilization"],
        "num_preemptions": s["num_preemptions"],
        "num_kv_blocks": s["num_kv_blocks"],
        "latencies": {
            "ttft": [r.ttft for r in measured],
            "tpot": [r.tpot for r in measured],
            "e2e": [r.e2e_latency for r in measured],
            "normalized_latency": [r.normalized_latency for r in measured],
        },
    }


_NUMBER = (int, float)
# the record `simulate` returns: field -> the types its value may have (None where a run can lack it)
RECORD_FIELDS = {
    "num_requests": (int,), "num_finished": (int,), "num_rejected": (int,), "reject_reasons": (dict,),
    "num_measured": (int,), "window_s": _NUMBER, "window_arrivals": (int,), "backlog_at_last_arrival": (int,),
    "request_throughput": (*_NUMBER, type(None)), "output_token_throughput": (*_NUMBER, type(None)),
    "mean_output_len": (*_NUMBER, type(None)), "mean_kv_utilization": (*_NUMBER, type(None)),
    "peak_kv_utilization": (*_NUMBER, type(None)), "num_preemptions": (int,), "num_kv_blocks": (int,),
    "latencies": (dict,),
}
LATENCY_KEYS = ("ttft", "tpot", "e2e", "normalized_latency")


def record_problem(record, rate: float) -> str | None:
    """Why a cached record is not a run record of `rate` as `simulate` writes it (another
    format, a hand edit, a different code's layout), or None: such an entry is simulated again."""
    if not isinstance(record, dict) or record.get("rate") != rate:
        return "not a record of this rate"
    if record.get("error") is not None:
        return None if isinstance(record["error"], str) else "error is not text"
    for name, kinds in RECORD_FIELDS.items():
        value = record.get(name, ...)
        if value is ... or isinstance(value, bool) or not isinstance(value, kinds):
            return f"field {name} missing or of another type"
    lat = record["latencies"]
    for key in LATENCY_KEYS:
        values = lat.get(key)
        if not isinstance(values, list) or len(values) != record["num_measured"] or \
                not all(v is None or (isinstance(v, _NUMBER) and not isinstance(v, bool) and math.isfinite(v)) for v in values):
            return f"latencies.{key} is not one number per measured request"
    return None


@dataclass
class Evaluation:
    """One rate of one configuration, judged against the SLOs."""

    rate: float
    sustainable: bool
    values: dict[str, float | None]  # each SLO's measured value
    keep_up: float | None  # 1 - backlog at the last arrival / window arrivals
    violations: list[str]  # SLO names, "keep-up", "rejections" or "error"
    error: str | None = None
    stats: dict = field(default_factory=dict)  # the run record without per-request latencies

    @property
    def preemptions_per_request(self) -> float | None:
        n = self.stats.get("num_finished")
        return self.stats["num_preemptions"] / n if n else None

    def to_dict(self) -> dict:
        return {"rate": self.rate, "sustainable": self.sustainable, "values": self.values, "keep_up": self.keep_up,
                "violations": self.violations, "error": self.error, "stats": self.stats}


def evaluate_record(record: dict, slos: list[SLO]) -> Evaluation:
    if record.get("error"):
        return Evaluation(record["rate"], False, {s.name: None for s in slos}, None, ["error"], record["error"])
    values = slo_values(record["latencies"], slos)
    keep_up = 1 - record["backlog_at_last_arrival"] / record["window_arrivals"] if record["window_arrivals"] else None
    violations = [s.name for s in slos if not s.holds(values[s.name])]
    if keep_up is None or keep_up < KEEP_UP_RATIO:
        violations.append("keep-up")
    if record["num_rejected"]:
        violations.append("rejections")
    stats = {k: v for k, v in record.items() if k != "latencies"}
    return Evaluation(record["rate"], not violations, values, keep_up, violations, None, stats)


class RateEvaluator:
    """evaluate(rate) for one configuration: cached simulation, then the SLO verdict."""

    def __init__(self, settings, point, trace: Trace, trace_digest: str, slos: list[SLO], cache: RunCache):
        self.settings, self.point, self.trace, self.trace_digest = settings, point, trace, trace_digest
        self.slos, self.cache = slos, cache
        self.num_simulated = 0
        self.num_cached = 0

    def __call__(self, rate: float) -> Evaluation:
        cfg = self.settings.replay_config(self.point, rate)
        key = run_key(cfg, self.trace_digest)
        record = self.cache.get(key)
        if record is not None and record_problem(record, cfg.rate) is not None:
            record = None  # unreadable as a run of this rate: simulate again (and overwrite it)
        if record is None:
            record = simulate(cfg, self.trace)
            self.cache.put(key, record)
            self.num_simulated += 1
        else:
            self.num_cached += 1
        return evaluate_record(record, self.slos)

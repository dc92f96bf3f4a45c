"""One probe: a configuration at one rate, simulated until its steady state is judged.

A rate is *sustainable* for a configuration when, on a run judged at steady state
(pagesim.plan.steady: warm-up left out, a window of at least MIN_WINDOW_SERVICES service
times, the queue's trend tested),
1. every SLO holds over the measured requests (those arriving after the warm-up),
2. the number of requests in the system does not grow (a replica offered more than it serves),
3. no request is rejected,
and every SLO holds by more than the run's noise (slo.clear_pass: a batch-means interval).
A run that fails an SLO or rejects a request decides at once: it started from an empty system,
the most favourable state, so a longer one does no better. A pass counts only on a run long
enough and with a flat queue; otherwise the probe is extended to more requests, up to the
settings' cap, where an undecided probe counts as unsustainable ("undecided").

`probe_steady(run, rate, ...)` is that loop over any driver (`run(n)` -> a run record);
`scout_probe` the same capped at a short length and judged optimistically, for locating the
knee cheaply (pagesim.plan.search); a RateEvaluator is the probe of one replica configuration,
cached, whose run(n) continues one replay instead of starting again (pagesim.plan.continued).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from pagesim.core.errors import CannotServe
from pagesim.metrics import RequestColumns
from pagesim.metrics.itl import sum_in_order
from pagesim.plan.cache import RunCache, checkpoint_key, run_key
from pagesim.plan.continued import Checkpoint, ContinuedReplay
from pagesim.plan.grid import RunSettings
from pagesim.plan.slo import SLO, FailureWatch, clear_pass, latency_lists, request_latencies, slo_values
from pagesim.plan import steady
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.sim.rate_search import StopRun, run_checked
from pagesim.workload.trace import Trace

MIN_TAIL_REQUESTS = 8  # a pNN SLO is judged on at least this many measured requests beyond it
MIN_MEASURED = RunSettings.min_measured_requests  # a pass counts only on at least this many measured requests
NEAR = 1.25  # a probe starts at the run length of passes within 25 % of its rate (RateEvaluator)
SCOUT_RUNS = 2  # a scout probe runs at most this many times its first run length (RateEvaluator.scout)
LIVE_REPLAYS = 3  # continued replays a RateEvaluator keeps, the latest used (a scout's, for the probe after it)


def simulate(cfg: ReplayConfig, trace: Trace, slos: list[SLO] | None = None) -> dict:
    """Run the simulator and keep what planning needs (JSON-ready). With `slos`, the run stops
    as soon as one of them is certain to fail over the measured requests (slo.FailureWatch): the
    record then says `stopped_by` that SLO, and its other numbers are the partial run's. A
    configuration that cannot serve at all (pagesim.core.errors.CannotServe: the model leaves no
    KV pool, its heads do not split over TP) gives a record with `error`; requests it can never
    fit are counted as rejections. Any other exception is a bug and propagates: it must not pass
    for "infeasible"."""
    try:
        sim = Replay(cfg, trace, keep_steps=False)
    except CannotServe as e:
        return {"rate": cfg.rate, "error": str(e)}
    stopped = None
    if slos:
        watch = FailureWatch(slos, sum(1 for r in sim.requests if r.arrival_time >= cfg.warmup_s))

        def check(_done: int) -> None:
            nonlocal stopped
            rec = sim.metrics.requests[-1]
            if rec.arrival_time >= cfg.warmup_s and rec.status == "finished":
                stopped = watch.add(request_latencies(rec))
                if stopped is not None:
                    raise StopRun
    try:
        summary, _ = run_checked(sim, check) if slos else (sim.run().summary, False)
    except CannotServe as e:
        return {"rate": cfg.rate, "error": str(e)}
    record = run_record(cfg.rate, cfg.warmup_s, sim.metrics.requests, summary)
    record["stopped_by"] = None if stopped is None else {"slo": stopped.name, "threshold": stopped.threshold}
    return record


def checkpoint_record(rate: float, checkpoint: Checkpoint) -> dict:
    """The record of a continued replay's checkpoint, as `simulate` makes one of a whole run."""
    record = run_record(rate, checkpoint.warmup_s, checkpoint.requests, checkpoint.summary)
    stop = checkpoint.stopped
    record["stopped_by"] = None if stop is None else {"slo": stop.name, "threshold": stop.threshold}
    return record


def measured_requests(requests: list, warmup_s: float) -> list:
    """The requests arriving from warmup_s on, by request id (the order every sum over them takes)."""
    return sorted((r for r in requests if r.arrival_time >= warmup_s), key=lambda r: r.request_id)


def trend_record(rate: float, warmup_s: float, requests) -> dict:
    """What the steady-state verdict (steadiness) reads of a finished run (request records, or
    RequestColumns): its measured requests (measured_requests's), the window, the mean service
    time and the trend of the number of requests in the system. (From columns: a long cluster
    run's records are never built.)"""
    import numpy as np

    columns = RequestColumns.of(requests)
    start = warmup_s
    # (a stretch of rows at a time, in two passes: a long cluster run has millions, which may be
    # merged from files as they are read; only the measured service times are kept whole)
    latest, num_measured, services, ids = [], 0, [], []
    for part in columns.column_chunks():
        arrival, finish, scheduled, request_id = part.columns_of(
            ("arrival_time", "finish_time", "first_scheduled_time", "request_id"))
        latest.append(arrival.max())
        measured = arrival >= warmup_s
        num_measured += int(measured.sum())
        services.append((finish - scheduled)[measured])
        ids.append(request_id[measured])
    last_arrival = float(np.max(np.array(latest)))
    # (summed by request id, as over measured_requests; NaN: a time that is None)
    services = np.concatenate(services)[np.argsort(np.concatenate(ids), kind="stable")]
    del ids
    services = services[~np.isnan(services)]
    num_services = len(services)
    service_sum = sum_in_order(services)
    del services
    trend = None
    if last_arrival > start:  # a rejected request leaves as it arrives
        def stays():  # (a stretch at a time: no array of every stay)
            for part in columns.column_chunks():
                enter, end = part.columns_of(("arrival_time", "finish_time"))
                yield enter, np.where(np.isnan(end), enter, end)

        trend = steady.in_system_trend_of(stays(), start, last_arrival).to_dict()
    return {"rate": rate, "num_measured": num_measured, "window_s": last_arrival - start,
            "mean_service_s": service_sum / num_services if num_services else None, "trend": trend}


def run_record(rate: float, warmup_s: float, requests: list, s: dict) -> dict:
    """The record of a finished run from its request records (pagesim.metrics.RequestRecord) and
    its summary: what any driver (one replica, a cluster) hands probe_steady."""
    measured = measured_requests(requests, warmup_s)
    steady_part = trend_record(rate, warmup_s, requests)
    finished = s["num_finished"]
    return {
        "rate": rate,
        "error": None,
        "num_requests": s["num_requests"],
        "num_finished": finished,
        "num_rejected": s["num_rejected"],
        "reject_reasons": s["reject_reasons"],
        "num_measured": steady_part["num_measured"],
        "window_s": steady_part["window_s"],
        "mean_service_s": steady_part["mean_service_s"],
        "trend": steady_part["trend"],
        "request_throughput": s["request_throughput"],
        "output_token_throughput": s["output_token_throughput"],
        "mean_output_len": sum(r.output_len for r in requests if r.status == "finished") / finished if finished else None,
        "mean_kv_utilization": s["mean_kv_utilization"],
        "peak_kv_utilization": s["peak_kv_utilization"],
        "num_preemptions": s["num_preemptions"],
        "num_kv_blocks": s["num_kv_blocks"],
        "latencies": latency_lists(measured),
    }


_NUMBER = (int, float)
# the record `simulate` returns: field -> the types its value may have (None where a run can lack it)
RECORD_FIELDS = {
    "num_requests": (int,), "num_finished": (int,), "num_rejected": (int,), "reject_reasons": (dict,),
    "num_measured": (int,), "window_s": _NUMBER, "mean_service_s": (*_NUMBER, type(None)), "trend": (dict, type(None)),
    "request_throughput": (*_NUMBER, type(None)), "output_token_throughput": (*_NUMBER, type(None)),
    "mean_output_len": (*_NUMBER, type(None)), "mean_kv_utilization": (*_NUMBER, type(None)),
    "peak_kv_utilization": (*_NUMBER, type(None)), "num_preemptions": (int,), "num_kv_blocks": (int,),
    "latencies": (dict,), "stopped_by": (dict, type(None)),
}
LATENCY_KEYS = ("ttft", "tpot", "e2e", "normalized_latency")
TREND_KEYS = ("slope", "low", "high", "mean", "window_s", "lag1")


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
    trend = record["trend"]
    if trend is not None and not all(isinstance(trend.get(k), _NUMBER) and not isinstance(trend.get(k), bool)
                                     and math.isfinite(trend[k]) for k in TREND_KEYS):
        return "trend is not a set of numbers"
    return None


@dataclass
class Evaluation:
    """One rate of one configuration, judged against the SLOs at steady state."""

    rate: float
    sustainable: bool
    values: dict[str, float | None]  # each SLO's measured value
    steady: str | None  # the queue's trend: grows, flat, undecided; "short": window too short; None: error
    violations: list[str]  # SLO names, "queue grows", "undecided", "rejections" or "error"
    error: str | None = None
    stats: dict = field(default_factory=dict)  # the run record without per-request latencies
    runs: list[int] = field(default_factory=list)  # request counts judged (a probe: its checkpoints), shortest first

    @property
    def num_requests(self) -> int | None:
        return self.runs[-1] if self.runs else None

    @property
    def preemptions_per_request(self) -> float | None:
        n = self.stats.get("num_finished")
        return self.stats["num_preemptions"] / n if n else None

    def to_dict(self) -> dict:
        return {"rate": self.rate, "sustainable": self.sustainable, "values": self.values, "steady": self.steady,
                "violations": self.violations, "error": self.error, "runs": self.runs, "stats": self.stats}


def meets_slos(ev: Evaluation) -> bool:
    """The SLOs hold, nothing is rejected and the queue was not seen growing; the steady state may
    be undecided (a scout probe's or a single run's optimistic verdict)."""
    return ev.error is None and all(v == "undecided" for v in ev.violations)


def measured_needed(slos: list[SLO], minimum: int = MIN_MEASURED) -> int:
    """minimum, or more where a percentile SLO needs MIN_TAIL_REQUESTS beyond its rank."""
    tails = [MIN_TAIL_REQUESTS / (1 - float(s.stat[1:]) / 100) for s in slos if s.is_latency and s.stat.startswith("p")]
    return max([minimum] + [math.ceil(t) for t in tails])


def steadiness(record: dict, tolerance: float, slos: list[SLO], min_measured: int = MIN_MEASURED) -> str:
    """grows, flat or undecided (pagesim.plan.steady), or "short": the window spans too few
    service times, or too few measured requests lie beyond a percentile SLO's rank."""
    if not steady.long_enough(record["window_s"], record["mean_service_s"]) or record["trend"] is None:
        return "short"
    if record["num_measured"] < measured_needed(slos, min_measured):
        return "short"
    return steady.Trend(**record["trend"]).verdict(tolerance * record["rate"])


def evaluate_record(record: dict, slos: list[SLO], tolerance: float, final: bool = True,
                    min_measured: int = MIN_MEASURED) -> Evaluation:
    """The verdict on one run record; final: no longer run will follow (a pass that is not
    steady then counts as "undecided")."""
    if record.get("error"):
        return Evaluation(record["rate"], False, {s.name: None for s in slos}, None, ["error"], record["error"])
    values = slo_values(record["latencies"], slos)
    state = steadiness(record, tolerance, slos, min_measured)
    violations = [s.name for s in slos if not s.holds(values[s.name])]
    stop = record.get("stopped_by")
    if stop is not None and stop["slo"] not in violations:  # (a partial run's value is a lower bound)
        violations.append(stop["slo"])
    if record["num_rejected"]:
        violations.append("rejections")
    if state == steady.GROWS:
        violations.append("queue grows")
    elif not violations and state == steady.FLAT and not clear_pass(record["latencies"], slos):
        state = steady.UNDECIDED  # a pass within its own noise: a longer run decides
    if state != steady.FLAT and not violations and final:
        violations.append("undecided")
    stats = {k: v for k, v in record.items() if k != "latencies"}
    return Evaluation(record["rate"], not violations, values, state, violations, None, stats,
                      [record["num_requests"]])


def probe_steady(run: Callable[[int], dict], first_requests: int, max_requests: int, slos: list[SLO],
                 tolerance: float, min_measured: int = MIN_MEASURED) -> Evaluation:
    """A rate's steady-state verdict (the module docstring): run(n) simulates n requests at that
    rate (any driver; the same seed for every n) and returns a record as run_record makes it.
    Decided by a failed SLO or a rejection (at once), a pass on a long, flat run, or a queue seen
    growing on two runs in a row (a single short run's growth may be the batch still filling);
    otherwise the next run is longer, up to max_requests. The Evaluation is the last run's, with
    every count run."""
    n, counts, grew = first_requests, [], False
    while True:
        record = run(n)
        counts.append(n)
        if record.get("error"):
            break
        ev = evaluate_record(record, slos, tolerance, final=False, min_measured=min_measured)
        failed = [v for v in ev.violations if v != "queue grows"]
        if failed or ev.steady == steady.FLAT or (ev.steady == steady.GROWS and grew) or n >= max_requests:
            break
        grew = ev.steady == steady.GROWS
        if ev.steady == "short" and record["mean_service_s"]:
            n = steady.requests_needed(n, record["window_s"], record["mean_service_s"])
        else:
            n = 2 * n
        # enough measured requests (the same share of the run is measured at every length)
        n = max(n, math.ceil(measured_needed(slos, min_measured) / max(record["num_measured"], 1) * record["num_requests"]))
        n = min(n, max_requests)
    ev = evaluate_record(record, slos, tolerance, min_measured=min_measured)
    ev.runs = counts
    return ev


def scout_probe(run: Callable[[int], dict], first_requests: int, slos: list[SLO], tolerance: float,
                min_measured: int = MIN_MEASURED) -> Evaluation:
    """A cheap probe for locating the knee (pagesim.plan.search.scouted_search): probe_steady
    capped at SCOUT_RUNS x its first run length, sustainable when nothing failed (meets_slos) on
    a window long enough to judge: an undecided trend (or too few requests for a tail) passes, so
    a scout errs towards the higher rate; a window still too short does not (an overloaded
    replica's windows stay short: they shrink with the rate while its service time does not)."""
    ev = probe_steady(run, first_requests, SCOUT_RUNS * first_requests, slos, tolerance, min_measured)
    ev.sustainable = meets_slos(ev) and steady.long_enough(ev.stats["window_s"], ev.stats["mean_service_s"])
    return ev


class RateEvaluator:
    """evaluate(rate) for one replica configuration: probe_steady over cached simulations."""

    def __init__(self, settings, point, trace: Trace, trace_digest: str, slos: list[SLO], cache: RunCache,
                 tolerance: float = 0.02):
        self.settings, self.point, self.trace, self.trace_digest = settings, point, trace, trace_digest
        self.slos, self.cache, self.tolerance = slos, cache, tolerance
        self.num_simulated = 0
        self.num_cached = 0
        self.lengths: dict[float, int] = {}  # rate -> request count its probe was decided on
        self.replays: dict[tuple, ContinuedReplay] = {}  # (rate, seed) -> its continued replay, oldest first

    def record(self, rate: float, num_requests: int | None = None, seed: int | None = None) -> dict:
        """One run's record, from the cache or simulated (and cached)."""
        cfg = self.settings.replay_config(self.point, rate, num_requests, seed)
        key = run_key(cfg, self.trace_digest)
        record = self.cache.get(key)
        if record is not None and (record_problem(record, cfg.rate) is not None or not self._stops_here(record)):
            record = None  # unreadable as a run of this rate, or stopped for other SLOs: simulate again
        if record is None:
            record = simulate(cfg, self.trace, self.slos)
            self.cache.put(key, record)
            self.num_simulated += 1
        else:
            self.num_cached += 1
        return record

    def checkpoint(self, rate: float, num_requests: int, seed: int | None = None) -> dict:
        """The record of the first num_requests of the continued replay at `rate` over the probe's
        cap of arrivals (pagesim.plan.continued), from the cache or simulated (and cached): what a
        probe judges."""
        cfg = self.settings.replay_config(self.point, rate, max(num_requests, self.settings.max_requests_per_probe),
                                          seed)
        key = checkpoint_key(cfg, self.trace_digest, num_requests)
        record = self.cache.get(key)
        if record is not None and (record_problem(record, cfg.rate) is not None or not self._stops_here(record)):
            record = None
        if record is not None:
            self.num_cached += 1
            return record
        where = (rate, cfg.seed)
        replay = self.replays.pop(where, None)
        try:
            if replay is None or replay.cfg != cfg:
                replay = ContinuedReplay(cfg, self.trace, self.slos, self.settings.warmup_fraction)
            record = checkpoint_record(rate, replay.checkpoint(num_requests))
        except CannotServe as e:
            record, replay = {"rate": rate, "error": str(e)}, None
        if replay is not None:
            self.replays[where] = replay
            while len(self.replays) > LIVE_REPLAYS:
                self.replays.pop(next(iter(self.replays)))
        self.cache.put(key, record)
        self.num_simulated += 1
        return record

    def single(self, rate: float, num_requests: int) -> Evaluation:
        """One run of `num_requests` at `rate`, judged as it is (no longer run follows)."""
        ev = evaluate_record(self.record(rate, num_requests), self.slos, self.tolerance,
                             min_measured=self.settings.min_measured_requests)
        ev.runs = [num_requests]
        return ev

    def scout(self, rate: float) -> Evaluation:
        """scout_probe at `rate` from the settings' first run length: the first runs a full probe
        at this rate makes, so the cache reuses them."""
        return scout_probe(lambda n: self.checkpoint(rate, n), self.settings.requests_at(rate), self.slos,
                           self.tolerance, self.settings.min_measured_requests)

    def _stops_here(self, record: dict) -> bool:
        """A run stopped early by an SLO serves only SLO sets holding that SLO as strict or stricter."""
        stop = record.get("stopped_by")
        return stop is None or any(s.name == stop["slo"] and (s.threshold >= stop["threshold"] if s.metric == "goodput"
                                                               else s.threshold <= stop["threshold"]) for s in self.slos)

    def __call__(self, rate: float, seed: int | None = None) -> Evaluation:
        """The probe at `rate`. It starts at the longest run a pass within NEAR of this rate (either
        side, any seed) was decided on, at least the settings' count: near the knee the lengths
        a pass needs are alike, and a probe that doubles its way up from the first length runs
        about twice its final length, so the shorter runs would be spent for nothing. (Only passes
        count: a failure stopped early says nothing of the length a verdict needs.)"""
        first = max([self.settings.requests_at(rate)] +
                    [n for r, n in self.lengths.items() if rate / NEAR <= r <= rate * NEAR])
        ev = probe_steady(lambda n: self.checkpoint(rate, n, seed), first, max(first, self.settings.max_requests_per_probe),
                          self.slos, self.tolerance, self.settings.min_measured_requests)
        if ev.sustainable:
            self.lengths[rate] = max(ev.num_requests, self.lengths.get(rate, 0))
        return ev
